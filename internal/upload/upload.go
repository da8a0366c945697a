// Package upload decodes an upload's content — standard base64 as the
// REST API and the agent both receive it — into its destination, telling a
// failure of the content from a failure of the destination. The server
// (spooling or relaying a streamed upload) and the agent (writing the file)
// decode with it.
package upload

import (
	"encoding/base64"
	"errors"
	"io"

	"github.com/orchard/orchard/faults"
)

// WriteError is a failure of the destination Decode writes to, told apart
// from a failure of the content.
type WriteError struct{ Err error }

func (e WriteError) Error() string { return e.Err.Error() }
func (e WriteError) Unwrap() error { return e.Err }

// inputError is a failure to read the base64 text itself (the JSON around
// it is broken, the body was cut short): whoever reads the JSON reports it.
type inputError struct{ err error }

func (e inputError) Error() string { return e.err.Error() }
func (e inputError) Unwrap() error { return e.err }

type taggedReader struct{ r io.Reader }

func (t taggedReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF {
		err = inputError{err}
	}
	return n, err
}

type taggedWriter struct{ w io.Writer }

func (t taggedWriter) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	if err != nil {
		err = WriteError{err}
	}
	return n, err
}

// Writer returns w with its failures wrapped as WriteError, for content
// decoded already (held while the path was not yet known).
func Writer(w io.Writer) io.Writer { return taggedWriter{w} }

// Decode decodes content, standard base64 as read from src (line breaks
// ignored), into dst, and returns the number of bytes written. Its error
// says what failed: the content is not base64 (a classified
// file.invalid_base64), dst (a WriteError), or reading src itself (that
// reader's error, as it is).
func Decode(dst io.Writer, src io.Reader) (int64, error) {
	n, err := io.Copy(taggedWriter{dst}, base64.NewDecoder(base64.StdEncoding, taggedReader{src}))
	var in inputError
	var we WriteError
	switch {
	case err == nil, errors.As(err, &we):
		return n, err
	case errors.As(err, &in):
		return n, in.err
	}
	return n, faults.Wrap(err, faults.CodeInvalidBase64, faults.InvalidRequest, faults.Client, "content is not valid base64")
}
