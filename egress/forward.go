package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/faults"
)

// The plain-HTTP forwarder. net/http's server and transport, which did
// this before, cost each request two parses and re-serialisations of the
// head, a goroutine hand-off to the transport's write loop and another
// from its read loop, and the server's background read; this forwarder
// reads a request head, writes it on to the site with only the target
// and the hop-by-hop headers changed, reads the response head, and copies
// the body, all on the client connection's own goroutine. A client's
// requests are answered in order, one at a time (pipelined requests wait
// in the client connection's buffer).

// Buffer sizes: clientBufSize holds any ordinary request head;
// upstreamBufSize lets one read take a response head with a page-sized
// body behind it, which then leaves in the same write as the head.
const (
	clientBufSize   = 8 << 10
	upstreamBufSize = 64 << 10
	writeBufSize    = 32 << 10
)

var (
	clientReaders   = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, clientBufSize) }}
	upstreamReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, upstreamBufSize) }}
	writers         = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBufSize) }}
)

// clientConn is one connection from a client of the proxy.
type clientConn struct {
	p    *Proxy
	ctx  context.Context
	conn net.Conn
	br   *bufio.Reader
	cr   errReader     // the connection, remembering a failed read
	cw   errWriter     // the connection, remembering a failed write
	bw   *bufio.Writer // over cw
	up   *upstream     // the site connection of the last request, kept for the next
	req  head
	resp head
	hbuf []byte // the raw head being read
	// linger: the connection may hold unread input when it closes (a
	// refused request's rest, an unread body).
	linger bool
	// stopping: the proxy is ending a body's copy itself, whose failure
	// then says nothing about the client.
	stopping atomic.Bool
	out      []byte // the request head being forwarded
	rout     []byte // the response head being forwarded
}

// errWriter remembers whether writing to the client failed, which tells
// a client that went away from a site that broke off.
type errWriter struct {
	w   io.Writer
	err error
}

func (w *errWriter) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

// errReader remembers whether reading from the client failed.
type errReader struct {
	r   io.Reader
	err error
}

func (r *errReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if err != nil && r.err == nil {
		r.err = err
	}
	return n, err
}

func (p *Proxy) serveConn(ctx context.Context, conn net.Conn) {
	c := &clientConn{p: p, ctx: ctx, conn: conn, br: clientReaders.Get().(*bufio.Reader)}
	c.cr.r = conn
	c.br.Reset(&c.cr)
	c.cw.w = conn
	c.bw = writers.Get().(*bufio.Writer)
	c.bw.Reset(&c.cw)
	defer func() {
		if c.up != nil {
			p.idle.put(c.up)
		}
		p.conns.remove(conn)
		if c.linger {
			lingerClose(conn)
		}
		conn.Close()
		c.br.Reset(nil)
		clientReaders.Put(c.br)
		c.bw.Reset(nil)
		writers.Put(c.bw)
	}()
	for {
		_ = conn.SetReadDeadline(time.Now().Add(clientIdleTimeout))
		raw, err := readHead(c.br, c.hbuf)
		if err != nil {
			switch {
			case errors.Is(err, errHeadTooLarge):
				c.refuse(headError(http.StatusRequestHeaderFieldsTooLarge,
					fmt.Sprintf("request head exceeds %d bytes", maxHeadBytes)))
			case errors.Is(err, io.ErrUnexpectedEOF):
				c.refuse(headError(http.StatusBadRequest, "request head cut short"))
			}
			return
		}
		_ = conn.SetReadDeadline(time.Time{})
		c.hbuf = raw
		if err := parseRequest(string(raw), &c.req); err != nil {
			c.refuse(err)
			return
		}
		var keep bool
		switch t := c.req.target; {
		case c.req.method == http.MethodConnect:
			p.connect(c)
			return
		case t[0] != '/' && t != "*":
			keep = c.forward()
		default:
			keep = c.local()
		}
		if !keep {
			return
		}
	}
}

