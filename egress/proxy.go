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

	"strconv"
	"sync"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/inject"
	"github.com/orchard/orchard/retry"
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

// Proxy is the sandbox's HTTP/HTTPS proxy. It serves each client
// connection on one goroutine of its own: plain HTTP requests are
// forwarded by the lean HTTP/1.1 forwarder (forward.go) over site
// connections it keeps alive across client connections; CONNECT turns the
// connection into a byte tunnel.
type Proxy struct {
	dial   DialFunc
	log    *Log
	inject *inject.Injector
	logger *slog.Logger
	conns  connSet
	idle   upstreamPool
}

// Bounds of idle connections, as net/http's server and transport had them
// here: a client (a browser) keeps connections for a while between page
// loads; a site connection is worth keeping while a page loads its
// resources.
const (
	clientIdleTimeout   = 2 * time.Minute
	upstreamIdleTimeout = 90 * time.Second
	maxIdlePerHost      = 16
)

// NewProxy returns a proxy that reaches hosts with dial, records into
// log, and applies inj's network faults (inj may be nil).
func NewProxy(dial DialFunc, log *Log, inj *inject.Injector, logger *slog.Logger) *Proxy {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{dial: dial, log: log, inject: inj, logger: logger}
	p.idle.conns = &p.conns
	return p
}

// Log is the proxy's connection log.
func (p *Proxy) Log() *Log { return p.log }

// Serve serves the proxy on ln until ctx ends, then closes every
// connection it holds.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	var err error
	// Out of descriptors, most likely: wait for some to close, as
	// net/http's server does, from up to 5 ms to up to a second.
	acceptRetry := retry.NewBackoff(retry.Policy{Initial: 5 * time.Millisecond, Max: time.Second})
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			if ctx.Err() != nil || errors.Is(aerr, net.ErrClosed) {
				break
			}
			wait, _ := acceptRetry.Next(aerr) // no Attempts or Budget: ctx ends it
			p.logger.Debug("egress proxy: accept", "err", aerr, "retry_in", wait)
			if retry.Sleep(ctx, wait) == nil {
				continue
			}
			break
		}
		acceptRetry.Reset()
		if !p.conns.add(c) {
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.serveConn(ctx, c)
		}()
	}
	p.conns.closeAll()
	wg.Wait()
	p.idle.closeAll()
	return err
}

// serveLocal answers an origin-form request, one addressed to the proxy
// itself: the log, the evidence, or an explanation.
func (p *Proxy) serveLocal(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case PathLog:
		p.serveLog(w, r)
	case PathEvidence:
		p.serveEvidence(w, r)
	default:
		http.Error(w, "this is the sandbox's HTTP proxy: send absolute-form requests or CONNECT", http.StatusBadRequest)
	}
}

// statusOf is the status the proxy answers a failed connection with.
func statusOf(f *faults.Error) int {
	switch {
	case f.Status != 0:
		return f.Status
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

// connect serves a CONNECT request: the client's connection becomes a
// tunnel to the host, its bytes copied both ways.
func (p *Proxy) connect(c *clientConn) {
	start := time.Now()
	target := c.req.target
	host, port, err := SplitHostPort(target, 443)
	e := p.log.begin(Entry{Start: start, Method: http.MethodConnect, Host: normalizeHost(host), Port: port,
		URL: "https://" + target, Scheme: "tunnel", Timings: Timings{Connect: -1, Wait: -1}})
	if err != nil {
		c.fail(e, start, err)
		return
	}
	kind, status, err := p.preDial(c.ctx, e)
	if err != nil {
		c.fail(e, start, err)
		return
	}
	if kind == faults.InjectHTTPStatus {
		c.injectStatus(e, start, status)
		return
	}
	var up net.Conn
	if kind != faults.InjectConnectionReset {
		if up, err = p.dialConn(c.ctx, e.Host, port); err != nil {
			c.fail(e, start, err)
			return
		}
	}
	connected := time.Since(start)
	p.log.update(e, func(e *Entry) { e.Timings.Connect = ms(connected); e.Status = http.StatusOK })
	if _, err := io.WriteString(c.conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		p.closeConn(up)
		p.finish(e, start, 0, nil)
		return
	}
	if kind == faults.InjectConnectionReset {
		// Logged first: the client may look at the log as soon as it sees the reset.
		p.finish(e, start, 0, injectedReset(e.Host))
		reset(c.conn)
		return
	}
	// Bytes the client sent behind its CONNECT go first, so that from then
	// on the copies run between the bare sockets, which the kernel splices.
	var early int64
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(n)
		if _, err := up.Write(b); err != nil {
			p.closeConn(up)
			p.finish(e, start, 0, nil)
			return
		}
		early = int64(n)
	}
	sent, recv := pipe(c.conn, up)
	p.conns.remove(up)
	p.log.update(e, func(e *Entry) { e.Sent, e.Recv = sent+early, recv })
	p.finish(e, start, 0, nil)
}

// dialConn dials host:port for the proxy and tracks the connection, so
// that Serve closes it when it returns.
func (p *Proxy) dialConn(ctx context.Context, host string, port int) (net.Conn, error) {
	up, err := p.dial(ctx, host, port)
	if err != nil {
		return nil, err
	}
	if !p.conns.add(up) {
		up.Close()
		return nil, faults.New(faults.CodeEgressUnavailable, faults.Unavailable, faults.Network, "egress proxy: shutting down")
	}
	return up, nil
}

// closeConn closes a connection from dialConn.
func (p *Proxy) closeConn(c net.Conn) {
	if c != nil {
		p.conns.remove(c)
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
