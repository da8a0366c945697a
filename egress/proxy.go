package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/inject"
)

// Headers the proxy sets on responses it makes itself, so a client (and
// the browser's attribution) can tell them from a site's own answers.
const (
	HeaderErrorCode   = "X-Orchard-Error-Code"
	HeaderErrorSource = "X-Orchard-Error-Source"
	HeaderInjected    = "X-Orchard-Injected"
)

// Paths the proxy answers itself (origin-form requests to the proxy's own
// address): the log, and the evidence a browser asks for.
const (
	PathLog      = "/.orchard/egress/log"
	PathEvidence = "/.orchard/egress/evidence"
)

// Proxy is the sandbox's HTTP/HTTPS proxy.
type Proxy struct {
	dial   DialFunc
	log    *Log
	inject *inject.Injector
	logger *slog.Logger
	fwd    *httputil.ReverseProxy
	tr     *http.Transport
}

// NewProxy returns a proxy that reaches hosts with dial, records into
// log, and applies inj's network faults (inj may be nil).
func NewProxy(dial DialFunc, log *Log, inj *inject.Injector, logger *slog.Logger) *Proxy {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{dial: dial, log: log, inject: inj, logger: logger}
	p.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, err := SplitHostPort(addr, 80)
			if err != nil {
				return nil, err
			}
			c, err := p.dial(ctx, host, port)
			if hook, ok := ctx.Value(dialHookKey{}).(func(error)); ok {
				hook(err)
			}
			return c, err
		},
		DisableCompression:  true, // pass bodies through as the site sent them
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   false,
	}
	p.fwd = &httputil.ReverseProxy{
		Transport: p.tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.Host = pr.In.Host
		},
		ErrorLog:   slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
		BufferPool: bufferPool{},
	}
	return p
}

// Log is the proxy's connection log.
func (p *Proxy) Log() *Log { return p.log }

// Serve serves the proxy on ln until ctx ends.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(p.logger.Handler(), slog.LevelDebug),
	}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	err := srv.Serve(ln)
	p.tr.CloseIdleConnections()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		p.connect(w, r)
	case r.URL.IsAbs():
		p.forward(w, r)
	case r.URL.Path == PathLog:
		p.serveLog(w, r)
	case r.URL.Path == PathEvidence:
		p.serveEvidence(w, r)
	default:
		http.Error(w, "this is the sandbox's HTTP proxy: send absolute-form requests or CONNECT", http.StatusBadRequest)
	}
}

// statusOf is the status the proxy answers a failed connection with.
func statusOf(f *faults.Error) int {
	switch {
	case f.Source == faults.Policy:
		return http.StatusForbidden
	case f.Category == faults.Timeout:
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

func writeFault(w http.ResponseWriter, f *faults.Error, injected *faults.Truth) {
	h := w.Header()
	h.Set(HeaderErrorCode, f.Code)
	h.Set(HeaderErrorSource, string(f.Source))
	if injected != nil {
		h.Set(HeaderInjected, injected.Kind)
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Connection", "close")
	w.WriteHeader(statusOf(f))
	fmt.Fprintf(w, "%s: %s\n", f.Code, f.Message)
}

// preDial applies the connection's injected fault before dialing: latency
// delays, dns_failure fails the dial. http_status and connection_reset are
// returned for the caller to apply.
func (p *Proxy) preDial(ctx context.Context, e *Entry) (kind string, status int, err error) {
	f, truth, ok := p.inject.Connection(e.Host)
	if !ok {
		return "", 0, nil
	}
	p.log.update(e, func(e *Entry) { e.Injected = &truth })
	switch f.Kind {
	case faults.InjectLatency:
		t := time.NewTimer(time.Duration(f.LatencyMS) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return f.Kind, 0, classifyDial(context.Cause(ctx), e.Host)
		}
	case faults.InjectDNSFailure:
		return f.Kind, 0, classifyDial(&net.DNSError{Err: "no such host (injected)", Name: e.Host, IsNotFound: true}, e.Host)
	}
	return f.Kind, f.Status, nil
}

func (p *Proxy) finish(e *Entry, start time.Time, status int, err error) {
	p.log.update(e, func(e *Entry) {
		e.Timings.Total = ms(time.Since(start))
		e.Done = true
		if status != 0 {
			e.Status = status
		}
		if err != nil {
			info := faults.Of(err).Info()
			e.Error = &info
		}
	})
}

func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	host, port, err := SplitHostPort(r.Host, 443)
	e := p.log.begin(Entry{Start: start, Method: http.MethodConnect, Host: normalizeHost(host), Port: port,
		URL: "https://" + r.Host, Scheme: "tunnel", Timings: Timings{Connect: -1, Wait: -1}})
	if err != nil {
		p.fail(w, e, start, err)
		return
	}
	kind, status, err := p.preDial(r.Context(), e)
	if err != nil {
		p.fail(w, e, start, err)
		return
	}
	if kind == faults.InjectHTTPStatus {
		p.injectStatus(w, e, start, status)
		return
	}
	var up net.Conn
	if kind != faults.InjectConnectionReset {
		if up, err = p.dial(r.Context(), e.Host, port); err != nil {
			p.fail(w, e, start, err)
			return
		}
	}
	connected := time.Since(start)
	p.log.update(e, func(e *Entry) { e.Timings.Connect = ms(connected); e.Status = http.StatusOK })
	rc := http.NewResponseController(w)
	conn, brw, err := rc.Hijack()
	if err != nil {
		closeConn(up)
		p.finish(e, start, 0, err)
		return
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		closeConn(up)
		conn.Close()
		p.finish(e, start, 0, nil)
		return
	}
	if kind == faults.InjectConnectionReset {
		// Logged first: the client may look at the log as soon as it sees the reset.
		p.finish(e, start, 0, injectedReset(e.Host))
		reset(conn)
		return
	}
	// Bytes the client sent behind its CONNECT go first, so that from then
	// on the copies run between the bare sockets, which the kernel splices.
	var early int64
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			conn.Close()
			up.Close()
			p.finish(e, start, 0, nil)
			return
		}
		early = int64(n)
	}
	sent, recv := pipe(conn, up)
	p.log.update(e, func(e *Entry) { e.Sent, e.Recv = sent+early, recv })
	p.finish(e, start, 0, nil)
}