// refuse answers a request the proxy cannot read or will not forward.
func (c *clientConn) refuse(err error) {
	c.linger = true
	var w localResponse
	writeFault(&w, faults.Of(err), nil)
	w.send(c.bw, false)
}

// fail logs err for e and answers it; the connection ends.
func (c *clientConn) fail(e *Entry, start time.Time, err error) bool {
	c.linger = c.req.hasBody()
	var w localResponse
	c.p.fail(&w, e, start, err)
	w.send(c.bw, false)
	return false
}

func (c *clientConn) injectStatus(e *Entry, start time.Time, status int) bool {
	c.linger = c.req.hasBody()
	var w localResponse
	c.p.injectStatus(&w, e, start, status)
	return w.send(c.bw, c.req.persistent() && !c.req.hasBody())
}

// Bounds of reading what a client still sends after its request was
// refused: closing a socket with unread input resets the connection, and
// the client may lose the answer explaining why.
const (
	lingerTimeout = 500 * time.Millisecond
	lingerBytes   = 4 << 20
)

// lingerClose ends the connection's sending side and reads, for a while,
// what the client still sends, as net/http's server does.
func lingerClose(conn net.Conn) {
	tc, ok := conn.(*net.TCPConn)
	if !ok || tc.CloseWrite() != nil {
		return
	}
	_ = tc.SetReadDeadline(time.Now().Add(lingerTimeout))
	_, _ = io.Copy(io.Discard, io.LimitReader(tc, lingerBytes))
}

// local answers a request addressed to the proxy itself.
func (c *clientConn) local() bool {
	c.linger = c.req.hasBody()
	var w localResponse
	u, err := url.ParseRequestURI(c.req.target)
	if err != nil {
		http.Error(&w, "malformed request target", http.StatusBadRequest)
	} else {
		c.p.serveLocal(&w, &http.Request{Method: c.req.method, URL: u, Header: http.Header{}})
	}
	return w.send(c.bw, c.req.persistent() && !c.req.hasBody())
}

// splitTarget splits an absolute-form request target into its scheme,
// authority (without user information) and origin-form path.
func splitTarget(target string) (scheme, authority, path string, ok bool) {
	scheme, rest, ok := strings.Cut(target, "://")
	if !ok || scheme == "" {
		return "", "", "", false
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority, path = rest[:end], rest[end:]
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		authority = authority[i+1:]
	}
	if i := strings.IndexByte(path, '#'); i >= 0 {
		path = path[:i]
	}
	if path == "" || path[0] == '?' {
		path = "/" + path
	}
	return scheme, authority, path, authority != ""
}

