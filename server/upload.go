package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/jsonstream"
	"github.com/orchard/orchard/internal/upload"
)

// Uploads (POST /sandboxes/{id}/files, ORCHARD_COMPAT §3.14) are the one
// request whose body may be hundreds of megabytes: a file, base64 in a JSON
// string. The body is never held. It is read as it arrives: the path and
// mode are kept (a few bytes), the content is decoded and passed on to the
// sandbox's agent while it streams. The answers are those of reading the
// whole body first, as FastAPI does: an over-limit body is 413 and broken
// JSON 422 whatever came before, then missing or ill-typed fields (422),
// then an unknown or unready sandbox, then what the agent says.

const (
	// DefaultMaxConcurrentUploads is Config.MaxConcurrentUploads' default.
	// Each upload costs little memory; the bound is on the work (decoding,
	// the agent's disk) and the spool space content-first bodies take.
	DefaultMaxConcurrentUploads = 8
	// smallUpload is the Content-Length up to which an upload does not
	// count against MaxConcurrentUploads: small files never queue behind
	// large ones.
	smallUpload = 1 << 20
	// uploadWait is how long a large upload waits for its turn before it is
	// refused with 503 and Retry-After. A turn comes when an upload ahead
	// ends, which for hundreds of megabytes on a busy host takes minutes
	// (eight 150 MiB uploads took over 60 s on two loaded cores); a
	// refusal makes the client send its whole body again. Five minutes
	// leaves most of the SDK's 1200 s request timeout for the transfer.
	uploadWait = 5 * time.Minute
	// maxUploadField bounds an upload's path and mode, the parts of the
	// body that are kept: a path is at most PATH_MAX (4096) bytes.
	maxUploadField = 64 << 10
)

// errUploadAbandoned ends the agent's side of an upload that the client's
// body turned out not to allow (broken JSON, invalid base64, over the
// limit): the agent sees its request break and writes nothing.
var errUploadAbandoned = errors.New("upload abandoned")

// uploadGate bounds how many large uploads are received at once.
type uploadGate struct {
	slots chan struct{} // one token per upload in progress; nil = no bound
	wait  time.Duration
}

func newUploadGate(n int, wait time.Duration) *uploadGate {
	g := &uploadGate{wait: wait}
	if n > 0 {
		g.slots = make(chan struct{}, n)
	}
	return g
}

