package agent

import "bytes"

const (
	// maxFilterLine bounds the partial line the filter holds: a line longer
	// than this is no shell warning, so it is passed on as it arrives rather
	// than buffered without limit.
	maxFilterLine = 64 << 10
	// maxHeldTraceback bounds a traceback held while waiting to see whether
	// it ends in an import error; one that long is the user's and is passed
	// on.
	maxHeldTraceback = 256 << 10
)

// stderrFilter removes the noise an interactive login shell without a
// terminal writes to stderr (ORCHARD_COMPAT §4): bash's job-control warnings
// and Python import-error tracebacks from ~/.bashrc hooks. Orchard filters
// the collected stderr; the agent streams, so it filters complete lines as
// they arrive. Unlike Orchard, newlines are kept as they were.
type stderrFilter struct {
	partial  []byte // start of a line whose newline has not arrived
	passLine bool   // the current line was too long to hold and is passed on
	inTrace  bool   // holding a traceback
	held     []byte // the traceback lines held so far
}

var (
	tracebackStart = []byte("Traceback (most recent call last):")
	importErrors   = [][]byte{[]byte("ModuleNotFoundError:"), []byte("ImportError:")}
	shellNoise     = [][]byte{[]byte("cannot set terminal process group"), []byte("no job control in this shell")}
)

// write takes the next stderr bytes and returns what may be passed on now.
func (f *stderrFilter) write(p []byte) []byte {
	var out []byte
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if f.passLine {
				return append(out, p...)
			}
			f.partial = append(f.partial, p...)
			if len(f.partial) > maxFilterLine {
				out = append(out, f.releaseHeld()...)
				out = append(out, f.partial...)
				f.partial = f.partial[:0]
				f.passLine = true
			}
			return out
		}
		line := p[:i+1]
		p = p[i+1:]
		if f.passLine {
			out = append(out, line...)
			f.passLine = false
			continue
		}
		if len(f.partial) > 0 {
			line = append(f.partial, line...)
			f.partial = f.partial[:0]
		}
		out = f.line(out, line)
	}
	return out
}

// flush returns what is left at the end of the stream: a last line without
// a newline, and a traceback that never turned out to be an import error.
func (f *stderrFilter) flush() []byte {
	var out []byte
	if len(f.partial) > 0 {
		out = f.line(out, f.partial)
		f.partial = nil
	}
	return append(out, f.releaseHeld()...)
}

// line judges one complete line (with its newline, if any).
func (f *stderrFilter) line(out, line []byte) []byte {
	for _, n := range shellNoise {
		if bytes.Contains(line, n) {
			return out
		}
	}
	if f.inTrace {
		for _, ie := range importErrors {
			if bytes.HasPrefix(line, ie) {
				f.inTrace = false
				f.held = f.held[:0]
				return out
			}
		}
		// Frames and source lines of a traceback are indented; the first
		// unindented line is its final exception line.
		if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') && len(f.held)+len(line) <= maxHeldTraceback {
			f.held = append(f.held, line...)
			return out
		}
		out = append(out, f.releaseHeld()...)
	}
	if bytes.HasPrefix(line, tracebackStart) {
		f.inTrace = true
		f.held = append(f.held[:0], line...)
		return out
	}
	return append(out, line...)
}

func (f *stderrFilter) releaseHeld() []byte {
	f.inTrace = false
	h := f.held
	f.held = nil
	return h
}