// forward forwards one absolute-form request and its response. It
// reports whether the client connection stays open for another request.
func (c *clientConn) forward() bool {
	p, req := c.p, &c.req
	start := time.Now()
	scheme, authority, path, ok := splitTarget(req.target)
	if !ok {
		c.refuse(headError(http.StatusBadRequest, fmt.Sprintf("malformed request target %.60q", req.target)))
		return false
	}
	if req.method == http.MethodOptions && path == "/" && !strings.HasSuffix(req.target, "/") {
		path = "*"
	}
	host, port, err := SplitHostPort(authority, 80)
	e := p.log.begin(Entry{Start: start, Method: req.method, Host: normalizeHost(host), Port: port,
		URL: strings.ToLower(scheme) + "://" + authority + path, Scheme: "http", Timings: Timings{Connect: -1, Wait: -1}})
	if err == nil && !strings.EqualFold(scheme, "http") {
		err = faults.Newf(faults.CodeEgressDenied, faults.InvalidRequest, faults.Policy, "egress: the proxy forwards http:// only; use CONNECT for %s", scheme)
	}
	if err != nil {
		return c.fail(e, start, err)
	}
	kind, status, err := p.preDial(c.ctx, e)
	if err != nil {
		return c.fail(e, start, err)
	}
	switch kind {
	case faults.InjectHTTPStatus:
		return c.injectStatus(e, start, status)
	case faults.InjectConnectionReset:
		p.finish(e, start, 0, injectedReset(e.Host))
		reset(c.conn)
		return false
	}
	c.writeRequestHead(authority, path)
	key := e.Host + ":" + strconv.Itoa(port)
	var sent int64
	var up *upstream
	var body chan bodyResult // the body's copy, when it runs beside the response
	for attempt := 0; ; attempt++ {
		var reused bool
		up, reused, err = c.upstreamFor(key, e, start, port, attempt > 0)
		if err != nil {
			return c.fail(e, start, err)
		}
		var early int64
		early, err = c.sendHead(up)
		if err == nil && (early < req.contentLength || req.chunked) {
			// The rest of the body is copied beside the response, which
			// a site may send before it has read the body (413, 401) or
			// while it reads it.
			body = make(chan bodyResult, 1)
			go func() {
				n, err := c.sendBody(up, early)
				r := bodyResult{n: early + n, err: err}
				switch {
				case err != nil && c.cr.err != nil && !c.stopping.Load():
					// The client went away: its answer no longer matters.
					r.clientGone = true
					up.conn.Close()
				case errors.Is(err, errBadChunk), errors.Is(err, errHeadTooLarge):
					// The client's body cannot be forwarded: the site, still
					// waiting for the rest of it, would never answer.
					r.malformed = true
					up.conn.Close()
				}
				body <- r
			}()
		} else {
			sent = early
		}
		var gone bool
		if err == nil {
			var stop func() bool
			if body == nil {
				stop = c.watchClient(up)
			}
			err = c.readResponseHead(up)
			if stop != nil {
				gone = stop()
			}
		}
		if err == nil {
			break
		}
		c.dropUpstream()
		clientGone := c.cw.err != nil || gone
		var malformed bool
		if body != nil {
			r := c.stopBody(body)
			clientGone = r.clientGone || clientGone
			malformed = r.malformed
		}
		if clientGone {
			p.finish(e, start, 0, nil) // the client went away
			return false
		}
		if malformed {
			return c.fail(e, start, headError(http.StatusBadRequest, "malformed chunked request body"))
		}
		// A kept-alive connection the site closed as the request went out:
		// a request without a body can go again, as net/http's transport
		// retries it.
		if attempt == 0 && reused && !req.hasBody() && closedEarly(err) {
			continue
		}
		return c.fail(e, start, responseError(err, e.Host))
	}
	resp := &c.resp
	wait := time.Since(start)
	p.log.update(e, func(e *Entry) {
		e.Status, e.MIME, e.Timings.Wait = resp.status, resp.contentType, ms(wait)
	})
	recv, keep, err := c.copyResponse(up)
	if body != nil {
		r, done := c.awaitBody(body)
		if !done {
			// The response is complete and the site still has not taken
			// the whole body: it will not. The client's connection ends
			// (with what it still sends read for a while), and the site's.
			r = c.stopBody(body)
		}
		sent = r.n
		if !done || r.err != nil {
			keep, c.linger = false, true
			c.dropUpstream()
		}
	}
	if err != nil {
		c.dropUpstream()
		if c.cw.err != nil {
			err = nil // the client went away
		} else {
			err = responseError(err, e.Host)
		}
	}
	p.log.update(e, func(e *Entry) { e.Sent, e.Recv = sent, recv })
	p.finish(e, start, 0, err)
	return keep && err == nil
}

// watchAfter is how long a site may take to answer before the proxy
// starts watching the client: most answers come sooner, and a watch costs
// a wake-up and two deadline changes on the client's connection.
const watchAfter = 200 * time.Millisecond

