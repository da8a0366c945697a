package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/orchard/orchard/faults"
)

// The proxy's HTTP/1.1 message handling. It parses a message's head only
// as far as forwarding needs (the request target, the headers that frame
// the body or manage the connection) and passes every other header line
// through byte for byte; bodies are copied, chunked ones with their
// framing checked but not re-encoded. What it refuses is what would let a
// request mean one thing to the proxy and another to the site (both
// Content-Length and Transfer-Encoding, conflicting lengths, folded or
// malformed header lines, bare CR).

// maxHeadBytes bounds a request's or response's head (request line or
// status line and headers): the limit net/http's server applied here
// before, far above what any site or browser sends (cookies included).
const maxHeadBytes = 1 << 20

// maxChunkLine bounds a chunk-size line with its extensions.
const maxChunkLine = 4 << 10

// max1xx bounds the informational responses forwarded before the final one.
const max1xx = 16

var (
	errHeadTooLarge = errors.New("message head too large")
	errBadChunk     = errors.New("malformed chunked encoding")
)

// headError is a request the proxy refuses before forwarding it.
func headError(status int, msg string) error {
	return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "egress proxy: "+msg).WithStatus(status)
}

// readHead reads one message head, up to and including its empty line,
// into buf. Empty lines before a request line are skipped (RFC 9112
// section 2.2). io.EOF means the connection ended between messages.
func readHead(br *bufio.Reader, buf []byte) ([]byte, error) {
	buf = buf[:0]
	lineStart := 0
	for {
		frag, err := br.ReadSlice('\n')
		if len(buf)+len(frag) > maxHeadBytes {
			return nil, errHeadTooLarge
		}
		buf = append(buf, frag...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if err == io.EOF && len(buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		line := buf[lineStart:]
		if len(line) == 1 || (len(line) == 2 && line[0] == '\r') {
			if lineStart == 0 {
				buf = buf[:0] // an empty line before the start line
				continue
			}
			return buf, nil
		}
		lineStart = len(buf)
	}
}

// field is one header line, its name and value trimmed.
type field struct{ name, value string }

// head is a parsed message head. Strings point into one copy of the raw
// head.
type head struct {
	// Request: method, target. Response: status, reason (the status line
	// after the code).
	method, target string
	status         int
	reason         string
	minor          int // HTTP/1.minor
	fields         []field

	contentLength int64 // -1: none
	chunked       bool  // the last transfer coding is chunked
	otherTE       bool  // a transfer coding other than a final chunked
	hasTE         bool
	close         bool // Connection: close (or Proxy-Connection: close)
	keepAlive     bool // Connection: keep-alive
	upgrade       bool // Connection lists upgrade and an Upgrade header is present
	expect100     bool
	contentType   string
	te            string // TE (request): forwarded only as "trailers"
	connTokens    []string
}

// parseLines splits raw into its start line and header fields and reads
// the fields that matter to forwarding.
func parseLines(raw string, h *head) (string, error) {
	h.fields = h.fields[:0]
	h.connTokens = h.connTokens[:0]
	h.contentLength = -1
	var start string
	first := true
	var upgradeHdr bool
	for len(raw) > 0 {
		i := strings.IndexByte(raw, '\n')
		line := raw[:i]
		raw = raw[i+1:]
		line = strings.TrimSuffix(line, "\r")
		if strings.IndexByte(line, '\r') >= 0 {
			return "", errors.New("bare CR in head")
		}
		if first {
			start, first = line, false
			continue
		}
		if line == "" {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return "", errors.New("folded header line")
		}
		colon := strings.IndexByte(line, ':')
		if colon <= 0 || !validToken(line[:colon]) {
			return "", fmt.Errorf("malformed header line %.40q", line)
		}
		name, value := line[:colon], strings.Trim(line[colon+1:], " \t")
		if !validValue(value) {
			return "", fmt.Errorf("invalid byte in header %s", name)
		}
		h.fields = append(h.fields, field{name, value})
		switch {
		case strings.EqualFold(name, "Content-Length"):
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 || value[0] == '+' {
				return "", errors.New("invalid Content-Length")
			}
			if h.contentLength >= 0 && h.contentLength != n {
				return "", errors.New("conflicting Content-Length")
			}
			h.contentLength = n
		case strings.EqualFold(name, "Transfer-Encoding"):
			h.hasTE = true
			for tok := range strings.SplitSeq(value, ",") {
				tok = strings.Trim(tok, " \t")
				if tok == "" {
					continue
				}
				if h.chunked {
					h.otherTE = true // chunked must be last, and once
				}
				if strings.EqualFold(tok, "chunked") {
					h.chunked = true
				} else {
					h.otherTE = true
				}
			}
		case strings.EqualFold(name, "Connection"), strings.EqualFold(name, "Proxy-Connection"):
			for tok := range strings.SplitSeq(value, ",") {
				tok = strings.Trim(tok, " \t")
				switch {
				case strings.EqualFold(tok, "close"):
					h.close = true
				case strings.EqualFold(tok, "keep-alive"):
					h.keepAlive = true
				case strings.EqualFold(tok, "upgrade") && strings.EqualFold(name, "Connection"):
					h.upgrade = true
				case tok != "":
					h.connTokens = append(h.connTokens, tok)
				}
			}
		case strings.EqualFold(name, "Upgrade"):
			upgradeHdr = true
		case strings.EqualFold(name, "Expect"):
			h.expect100 = strings.EqualFold(value, "100-continue")
		case strings.EqualFold(name, "Content-Type"):
			if h.contentType == "" {
				h.contentType = value
			}
		case strings.EqualFold(name, "TE"):
			h.te = value
		}
	}
	h.upgrade = h.upgrade && upgradeHdr
	if h.chunked && h.otherTE {
		h.chunked = false
	}
	return start, nil
}

func parseVersion(v string) (minor int, ok bool) {
	if len(v) != 8 || !strings.HasPrefix(v, "HTTP/1.") || v[7] < '0' || v[7] > '9' {
		return 0, false
	}
	return int(v[7] - '0'), true
}

// parseRequest parses a request head.
func parseRequest(raw string, h *head) error {
	*h = head{fields: h.fields[:0], connTokens: h.connTokens[:0]}
	start, err := parseLines(raw, h)
	if err != nil {
		return headError(http.StatusBadRequest, err.Error())
	}
	method, rest, ok1 := strings.Cut(start, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !validToken(method) || target == "" || strings.ContainsAny(target, " \t") {
		return headError(http.StatusBadRequest, fmt.Sprintf("malformed request line %.60q", start))
	}
	minor, ok := parseVersion(proto)
	if !ok {
		if strings.HasPrefix(proto, "HTTP/") {
			return headError(http.StatusHTTPVersionNotSupported, "only HTTP/1.x is supported: "+proto)
		}
		return headError(http.StatusBadRequest, fmt.Sprintf("malformed request line %.60q", start))
	}
	for i := 0; i < len(target); i++ {
		if target[i] <= ' ' || target[i] == 0x7f {
			return headError(http.StatusBadRequest, "invalid byte in request target")
		}
	}
	h.method, h.target, h.minor = method, target, minor
	switch {
	case h.hasTE && h.contentLength >= 0:
		// Either could be what the site believes; a request smuggled past
		// the proxy in the difference is exactly what framing rules exist
		// to stop (RFC 9112 section 6.1).
		return headError(http.StatusBadRequest, "both Content-Length and Transfer-Encoding")
	case h.hasTE && !h.chunked:
		return headError(http.StatusNotImplemented, "unsupported Transfer-Encoding (only chunked)")
	case h.hasTE && minor == 0:
		return headError(http.StatusBadRequest, "Transfer-Encoding in an HTTP/1.0 request")
	}
	return nil
}

// persistent reports whether the client keeps its connection after this
// request. HTTP/1.0 connections end after one exchange (keep-alive in 1.0
// is an extension the proxy does not need).
func (h *head) persistent() bool { return h.minor >= 1 && !h.close }

// upgrading reports whether the request asks to switch protocols, which
// the proxy forwards for a request without a body (a WebSocket handshake):
// after a 101 answer the connection's bytes are copied both ways.
func (h *head) upgrading() bool { return h.upgrade && h.minor >= 1 && !h.hasBody() }

// hasBody reports whether the request carries a body.
func (h *head) hasBody() bool { return h.chunked || h.contentLength > 0 }

// parseResponse parses a response head.
func parseResponse(raw string, h *head) error {
	*h = head{fields: h.fields[:0], connTokens: h.connTokens[:0]}
	start, err := parseLines(raw, h)
	if err != nil {
		return err
	}
	proto, rest, _ := strings.Cut(start, " ")
	minor, ok := parseVersion(proto)
	if !ok || len(rest) < 3 {
		return fmt.Errorf("malformed status line %.60q", start)
	}
	code, reason, _ := strings.Cut(rest, " ")
	st, err := strconv.Atoi(code)
	if err != nil || len(code) != 3 || st < 100 {
		return fmt.Errorf("malformed status line %.60q", start)
	}
	h.status, h.reason, h.minor = st, reason, minor
	return nil
}

// bodyless reports whether a response to method with this status has no
// body whatever its headers say (RFC 9112 section 6.3).
func (h *head) bodyless(method string) bool {
	return method == http.MethodHead || h.status < 200 || h.status == http.StatusNoContent || h.status == http.StatusNotModified
}

// reusable reports whether the site keeps the connection after this
// response.
func (h *head) reusable() bool {
	if h.close {
		return false
	}
	return h.minor >= 1 || h.keepAlive
}

// hopByHop reports whether a header belongs to one connection only and is
// not forwarded (RFC 9110 section 7.6.1). Transfer-Encoding is handled by
// the caller: chunked bodies pass through encoded.
func (h *head) hopByHop(name string) bool {
	switch {
	case strings.EqualFold(name, "Connection"), strings.EqualFold(name, "Proxy-Connection"),
		strings.EqualFold(name, "Keep-Alive"), strings.EqualFold(name, "Proxy-Authorization"),
		strings.EqualFold(name, "Proxy-Authenticate"), strings.EqualFold(name, "TE"),
		strings.EqualFold(name, "Upgrade"):
		return true
	}
	for _, t := range h.connTokens {
		if strings.EqualFold(name, t) {
			return true
		}
	}
	return false
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTokenByte(s[i]) {
			return false
		}
	}
	return true
}

func isTokenByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// validValue refuses control bytes other than tab in a header value; a
// stray CR or NUL forwarded verbatim could split the header for the site.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// copyChunked copies a chunked body from src to dst: encoded as it is
// when decode is false, only the data when it is true (for an HTTP/1.0
// client). It returns the data bytes. dst is flushed whenever src has
// nothing buffered, so a streamed response is never held back while the
// proxy waits for its next chunk.
func copyChunked(dst *bufio.Writer, src *bufio.Reader, decode bool) (int64, error) {
	var n int64
	var line []byte
	for {
		var err error
		if line, err = readChunkLine(dst, src, line); err != nil {
			return n, err
		}
		size, err := chunkSize(line)
		if err != nil {
			return n, err
		}
		if !decode {
			dst.Write(line)
		}
		if size == 0 {
			break
		}
		if err := copyN(dst, src, size); err != nil {
			return n, err
		}
		n += size
		crlf, err := readChunkLine(dst, src, line)
		if err != nil {
			return n, err
		}
		if len(crlf) != 2 || crlf[0] != '\r' {
			return n, errBadChunk
		}
		if !decode {
			dst.Write(crlf)
		}
	}
	// The trailer section, up to its empty line.
	var total int
	for {
		var err error
		if line, err = readChunkLine(dst, src, line); err != nil {
			return n, err
		}
		if total += len(line); total > maxHeadBytes {
			return n, errHeadTooLarge
		}
		if len(line) == 2 && line[0] == '\r' || len(line) == 1 {
			if !decode {
				dst.WriteString("\r\n")
			}
			return n, dst.Flush()
		}
		// A trailer field is held to a header field's rules (parseLines):
		// passed on verbatim, a bare CR or a folded line could end the
		// section early for the other side and start a message there.
		if !validTrailer(line) {
			return n, errBadChunk
		}
		if !decode {
			dst.Write(line)
		}
	}
}

// validTrailer reports whether a trailer line (with its CRLF) is a
// well-formed field line.
func validTrailer(line []byte) bool {
	l, ok := strings.CutSuffix(string(line), "\r\n")
	if !ok || strings.IndexByte(l, '\r') >= 0 || l == "" || l[0] == ' ' || l[0] == '\t' {
		return false
	}
	colon := strings.IndexByte(l, ':')
	return colon > 0 && validToken(l[:colon]) && validValue(strings.Trim(l[colon+1:], " \t"))
}

// readChunkLine reads one CRLF-terminated line into buf, flushing dst if
// it has to wait for src.
func readChunkLine(dst *bufio.Writer, src *bufio.Reader, buf []byte) ([]byte, error) {
	buf = buf[:0]
	for {
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return nil, err
			}
		}
		frag, err := src.ReadSlice('\n')
		if len(buf)+len(frag) > maxChunkLine {
			return nil, errBadChunk
		}
		buf = append(buf, frag...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		return buf, nil
	}
}

// chunkSize parses a chunk-size line: hex digits, optional extensions.
func chunkSize(line []byte) (int64, error) {
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return 0, errBadChunk
	}
	line = line[:len(line)-2]
	var size int64
	i := 0
	for ; i < len(line); i++ {
		c := line[i]
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			goto ext
		}
		if size > 1<<58 {
			return 0, errBadChunk
		}
		size = size<<4 | int64(d)
	}
ext:
	if i == 0 {
		return 0, errBadChunk
	}
	rest := line[i:]
	for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
		rest = rest[1:]
	}
	if len(rest) > 0 && rest[0] != ';' {
		return 0, errBadChunk
	}
	for _, c := range rest {
		if c == '\r' || c == '\n' || c == 0 {
			return 0, errBadChunk
		}
	}
	return size, nil
}

// copyN copies exactly n bytes from src to dst, flushing dst before src
// has to wait for more.
func copyN(dst *bufio.Writer, src *bufio.Reader, n int64) error {
	for n > 0 {
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return err
			}
			if _, err := src.Peek(1); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
		b, _ := src.Peek(int(min(n, int64(src.Buffered()))))
		if _, err := dst.Write(b); err != nil {
			return err
		}
		src.Discard(len(b))
		n -= int64(len(b))
	}
	return nil
}
