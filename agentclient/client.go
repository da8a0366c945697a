// Package agentclient is the host side of the agent protocol: a Client
// per sandbox agent (pooled keep-alive connections over a unix socket or
// TCP, plain connections for exec streams), a Pool of clients by address,
// and DialRaw for protocols that upgrade a connection (the egress tunnel).
// It knows neither the browser nor the desktop, so the server binary links
// neither; the agent itself (package agent) runs inside the sandbox.
package agentclient

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/failpoint"
)

const (
	// clientDialTimeout bounds connecting to an agent; a live agent
	// accepts at once, so anything slower is an unreachable one.
	clientDialTimeout = 5 * time.Second
	// clientIdleConns is how many idle connections to one agent are kept:
	// a sandbox rarely runs more requests than this at once.
	clientIdleConns = 16
	// clientIdleTimeout is below the agent's idleTimeout, so the client
	// drops a pooled connection before the agent does.
	clientIdleTimeout = 90 * time.Second
	// maxErrorBody bounds how much of an error response is read.
	maxErrorBody = 1 << 20
	// maxAnswer bounds a JSON answer of the agent that is decoded whole
	// (a listing, a patch's result): the agent lives in the sandbox, and
	// nothing it sends may exhaust the server's memory.
	maxAnswer = 64 << 20
	// maxDownloadAnswer bounds a decoded download: the agent's 1 GiB
	// file limit, base64-encoded, and its JSON around it.
	maxDownloadAnswer = (1<<30+2)/3*4 + 64<<10
	// maxEventLine bounds one line of an exec's event stream: the agent
	// sends output in chunks of 32 KiB, base64-encoded.
	maxEventLine = 1 << 20
	// maxTrailer bounds what is read after an exec's exit event to reach
	// the end of the response: nothing but the newline and the end of
	// the chunked body is expected there.
	maxTrailer = 4 << 10
)

// Client talks to one agent. It keeps a pool of keep-alive connections; it
// is safe for concurrent use.
type Client struct {
	base  string // http://... prefix of every request
	wsURL string // ws://.../exec/pty
	hc    *http.Client
	tr    *http.Transport
	rt    http.RoundTripper // tr, adding the agent's credentials
	// header is what every request carries: the agent's token, when
	// its address has one.
	header http.Header
	dialer *websocket.Dialer
	badErr error // set when addr could not be understood
	// execs carries Exec requests on plain connections (see execconn.go);
	// nil for https, where they go through hc.
	execs *execPool
}

// NewClient returns a client for the agent at addr: "unix:/path/agent.sock"
// or "http://host:port". An http address may carry the agent's token as
// its password ("http://orchard:TOKEN@host:port", the form a network-facing
// agent's runtime gives): every request then sends it as a bearer token.
// A malformed addr makes every call fail.
func NewClient(addr string) *Client {
	c := &Client{}
	d := &net.Dialer{Timeout: clientDialTimeout}
	dial := d.DialContext
	switch {
	case strings.HasPrefix(addr, "unix:"):
		sock := strings.TrimPrefix(addr, "unix:")
		dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", sock)
		}
		// The host is a placeholder: the dialer ignores it.
		c.base = "http://agent"
		c.wsURL = "ws://agent/exec/pty"
	case strings.HasPrefix(addr, "http://"), strings.HasPrefix(addr, "https://"):
		u, err := url.Parse(strings.TrimRight(addr, "/"))
		if err != nil || u.Host == "" {
			// Neither the address nor url's error (which quotes it) is
			// repeated: it may hold the agent's token.
			c.badErr = errors.New("agent address is not a URL")
			break
		}
		c.header = authHeader(u)
		u.User = nil
		c.base = u.String()
		ws := *u
		ws.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
		c.wsURL = ws.String() + "/exec/pty"
	default:
		c.badErr = fmt.Errorf("agent address %q: want unix:/path or http://host:port", addr)
	}
	c.tr = &http.Transport{
		// Agent addresses are sandbox-private: never through a proxy.
		Proxy:               nil,
		DialContext:         dial,
		MaxIdleConns:        clientIdleConns,
		MaxIdleConnsPerHost: clientIdleConns,
		IdleConnTimeout:     clientIdleTimeout,
		// Output is mostly small chunks; compression only adds latency.
		DisableCompression: true,
	}
	c.rt = c.tr
	if c.header != nil {
		c.rt = &authTransport{rt: c.tr, header: c.header}
	}
	c.hc = &http.Client{Transport: c.rt}
	if c.badErr == nil && strings.HasPrefix(c.base, "http://") {
		host := strings.TrimPrefix(c.base, "http://")
		c.execs = &execPool{dial: func(ctx context.Context) (net.Conn, error) { return dial(ctx, "tcp", host) }, header: c.header}
	}
	c.dialer = &websocket.Dialer{
		NetDialContext:   dial,
		HandshakeTimeout: clientDialTimeout,
		ReadBufferSize:   32 << 10,
		WriteBufferSize:  32 << 10,
	}
	return c
}