// watchClient watches the client's connection while the proxy waits for
// the site's answer to a request whose body (if any) has been sent: if the
// client goes away meanwhile (a browser navigating away from a hanging
// site), the site connection is closed, which ends the wait, rather than
// held until the site answers, which may be never. stop ends the watch and
// reports whether the client went away. The watch reads at most into
// c.br, which nothing else reads meanwhile; a pipelined request it reads
// stays there for the next round. A nil stop means there is nothing to
// watch: the client has sent more already.
func (c *clientConn) watchClient(up *upstream) (stop func() bool) {
	if c.br.Buffered() > 0 {
		return nil
	}
	var stopping atomic.Bool
	prevErr := c.cr.err
	done := make(chan bool, 1)
	t := time.AfterFunc(watchAfter, func() {
		_, err := c.br.Peek(1)
		gone := err != nil && !stopping.Load()
		if gone {
			up.conn.Close()
		}
		done <- gone
	})
	return func() bool {
		if t.Stop() {
			return false // the answer came before the watch began
		}
		stopping.Store(true)
		_ = c.conn.SetReadDeadline(time.Unix(1, 0))
		gone := <-done
		_ = c.conn.SetReadDeadline(time.Time{})
		if !gone && errors.Is(c.cr.err, os.ErrDeadlineExceeded) {
			c.cr.err = prevErr // the watch's own deadline says nothing about the client
		}
		return gone
	}
}

// closedEarly reports whether err means the site closed or reset the
// connection before answering.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// responseError classifies a failure to get a response from host.
func responseError(err error, host string) error {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return faults.Wrap(err, faults.CodeSiteConnectionClosed, faults.Unavailable, faults.Site,
			fmt.Sprintf("%s closed the connection before the response was complete", host))
	case errors.Is(err, errHeadTooLarge), errors.Is(err, errBadChunk), errors.Is(err, errBadResponse):
		return faults.Wrap(err, faults.CodeNavigationFailed, faults.Unavailable, faults.Site,
			fmt.Sprintf("malformed HTTP response from %s", host))
	}
	return classifyDial(err, host)
}

var errBadResponse = errors.New("malformed response")

// writeRequestHead builds the head forwarded to the site in c.out: the
// request in origin-form, Host from the target, the hop-by-hop headers
// removed.
func (c *clientConn) writeRequestHead(authority, path string) {
	req := &c.req
	b := append(c.out[:0], req.method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, authority...)
	b = append(b, "\r\n"...)
	upgrade := req.upgrading()
	for _, f := range req.fields {
		switch {
		case strings.EqualFold(f.name, "Host"):
			continue
		case upgrade && strings.EqualFold(f.name, "Upgrade"):
		case req.hopByHop(f.name):
			continue
		case req.expect100 && strings.EqualFold(f.name, "Expect"):
			continue // answered by the proxy: see sendRequest
		}
		b = appendField(b, f)
	}
	if upgrade {
		b = append(b, "Connection: Upgrade\r\n"...)
	}
	if containsToken(req.te, "trailers") {
		b = append(b, "TE: trailers\r\n"...)
	}
	c.out = append(b, "\r\n"...)
}

func appendField(b []byte, f field) []byte {
	b = append(b, f.name...)
	b = append(b, ": "...)
	b = append(b, f.value...)
	return append(b, "\r\n"...)
}

func containsToken(list, tok string) bool {
	for t := range strings.SplitSeq(list, ",") {
		if strings.EqualFold(strings.Trim(t, " \t"), tok) {
			return true
		}
	}
	return false
}

// sendHead writes the request head to the site, with as much of the body
// as the client's buffer holds; it returns those body bytes.
func (c *clientConn) sendHead(up *upstream) (int64, error) {
	req := &c.req
	out := c.out
	var early int
	if req.contentLength > 0 {
		early = int(min(req.contentLength, int64(c.br.Buffered())))
		b, _ := c.br.Peek(early)
		out = append(out, b...)
	}
	if _, err := up.conn.Write(out); err != nil {
		return 0, err
	}
	c.br.Discard(early)
	if req.expect100 && (req.chunked || int64(early) < req.contentLength) {
		// The client waits for this before sending its body; the site,
		// which no longer sees the Expect header, would not send it.
		if _, err := io.WriteString(&c.cw, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return int64(early), err
		}
	}
	return int64(early), nil
}