// acquire waits for a turn for an upload of length bytes (-1: unknown) and
// returns the function that ends it.
func (g *uploadGate) acquire(ctx context.Context, length int64) (func(), error) {
	if g.slots == nil || (length >= 0 && length <= smallUpload) {
		return func() {}, nil
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return func() { <-g.slots }, nil
	case <-t.C:
		return nil, faults.Newf(faults.CodeUploadsBusy, faults.Capacity, faults.Platform,
			"The server is receiving %d large uploads already; retry later", cap(g.slots))
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func errBodyTooLarge(limit int64) error {
	return faults.Newf(faults.CodeTooLarge, faults.TooLarge, faults.Client, "request body exceeds %d bytes", limit)
}

// upload streams a file into a sandbox (see the comment at the top).
func (s *Server) upload(c *gin.Context) error {
	ctx := c.Request.Context()
	limit := s.cfg.MaxBodyBytes
	if c.Request.ContentLength > limit {
		return errBodyTooLarge(limit)
	}
	release, err := s.uploads.acquire(ctx, c.Request.ContentLength)
	if err != nil {
		return err
	}
	defer release()

	u := &streamedUpload{s: s, ctx: ctx, id: c.Param("id")}
	// Asked before the body is read, so that the content of an upload
	// that cannot happen is only read, never sent or spooled.
	u.unready = s.mgr.CheckUpload(ctx, u.id)
	defer u.close()
	body := http.MaxBytesReader(c.Writer, c.Request.Body, limit)
	jr := jsonstream.Reader{Stream: "content", Keep: []string{"path", "mode"}, MaxValue: maxUploadField, OnStream: u.content}
	doc, err := jr.Read(body)
	if err != nil {
		u.abandon()
		var se *jsonstream.SyntaxError
		if errors.As(err, &se) {
			// The whole body counts: past the limit is 413 whatever
			// is wrong before it.
			_, err = io.Copy(io.Discard, body)
		}
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return errBodyTooLarge(limit)
		case se != nil:
			e := faults.Validation(faults.FieldError{Type: "json_invalid", Loc: []any{"body", 0}, Msg: "JSON decode error", Input: map[string]any{}})
			e.Code = faults.CodeInvalidJSON
			e.Err = se
			return e
		}
		return faults.Wrap(err, faults.CodeInvalidJSON, faults.InvalidRequest, faults.Client, "could not read request body")
	}

	req, err := uploadRequest(doc)
	if err != nil {
		u.abandon()
		return err
	}
	if u.unready != nil {
		return u.unready
	}
	if u.failed != nil {
		u.abandon()
		if res := u.answer(); res.err != nil && !errors.Is(res.err, errUploadAbandoned) {
			// The agent refused the upload (a directory, a read-only
			// path) before the content went bad: it checks the path
			// first, as it always has.
			return res.err
		}
		return u.failed
	}
	u.mode = req.Mode
	if u.spool != nil {
		if _, err := u.spool.Seek(0, io.SeekStart); err != nil {
			return faults.Wrap(fmt.Errorf("upload %s: rewind spool: %w", *req.Path, err), faults.CodeInternal, faults.Internal, faults.Platform, "internal error")
		}
		res, err := s.mgr.UploadFrom(ctx, u.id, *req.Path, u.spool, u.modeOf)
		if err != nil {
			return err
		}
		c.JSON(http.StatusOK, res)
		return nil
	}
	if u.pw == nil {
		return faults.New(faults.CodeInternal, faults.Internal, faults.Platform, "upload content went nowhere")
	}
	// The whole body is read and valid: the content's end lets the agent
	// commit the file.
	u.pw.Close()
	res := u.answer()
	if res.err != nil {
		return res.err
	}
	c.JSON(http.StatusOK, res.res)
	return nil
}

// uploadRequest checks an upload body's members as decoding it into
// api.UploadRequest would (decodeJSON), with the same 422s, from what was
// kept of them: path and mode as sent, and the content's kind.
func uploadRequest(doc jsonstream.Result) (api.UploadRequest, error) {
	var req api.UploadRequest
	switch {
	case doc.Kind == 0:
		// Nothing (a missing body) or only whitespace (not JSON).
		return req, decodeJSON(bytes.Repeat([]byte(" "), int(min(doc.Size, 1))), &req)
	case doc.Kind == jsonstream.Null:
		return req, faults.Validation(missingField("body", "path", nil))
	case doc.Kind != jsonstream.Object:
		return req, decodeJSON(placeholder(doc.Kind), &req)
	case doc.Duplicate != "":
		// Which one would count is moot: the first content already
		// streamed. Refused rather than guessed.
		return req, faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", doc.Duplicate},
			Msg: "Value error, " + doc.Duplicate + " is given more than once", Input: nil})
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range doc.Members {
		if i > 0 {
			b.WriteByte(',')
		}
		name := strings.ToLower(m.Name)
		fmt.Fprintf(&b, "%q:", name)
		switch {
		case m.Value != nil:
			b.Write(m.Value)
		case m.TooLong && m.Kind == jsonstream.String:
			return req, faults.Validation(faults.FieldError{Type: "string_too_long", Loc: []any{"body", name},
				Msg: fmt.Sprintf("String should have at most %d characters", maxUploadField), Input: nil})
		default:
			// The streamed content, or a value too long to keep whose
			// kind is all that matters.
			b.Write(placeholder(m.Kind))
		}
	}
	b.WriteByte('}')
	if err := decodeJSON(b.Bytes(), &req); err != nil {
		return req, err
	}
	switch {
	case req.Path == nil:
		return req, faults.Validation(missingField("body", "path", nil))
	case req.Content == nil:
		return req, faults.Validation(missingField("body", "content", nil))
	}
	return req, nil
}