// Close drops the pooled connections.
func (c *Client) Close() {
	c.tr.CloseIdleConnections()
	if c.execs != nil {
		c.execs.closeIdle()
	}
}

// delivered marks a failure that came after an exec request reached the
// agent: the command may have started, so the call must not be repeated.
// Callers test for it with errors.As and an interface{ Delivered() bool }.
type delivered struct{ error }

func (delivered) Delivered() bool { return true }
func (d delivered) Unwrap() error { return d.error }

// Delivered reports whether a failed Exec had already handed its request
// to the agent, so that the command may have run; only an exec that failed
// before that may be retried.
func Delivered(err error) bool {
	var d interface{ Delivered() bool }
	return errors.As(err, &d) && d.Delivered()
}

// unreachable classifies a failure to talk to the agent at all. The caller
// giving up is not the sandbox's fault and keeps its own class.
func unreachable(ctx context.Context, op string, err error) error {
	err = fmt.Errorf("agent %s: %w", op, err)
	if ctx.Err() != nil {
		e := *faults.Of(context.Cause(ctx))
		e.Err = err
		return &e
	}
	return faults.Wrap(err, faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "sandbox agent unreachable").WithRetryable(true)
}

// do sends a request and returns the response of a 2xx answer; any other
// answer is decoded into its *faults.Error.
func (c *Client) do(ctx context.Context, op, method, path string, body any) (*http.Response, error) {
	if c.badErr != nil {
		return nil, faults.Wrap(c.badErr, faults.CodeMisconfigured, faults.Internal, faults.Platform, "bad agent address")
	}
	if err := failpoint.Eval("agent.client.request"); err != nil {
		return nil, err
	}
	var rd io.Reader
	if r, ok := body.(io.Reader); ok {
		rd = r // sent as it is read
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, faults.Wrap(fmt.Errorf("agent %s: encode request: %w", op, err), faults.CodeInternal, faults.Internal, faults.Platform, "internal error")
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, faults.Wrap(fmt.Errorf("agent %s: %w", op, err), faults.CodeInternal, faults.Internal, faults.Platform, "internal error")
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, unreachable(ctx, op, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, decodeError(ctx, op, resp)
}

// decodeError rebuilds the agent's classified error from an error response,
// keeping its HTTP status. A body without the envelope did not come from the
// agent's handlers (a proxy, a crash mid-answer): unreachable.
func decodeError(ctx context.Context, op string, resp *http.Response) error {
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if err != nil {
		return unreachable(ctx, op, fmt.Errorf("read error body (HTTP %d): %w", resp.StatusCode, err))
	}
	var env faults.Envelope
	if json.Unmarshal(b, &env) != nil || env.Error == nil {
		return unreachable(ctx, op, fmt.Errorf("HTTP %d without error envelope: %.200q", resp.StatusCode, b))
	}
	return faults.FromInfo(*env.Error, resp.StatusCode)
}

// getJSON runs a request and decodes the JSON answer into out.
func (c *Client) getJSON(ctx context.Context, op, method, path string, body, out any) error {
	resp, err := c.do(ctx, op, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	lr := &io.LimitedReader{R: resp.Body, N: maxAnswer + 1}
	if err := json.NewDecoder(lr).Decode(out); err != nil {
		if lr.N <= 0 {
			return faults.Newf(faults.CodeTooLarge, faults.TooLarge, faults.Sandbox,
				"the sandbox's answer to %s exceeds %d MiB", op, maxAnswer>>20)
		}
		return unreachable(ctx, op, fmt.Errorf("decode response: %w", err))
	}
	return nil
}

// Health asks the agent whether it is up.
func (c *Client) Health(ctx context.Context) (api.AgentHealth, error) {
	var h api.AgentHealth
	err := c.getJSON(ctx, "health", http.MethodGet, "/health", nil, &h)
	return h, err
}

// Exec runs a command and calls onEvent (if not nil) with each output event
// as it arrives, then returns how the command ended. A command that fails is
// a result; the error is for failures to run it at all. A stream that breaks
// before its exit event is unreachable (the agent or its sandbox died).
func (c *Client) Exec(ctx context.Context, req api.AgentExecRequest, onEvent func(api.ExecEvent)) (api.ExecExit, error) {
	if c.execs == nil {
		resp, err := c.do(ctx, "exec", http.MethodPost, "/exec", req)
		if err != nil {
			return api.ExecExit{}, err
		}
		defer resp.Body.Close()
		exit, _, err := readExecStream(ctx, resp.Body, onEvent)
		return exit, err
	}
	if err := failpoint.Eval("agent.client.request"); err != nil {
		return api.ExecExit{}, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return api.ExecExit{}, faults.Wrap(fmt.Errorf("agent exec: encode request: %w", err), faults.CodeInternal, faults.Internal, faults.Platform, "internal error")
	}
	resp, stop, err := c.execs.post(ctx, execHost(c.base), "/exec", body)
	if err != nil {
		return api.ExecExit{}, unreachable(ctx, "exec", err)
	}
	// From here on the agent has the request.
	if resp.StatusCode/100 != 2 {
		stop()
		defer resp.finish(false)
		return api.ExecExit{}, decodeError(ctx, "exec", resp.Response)
	}
	exit, complete, err := readExecStream(ctx, resp.Body, onEvent)
	// A connection whose I/O the context has aborted is not reused.
	complete = stop() && complete
	resp.finish(complete)
	return exit, err
}

// readExecStream reads an exec's NDJSON events up to its exit event, and
// then the end of the response, reporting whether it got there (only then
// may the connection carry another request).
func readExecStream(ctx context.Context, body io.Reader, onEvent func(api.ExecEvent)) (api.ExecExit, bool, error) {
	dec := json.NewDecoder(&lineLimit{r: body, max: maxEventLine})
	for {
		var ev api.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // no exit event: the stream broke
			}
			return api.ExecExit{}, false, unreachable(ctx, "exec", delivered{fmt.Errorf("read stream: %w", err)})
		}
		if ev.Exit != nil {
			// The stream ends here; reading its end lets the
			// connection carry the next exec instead of a new dial.
			_, err := io.CopyN(io.Discard, body, maxTrailer)
			return *ev.Exit, errors.Is(err, io.EOF), nil
		}
		if onEvent != nil {
			onEvent(ev)
		}
	}
}

// Upload writes a file in the sandbox.
func (c *Client) Upload(ctx context.Context, req api.UploadRequest) (api.UploadResult, error) {
	var res api.UploadResult
	err := c.getJSON(ctx, "upload", http.MethodPost, "/files/upload", req, &res)
	return res, err
}

// UploadFrom writes the file at path in the sandbox from content, the
// file's bytes, sent as they are read: the agent writes them to disk as
// they arrive, so neither side holds the file. mode is asked for once
// content has ended, so that a caller may learn it late (in an upload's
// JSON it may follow the content); "" keeps the agent's default. When
// reading content fails, the upload is abandoned, the agent writes
// nothing, and that error is returned as it is.
//
// The request is the same UploadRequest as Upload's, with the path first:
// an agent that holds the body whole (one from before streaming) still
// takes it.
func (c *Client) UploadFrom(ctx context.Context, path string, content io.Reader, mode func() string) (api.UploadResult, error) {
	p, err := json.Marshal(path)
	if err != nil {
		return api.UploadResult{}, faults.Wrap(fmt.Errorf("agent upload: encode path: %w", err), faults.CodeInternal, faults.Internal, faults.Platform, "internal error")
	}
	enc := &base64Reader{r: content}
	body := io.MultiReader(
		strings.NewReader(`{"path":`+string(p)+`,"content":"`),
		enc,
		&lateReader{f: func() io.Reader {
			end := `"}`
			if m := mode(); m != "" {
				b, _ := json.Marshal(m)
				end = `","mode":` + string(b) + `}`
			}
			return strings.NewReader(end)
		}},
	)
	var res api.UploadResult
	err = c.getJSON(ctx, "upload", http.MethodPost, "/files/upload", body, &res)
	if ferr := enc.readErr(); ferr != nil {
		return api.UploadResult{}, ferr
	}
	return res, err
}

// base64Reader encodes what it reads from r as standard base64, with
// padding at the end.
type base64Reader struct {
	r     io.Reader
	raw   [24 << 10]byte // a multiple of 3: only the last block pads
	enc   [32 << 10]byte
	carry int    // bytes of raw kept for the next block
	out   []byte // encoded, not yet read
	eof   bool

	// mu guards failed: the transport may still be reading the body when
	// the request returns.
	mu     sync.Mutex
	failed error // r's error other than io.EOF
}

func (b *base64Reader) readErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failed
}