// bodyResult is how a request body's copy ended.
type bodyResult struct {
	n          int64 // body bytes sent
	err        error
	clientGone bool // it failed reading from the client
	malformed  bool // the client's chunked framing was refused
}

// bodyWait is how long a complete response waits for the request body's
// copy to report: a site that read the whole body before answering has
// taken its last byte already, and the copy is about to end.
const bodyWait = 50 * time.Millisecond

// awaitBody waits briefly for the body's copy; false if it is still
// running.
func (c *clientConn) awaitBody(body chan bodyResult) (bodyResult, bool) {
	select {
	case r := <-body:
		return r, true
	default:
	}
	t := time.NewTimer(bodyWait)
	defer t.Stop()
	select {
	case r := <-body:
		return r, true
	case <-t.C:
		return bodyResult{}, false
	}
}

// sendBody copies the rest of the request body, after the early bytes
// sendHead sent, from the client to the site. It runs beside the
// response's reading, touching only the client's reader and the site
// connection's writing side.
func (c *clientConn) sendBody(up *upstream, early int64) (int64, error) {
	req := &c.req
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(up.conn)
	defer func() { bw.Reset(nil); writers.Put(bw) }()
	if req.chunked {
		return copyChunked(bw, c.br, false)
	}
	rest := req.contentLength - early
	err := copyN(bw, c.br, rest)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return 0, err
	}
	return rest, nil
}

// stopBody ends the body's copy wherever it waits, for the site or for
// the client, and returns how it ended.
func (c *clientConn) stopBody(body chan bodyResult) bodyResult {
	c.dropUpstream()
	c.stopping.Store(true)
	_ = c.conn.SetReadDeadline(time.Unix(1, 0))
	r := <-body
	_ = c.conn.SetReadDeadline(time.Time{})
	c.stopping.Store(false)
	return r
}