func closeConn(c net.Conn) {
	if c != nil {
		c.Close()
	}
}

func injectedReset(host string) error {
	return faults.New(faults.CodeSiteConnectionReset, faults.Unavailable, faults.Site,
		fmt.Sprintf("connection to %s reset (injected)", host))
}

// reset closes c with a TCP RST, as a site that drops a connection does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func (p *Proxy) fail(w http.ResponseWriter, e *Entry, start time.Time, err error) {
	f := faults.Of(err)
	p.finish(e, start, statusOf(f), err)
	p.log.mu.Lock()
	inj := e.Injected
	p.log.mu.Unlock()
	writeFault(w, f, inj)
}

func (p *Proxy) injectStatus(w http.ResponseWriter, e *Entry, start time.Time, status int) {
	f := faults.New(faults.CodeSiteHTTPPrefix+strconv.Itoa(status), faults.Unavailable, faults.Site,
		fmt.Sprintf("HTTP %d from %s (injected)", status, e.Host))
	if status < 500 && status != 429 {
		f.Category, f.Retryable = faults.ActionFailed, false
	}
	p.finish(e, start, status, f)
	w.Header().Set(HeaderInjected, faults.InjectHTTPStatus)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<html><body><h1>%d %s</h1></body></html>\n", status, http.StatusText(status))
}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	port := 80
	if r.URL.Scheme == "https" {
		port = 443
	}
	host, port, err := SplitHostPort(r.URL.Host, port)
	e := p.log.begin(Entry{Start: start, Method: r.Method, Host: normalizeHost(host), Port: port,
		URL: r.URL.String(), Scheme: "http", Timings: Timings{Connect: -1, Wait: -1}})
	if err == nil && r.URL.Scheme != "http" {
		err = faults.Newf(faults.CodeEgressDenied, faults.InvalidRequest, faults.Policy, "egress: the proxy forwards http:// only; use CONNECT for %s", r.URL.Scheme)
	}
	if err != nil {
		p.fail(w, e, start, err)
		return
	}
	kind, status, err := p.preDial(r.Context(), e)
	if err != nil {
		p.fail(w, e, start, err)
		return
	}
	switch kind {
	case faults.InjectHTTPStatus:
		p.injectStatus(w, e, start, status)
		return
	case faults.InjectConnectionReset:
		p.finish(e, start, 0, injectedReset(e.Host))
		if conn, _, herr := http.NewResponseController(w).Hijack(); herr == nil {
			reset(conn)
		}
		return
	}
	var dialErr atomic.Pointer[error]
	var sent countReader
	if r.Body != nil && r.Body != http.NoBody {
		sent.r = r.Body
		r.Body = &sent
	}
	ctx := withDialHook(r.Context(), func(err error) {
		if err != nil {
			dialErr.Store(&err)
		} else {
			d := time.Since(start)
			p.log.update(e, func(e *Entry) { e.Timings.Connect = ms(d) })
		}
	})
	r = r.WithContext(ctx)
	rw := &recordingWriter{ResponseWriter: w}
	fwd := *p.fwd
	fwd.ModifyResponse = func(resp *http.Response) error {
		wait := time.Since(start)
		p.log.update(e, func(e *Entry) {
			e.Status = resp.StatusCode
			e.MIME = resp.Header.Get("Content-Type")
			e.Timings.Wait = ms(wait)
		})
		return nil
	}
	fwd.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		if de := dialErr.Load(); de != nil {
			err = *de
		} else if _, ok := errors.AsType[*faults.Error](err); !ok {
			err = classifyDial(err, e.Host)
		}
		p.fail(w, e, start, err)
	}
	fwd.ServeHTTP(rw, r)
	p.log.update(e, func(e *Entry) { e.Sent, e.Recv = sent.n, rw.n })
	p.log.mu.Lock()
	done := e.Done
	p.log.mu.Unlock()
	if !done {
		p.finish(e, start, 0, nil)
	}
}

type dialHookKey struct{}

// withDialHook lets forward learn the classified dial error, which the
// transport would otherwise wrap beyond recognition.
func withDialHook(ctx context.Context, hook func(error)) context.Context {
	return context.WithValue(ctx, dialHookKey{}, hook)
}

func (p *Proxy) serveLog(w http.ResponseWriter, r *http.Request) {
	since, _ := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64)
	entries := p.log.Entries(since)
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Query().Get("format") == "har" {
		_ = json.NewEncoder(w).Encode(HAR(entries, "orchard"))
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"entries": entries})
}

func (p *Proxy) serveEvidence(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ns, _ := strconv.ParseInt(q.Get("since"), 10, 64)
	e, ok := p.log.Evidence(q.Get("host"), time.Unix(0, ns))
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		_, _ = io.WriteString(w, "{}\n")
		return
	}
	_ = json.NewEncoder(w).Encode(e)
}

type recordingWriter struct {
	http.ResponseWriter
	n int64
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	return n, err
}

func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type countReader struct {
	r io.ReadCloser
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countReader) Close() error { return c.r.Close() }