// placeholder is a small JSON value of kind k, for what was not kept.
func placeholder(k jsonstream.Kind) []byte {
	switch k {
	case jsonstream.Object:
		return []byte("{}")
	case jsonstream.Array:
		return []byte("[]")
	case jsonstream.String:
		return []byte(`""`)
	case jsonstream.Number:
		return []byte("0")
	case jsonstream.Bool:
		return []byte("true")
	}
	return []byte("null")
}

// uploadResult is the agent's answer to a streamed upload.
type uploadResult struct {
	res api.UploadResult
	err error
}

// streamedUpload is one upload while its body is read.
type streamedUpload struct {
	s   *Server
	ctx context.Context
	id  string
	// unready is why the sandbox cannot take the upload (unknown, not
	// ready), found before the body is read.
	unready error

	pw     *io.PipeWriter    // the content's way to the agent, once its path is known
	done   chan uploadResult // the agent's answer to pw's upload
	result *uploadResult     // that answer, once received
	spool  *os.File          // content that came before its path
	// failed: the content is not base64, or spooling it failed.
	failed error
	// mode is the upload's mode, set before the content's end reaches the
	// agent's client, which asks for it then (modeOf).
	mode string
}

func (u *streamedUpload) modeOf() string { return u.mode }

// content receives the content string as it is read (jsonstream.OnStream).
// Failures are kept for the end, where the whole body decides the answer;
// the reader of the body reads what is left of the string.
func (u *streamedUpload) content(before []jsonstream.Member, content io.Reader) error {
	if u.unready != nil {
		return nil
	}
	path, known := jsonstream.StringMember(before, "path")
	if !known {
		// The path comes later (or never): the decoded content waits on
		// disk, unlinked at once so that nothing outlives the request.
		f, err := os.CreateTemp("", "orchard-upload-*")
		if err != nil {
			u.failed = faults.Wrap(fmt.Errorf("upload: spool: %w", err), faults.CodeInternal, faults.Internal, faults.Platform, "internal error")
			return nil
		}
		_ = os.Remove(f.Name())
		u.spool = f
		_, err = upload.Decode(f, content)
		var we upload.WriteError
		switch {
		case errors.As(err, &we):
			u.failed = faults.Wrap(fmt.Errorf("upload: spool: %w", err), faults.CodeInternal, faults.Internal, faults.Platform, "internal error")
		case faults.Is(err, faults.CodeInvalidBase64):
			u.failed = invalidBase64(err)
		}
		return nil
	}
	pr, pw := io.Pipe()
	u.pw, u.done = pw, make(chan uploadResult, 1)
	go func() {
		res, err := u.s.mgr.UploadFrom(u.ctx, u.id, path, pr, u.modeOf)
		// The agent has answered: what is left of the content has
		// nowhere to go.
		pr.CloseWithError(errUploadAbandoned)
		u.done <- uploadResult{res, err}
	}()
	_, err := upload.Decode(pw, content)
	if faults.Is(err, faults.CodeInvalidBase64) {
		u.failed = invalidBase64(err)
	}
	// A failed write means the agent answered early (it refused the
	// path, its sandbox went away): its answer is the upload's.
	return nil
}

// invalidBase64 is the content's failure; the route answers it 500, as
// Orchard Env does (fileStatus), the error object saying what it is.
func invalidBase64(err error) error {
	return faults.Of(err)
}

// abandon ends the agent's side of the upload, if it started, without
// letting the agent write the file.
func (u *streamedUpload) abandon() {
	if u.pw != nil {
		u.pw.CloseWithError(errUploadAbandoned)
	}
}

// answer waits for the agent's answer to the streamed content.
func (u *streamedUpload) answer() uploadResult {
	if u.result == nil {
		if u.done == nil {
			return uploadResult{}
		}
		r := <-u.done
		u.result = &r
	}
	return *u.result
}

// close ends whatever the upload still holds: the agent's request (its
// goroutine is waited for) and the spool file.
func (u *streamedUpload) close() {
	u.abandon()
	u.answer()
	if u.spool != nil {
		u.spool.Close()
	}
}