// readResponseHead reads the site's final response head into c.resp,
// passing informational (1xx) responses on to the client.
func (c *clientConn) readResponseHead(up *upstream) error {
	for n := 0; ; n++ {
		raw, err := readHead(up.br, c.hbuf)
		if err != nil {
			if n > 0 && err == io.EOF {
				// Not a connection closed before the request arrived: one
				// that has answered is not sent the request again.
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		c.hbuf = raw
		if err := parseResponse(string(raw), &c.resp); err != nil {
			return fmt.Errorf("%w: %w", errBadResponse, err)
		}
		st := c.resp.status
		if st >= 200 || st == http.StatusSwitchingProtocols {
			return nil
		}
		if n == max1xx {
			return fmt.Errorf("%w: too many informational responses", errBadResponse)
		}
		if c.req.minor >= 1 {
			c.writeResponseHead(false, false)
			c.bw.Write(c.rout)
			if err := c.bw.Flush(); err != nil {
				return err
			}
		}
	}
}

// writeResponseHead writes c.resp's head to the client, without the
// hop-by-hop headers; Transfer-Encoding stays unless the body is decoded
// for an HTTP/1.0 client.
func (c *clientConn) writeResponseHead(closing, decode bool) {
	resp := &c.resp
	b := append(c.rout[:0], "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(resp.status), 10)
	b = append(b, ' ')
	b = append(b, resp.reason...)
	b = append(b, "\r\n"...)
	upgrade := resp.status == http.StatusSwitchingProtocols
	for _, f := range resp.fields {
		switch {
		case upgrade && strings.EqualFold(f.name, "Upgrade"):
		case resp.hopByHop(f.name):
			continue
		case decode && strings.EqualFold(f.name, "Transfer-Encoding"):
			continue
		case resp.hasTE && strings.EqualFold(f.name, "Content-Length"):
			continue // Transfer-Encoding frames the body (RFC 9112 section 6.3)
		}
		b = appendField(b, f)
	}
	switch {
	case upgrade:
		b = append(b, "Connection: Upgrade\r\n"...)
	case closing:
		b = append(b, "Connection: close\r\n"...)
	}
	c.rout = append(b, "\r\n"...)
}

// copyResponse forwards c.resp's head and body to the client. It returns
// the body bytes and whether the client connection stays open.
func (c *clientConn) copyResponse(up *upstream) (int64, bool, error) {
	req, resp := &c.req, &c.resp
	if resp.status == http.StatusSwitchingProtocols {
		if !req.upgrading() {
			return 0, false, fmt.Errorf("%w: 101 without an upgrade request", errBadResponse)
		}
		return c.switchProtocols(up)
	}
	const (
		none = iota
		length
		chunked
		untilEOF
	)
	mode := untilEOF
	switch {
	case resp.bodyless(req.method):
		mode = none
	case resp.hasTE && resp.chunked:
		mode = chunked
	case resp.hasTE:
		// Another final coding: the body runs to the end of the connection.
	case resp.contentLength >= 0:
		mode = length
	}
	keep := req.persistent() && mode != untilEOF
	decode := mode == chunked && req.minor == 0
	upKeep := resp.reusable() && mode != untilEOF
	c.writeResponseHead(!keep, decode)
	if mode != length {
		c.bw.Write(c.rout)
	}
	var n int64
	var err error
	switch mode {
	case none:
		err = c.bw.Flush()
	case length:
		n, err = c.copyLength(up, resp.contentLength)
	case chunked:
		n, err = copyChunked(c.bw, up.br, decode)
	case untilEOF:
		n, err = c.copyToEOF(up)
	}
	if err != nil {
		return n, false, err
	}
	if !upKeep || up.br.Buffered() > 0 {
		// Bytes behind a complete response answer no request: the site
		// and the proxy disagree on where messages end, and reusing the
		// connection would hand them to the next request as its answer.
		c.dropUpstream()
	}
	return n, keep, nil
}

// copyLength copies an n-byte body. A body that fits in the site
// connection's buffer is read whole and leaves with the head in one write,
// so the client is woken once for the response; a larger one leaves as it
// arrives, the kernel splicing it from the site's socket to the client's
// when both are sockets.
func (c *clientConn) copyLength(up *upstream, n int64) (int64, error) {
	if n <= int64(up.br.Size()) {
		b, err := up.br.Peek(int(n))
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		if err := c.writeHeadAnd(b); err != nil {
			return 0, err
		}
		up.br.Discard(int(n))
		return n, nil
	}
	first := int(min(n, int64(up.br.Buffered())))
	b, _ := up.br.Peek(first)
	if err := c.writeHeadAnd(b); err != nil {
		return 0, err
	}
	up.br.Discard(first)
	rest := n - int64(first)
	if tc, ok := c.conn.(*net.TCPConn); ok && spliceable(tc, up.conn) {
		m, err := tc.ReadFrom(&io.LimitedReader{R: up.conn, N: rest})
		if err == nil && m < rest {
			err = io.ErrUnexpectedEOF
		}
		return int64(first) + m, err
	}
	err := copyN(c.bw, up.br, rest)
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		return int64(first), err
	}
	return n, nil
}

// writeHeadAnd writes the response head in c.rout and the body bytes b to
// the client in one system call.
func (c *clientConn) writeHeadAnd(b []byte) error {
	if err := c.bw.Flush(); err != nil {
		return err
	}
	bufs := net.Buffers{c.rout, b}
	if _, err := bufs.WriteTo(c.conn); err != nil { // writev on a socket
		c.cw.err = err
		return err
	}
	return nil
}

// copyToEOF copies a body that ends with the site's connection.
func (c *clientConn) copyToEOF(up *upstream) (int64, error) {
	n := int64(up.br.Buffered())
	b, _ := up.br.Peek(int(n))
	c.bw.Write(b)
	up.br.Discard(int(n))
	if err := c.bw.Flush(); err != nil {
		return 0, err
	}
	m := copyBuf(&c.cw, up.conn)
	c.dropUpstream()
	return n + m, c.cw.err
}

// switchProtocols forwards a 101 response and then copies bytes both ways
// until both sides close (a WebSocket over plain HTTP).
func (c *clientConn) switchProtocols(up *upstream) (int64, bool, error) {
	c.writeResponseHead(false, false)
	c.bw.Write(c.rout)
	if n := up.br.Buffered(); n > 0 {
		b, _ := up.br.Peek(n)
		c.bw.Write(b)
	}
	if err := c.bw.Flush(); err != nil {
		return 0, false, err
	}
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(n)
		if _, err := up.conn.Write(b); err != nil {
			return 0, false, err
		}
	}
	c.up = nil
	_, recv := pipe(c.conn, up.conn)
	c.p.idle.discard(up)
	return recv, false, nil
}

// upstreamFor returns a connection to key for the request: the one the
// client connection used last, an idle one, or (always when fresh) a new
// one. reused reports whether the site may have closed it meanwhile.
func (c *clientConn) upstreamFor(key string, e *Entry, start time.Time, port int, fresh bool) (u *upstream, reused bool, err error) {
	// A request without a body is sent again on a new connection if the
	// site has closed the one it took, which spares asking the kernel
	// whether it has (alive) before every request.
	check := c.req.hasBody()
	if c.up != nil && !fresh {
		if c.up.key == key && (!check || c.up.alive()) {
			return c.up, true, nil
		}
		c.p.idle.put(c.up)
		c.up = nil
	}
	if !fresh {
		if u := c.p.idle.get(key, check); u != nil {
			c.up = u
			return u, true, nil
		}
	}
	conn, err := c.p.dialConn(c.ctx, e.Host, port)
	if err != nil {
		return nil, false, err
	}
	d := time.Since(start)
	c.p.log.update(e, func(e *Entry) { e.Timings.Connect = ms(d) })
	u = &upstream{conn: conn, key: key, br: upstreamReaders.Get().(*bufio.Reader)}
	u.br.Reset(conn)
	c.up = u
	return u, false, nil
}

// dropUpstream closes the client connection's site connection: its state
// is unknown after a failure, or the site ends it.
func (c *clientConn) dropUpstream() {
	if c.up != nil {
		c.p.idle.discard(c.up)
		c.up = nil
	}
}

// localResponse is a response the proxy makes itself, buffered to be
// sent with its length.
type localResponse struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (w *localResponse) Header() http.Header {
	if w.h == nil {
		w.h = http.Header{}
	}
	return w.h
}

func (w *localResponse) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *localResponse) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// send writes the response; it reports whether the connection stays open.
func (w *localResponse) send(bw *bufio.Writer, keep bool) bool {
	w.WriteHeader(http.StatusOK)
	h := w.Header()
	if h.Get("Connection") == "close" {
		keep = false
	}
	h.Del("Connection")
	if !keep {
		h.Set("Connection", "close")
	}
	h.Set("Content-Length", strconv.Itoa(w.body.Len()))
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\n", w.status, http.StatusText(w.status))
	h.Write(bw)
	bw.WriteString("\r\n")
	bw.Write(w.body.Bytes())
	return bw.Flush() == nil && keep
}