func (b *base64Reader) Read(p []byte) (int, error) {
	for len(b.out) == 0 {
		if err := b.readErr(); err != nil {
			return 0, err
		}
		if b.eof {
			return 0, io.EOF
		}
		n, err := b.r.Read(b.raw[b.carry:])
		total := b.carry + n
		whole := total / 3 * 3
		switch {
		case errors.Is(err, io.EOF):
			b.eof, whole = true, total
		case err != nil:
			b.mu.Lock()
			b.failed = err
			b.mu.Unlock()
		}
		b.out = b.enc[:base64.StdEncoding.EncodedLen(whole)]
		base64.StdEncoding.Encode(b.out, b.raw[:whole])
		b.carry = copy(b.raw[:], b.raw[whole:total])
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

// lateReader reads what f returns, calling f on its first read.
type lateReader struct {
	f func() io.Reader
	r io.Reader
}

func (l *lateReader) Read(p []byte) (int, error) {
	if l.r == nil {
		l.r = l.f()
	}
	return l.r.Read(p)
}

// Download reads a file from the sandbox.
func (c *Client) Download(ctx context.Context, path string) (api.FileContent, error) {
	body, err := c.OpenDownload(ctx, path)
	if err != nil {
		return api.FileContent{}, err
	}
	defer body.Close()
	var res api.FileContent
	if err := json.NewDecoder(io.LimitReader(body, maxDownloadAnswer)).Decode(&res); err != nil {
		return api.FileContent{}, unreachable(ctx, "download", fmt.Errorf("decode response: %w", err))
	}
	return res, nil
}

// OpenDownload asks for a file of the sandbox and returns the agent's
// answer, a FileContent as JSON, as it streams: a server passes it on
// without holding a file of up to a gigabyte, base64-encoded, in memory.
// The caller closes it; a transfer the agent broke off ends in an error.
func (c *Client) OpenDownload(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, "download", http.MethodGet, "/files/download?path="+url.QueryEscape(path), nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// List lists a directory of the sandbox; "" means the agent's default.
func (c *Client) List(ctx context.Context, path string) (api.FileList, error) {
	q := ""
	if path != "" {
		q = "?path=" + url.QueryEscape(path)
	}
	var res api.FileList
	err := c.getJSON(ctx, "list", http.MethodGet, "/files/list"+q, nil, &res)
	return res, err
}

// Patch applies a unified diff with git apply.
func (c *Client) Patch(ctx context.Context, req api.AgentPatchRequest) (api.AgentPatchResult, error) {
	var res api.AgentPatchResult
	err := c.getJSON(ctx, "patch", http.MethodPost, "/patch", req, &res)
	return res, err
}

// DialPTY opens the agent's PTY WebSocket; header is sent with the
// handshake. The caller owns the connection and speaks the frames of
// ORCHARD_COMPAT §3.17 on it. A refused handshake with an error envelope
// returns that error.
func (c *Client) DialPTY(ctx context.Context, header http.Header) (*websocket.Conn, *http.Response, error) {
	if c.badErr != nil {
		return nil, nil, faults.Wrap(c.badErr, faults.CodeMisconfigured, faults.Internal, faults.Platform, "bad agent address")
	}
	if c.header != nil {
		header = header.Clone()
		if header == nil {
			header = http.Header{}
		}
		for k, v := range c.header {
			header[k] = v
		}
	}
	conn, resp, err := c.dialer.DialContext(ctx, c.wsURL, header)
	if err == nil {
		return conn, resp, nil
	}
	if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		// gorilla has read at most 1 KiB of the body into resp.Body.
		defer resp.Body.Close()
		return nil, resp, decodeError(ctx, "pty", resp)
	}
	return nil, resp, unreachable(ctx, "pty", err)
}

// HTTP returns the agent's base URL and the client's transport, for
// forwarding requests (a reverse proxy) to the agent. The transport adds
// the agent's credentials.
func (c *Client) HTTP() (*url.URL, http.RoundTripper) {
	u, err := url.Parse(c.base)
	if err != nil || c.badErr != nil {
		u = &url.URL{Scheme: "http", Host: "invalid"}
	}
	return u, c.rt
}

// authHeader is the header that carries the token in u's password.
func authHeader(u *url.URL) http.Header {
	if u.User == nil {
		return nil
	}
	tok, ok := u.User.Password()
	if !ok || tok == "" {
		return nil
	}
	return http.Header{"Authorization": {"Bearer " + tok}}
}

// authTransport adds the agent's credentials to every request; a
// forwarded client request never brings its own (the server drops them).
type authTransport struct {
	rt     http.RoundTripper
	header http.Header
}

func (t *authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.header {
		r.Header[k] = v
	}
	return t.rt.RoundTrip(r)
}

// DialRaw opens a bare connection to the agent at addr ("unix:/path" or
// "http://host:port"), for protocols that upgrade it (the egress tunnel),
// and returns the header the upgrade request must carry (the agent's
// token; nil for none). It is an egress.DialAgent.
func DialRaw(ctx context.Context, addr string) (net.Conn, http.Header, error) {
	var d net.Dialer
	switch {
	case strings.HasPrefix(addr, "unix:"):
		c, err := d.DialContext(ctx, "unix", strings.TrimPrefix(addr, "unix:"))
		return c, nil, err
	case strings.HasPrefix(addr, "http://"):
		u, err := url.Parse(addr)
		if err != nil || u.Host == "" {
			return nil, nil, errors.New("agent address is not a URL")
		}
		c, err := d.DialContext(ctx, "tcp", u.Host)
		return c, authHeader(u), err
	}
	return nil, nil, fmt.Errorf("agent address %q: want unix:/path or http://host:port", addr)
}

// lineLimit fails a read once a line grows past max bytes: a JSON decoder
// holds a whole value in memory, and a stream of lines is bounded by its
// longest.
type lineLimit struct {
	r   io.Reader
	max int
	n   int // bytes since the last newline
}

var errLineTooLong = errors.New("line too long")

func (l *lineLimit) Read(p []byte) (int, error) {
	if l.n > l.max {
		return 0, errLineTooLong
	}
	n, err := l.r.Read(p)
	if i := bytes.LastIndexByte(p[:n], '\n'); i >= 0 {
		l.n = n - i - 1
	} else {
		l.n += n
	}
	return n, err
}