// upstream is a connection to a site.
type upstream struct {
	conn  net.Conn
	br    *bufio.Reader // nil while idle
	key   string        // host:port
	timer *time.Timer   // closes it when idle too long
	since time.Time     // idle since
}

// alive reports whether an idle connection can carry a request: nothing
// unread from the site, and the site has not closed it. A socket is asked
// without waiting (MSG_PEEK|MSG_DONTWAIT); a tunnel stream is trusted, and
// a request that meets its end is retried.
func (u *upstream) alive() bool {
	if u.br != nil && u.br.Buffered() > 0 {
		return false
	}
	sc, ok := u.conn.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var b [1]byte
	err = rc.Control(func(fd uintptr) {
		_, _, rerr := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		alive = rerr == unix.EAGAIN
	})
	return err == nil && alive
}

// upstreamPool keeps idle site connections, most recently used first.
type upstreamPool struct {
	conns *connSet

	mu     sync.Mutex // guards idle, closed
	idle   map[string][]*upstream
	closed bool
}

// put keeps u for the next request to its host, or closes it.
func (p *upstreamPool) put(u *upstream) {
	if u.br.Buffered() > 0 {
		p.discard(u)
		return
	}
	p.mu.Lock()
	if p.closed || len(p.idle[u.key]) >= maxIdlePerHost {
		p.mu.Unlock()
		p.discard(u)
		return
	}
	if p.idle == nil {
		p.idle = map[string][]*upstream{}
	}
	u.br.Reset(nil)
	upstreamReaders.Put(u.br)
	u.br = nil
	u.since = time.Now()
	p.idle[u.key] = append(p.idle[u.key], u)
	if u.timer == nil {
		u.timer = time.AfterFunc(upstreamIdleTimeout, func() { p.expire(u) })
	} else {
		u.timer.Reset(upstreamIdleTimeout)
	}
	p.mu.Unlock()
}

// get takes an idle connection to key, or nil; with check, one that is
// still alive.
func (p *upstreamPool) get(key string, check bool) *upstream {
	for {
		p.mu.Lock()
		list := p.idle[key]
		if len(list) == 0 {
			p.mu.Unlock()
			return nil
		}
		u := list[len(list)-1]
		list[len(list)-1] = nil
		if len(list) == 1 {
			delete(p.idle, key)
		} else {
			p.idle[key] = list[:len(list)-1]
		}
		p.mu.Unlock()
		u.timer.Stop()
		u.br = upstreamReaders.Get().(*bufio.Reader)
		u.br.Reset(u.conn)
		if !check || u.alive() {
			return u
		}
		p.discard(u)
	}
}

// expire closes u if it is still idle and has been for the timeout.
func (p *upstreamPool) expire(u *upstream) {
	p.mu.Lock()
	list := p.idle[u.key]
	i := -1
	for j, v := range list {
		if v == u {
			i = j
		}
	}
	if i < 0 || time.Since(u.since) < upstreamIdleTimeout {
		p.mu.Unlock()
		return
	}
	list = append(list[:i], list[i+1:]...)
	if len(list) == 0 {
		delete(p.idle, u.key)
	} else {
		p.idle[u.key] = list
	}
	p.mu.Unlock()
	p.discard(u)
}

// discard closes u.
func (p *upstreamPool) discard(u *upstream) {
	if u.timer != nil {
		u.timer.Stop()
	}
	p.conns.remove(u.conn)
	u.conn.Close()
	if u.br != nil {
		u.br.Reset(nil)
		upstreamReaders.Put(u.br)
		u.br = nil
	}
}

// closeAll closes the idle connections and keeps no more.
func (p *upstreamPool) closeAll() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, list := range idle {
		for _, u := range list {
			p.discard(u)
		}
	}
}

// connSet is the connections a proxy holds, closed together when it stops.
type connSet struct {
	mu     sync.Mutex // guards m, closed
	m      map[net.Conn]struct{}
	closed bool
}

// add tracks c; false once the set is closed.
func (s *connSet) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.m == nil {
		s.m = map[net.Conn]struct{}{}
	}
	s.m[c] = struct{}{}
	return true
}

func (s *connSet) remove(c net.Conn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

// closeAll closes every connection and refuses new ones.
func (s *connSet) closeAll() {
	s.mu.Lock()
	s.closed = true
	m := s.m
	s.m = nil
	s.mu.Unlock()
	for c := range m {
		c.Close()
	}
}
