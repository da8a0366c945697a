package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// ptyReadyTimeout is how long PTY waits for the session to start, as
// Orchard Env's SDK does (ORCHARD_COMPAT §10.8).
const ptyReadyTimeout = 10 * time.Second

// ptyCloseGrace is how long Close lets the command exit after SIGTERM
// before it drops the connection (which makes the server kill it anyway).
const ptyCloseGrace = 2 * time.Second

// ptyMaxFrame is the largest frame either side sends (Orchard's 4 MiB).
const ptyMaxFrame = 4 << 20

// ptyStdinChunk is the most input one stdin frame carries: base64 makes it
// 4/3 larger, well under ptyMaxFrame.
const ptyStdinChunk = 1 << 20

// ErrSessionEnded is wrapped by the error of a write to a PTY session that
// has already ended.
var ErrSessionEnded = errors.New("pty session has ended")

// PTYOptions describe the command of a PTY session.
type PTYOptions struct {
	// Cmd is the argv to run (no shell is involved); empty means
	// ["bash", "-l"], an interactive login shell.
	Cmd []string
	// Env is added to the sandbox's environment.
	Env map[string]string
	// Cwd is the working directory; empty means the sandbox's default
	// (/workspace).
	Cwd string
	// Rows and Cols are the initial terminal size; zero means 24×80.
	Rows, Cols int
	// LoginShell runs Cmd inside `bash --login -i` after ~/.bashrc.
	LoginShell bool
}

// PTYSession is a running interactive command with a terminal. Its output
// arrives on Output, which must be drained: an unread channel holds the
// session back, as a full pipe would. All methods are safe for concurrent
// use.
type PTYSession struct {
	conn  *websocket.Conn
	out   chan []byte
	ready chan struct{} // closed at the ready frame or when the session ends
	done  chan struct{} // closed when the reader has finished
	stop  chan struct{} // closed by Close: output is dropped from then on
	pid   int           // set before ready is closed

	writeMu   sync.Mutex // guards writes to conn
	readyOnce sync.Once
	closeOnce sync.Once
	stopCtx   func() bool

	mu       sync.Mutex // guards the fields below
	exited   bool
	code     int
	errFrame string
	aborted  error // why the session was cut from this side
	err      error // final error, set before done is closed
}

// PTY starts cmd in the sandbox with a pseudo-terminal and returns once it
// runs. The session lives until the command exits, Close is called or ctx
// ends (which kills the command).
func (c *Client) PTY(ctx context.Context, id string, opts PTYOptions) (*PTYSession, error) {
	u, err := c.ptyURL(id)
	if err != nil {
		return nil, err
	}
	d := websocket.Dialer{
		Proxy:            http.ProxyFromEnvironment,
		HandshakeTimeout: ptyReadyTimeout,
		ReadBufferSize:   32 << 10,
		WriteBufferSize:  32 << 10,
	}
	if t, ok := c.http.Transport.(*http.Transport); ok {
		d.Proxy, d.NetDialContext = t.Proxy, t.DialContext
		if t.TLSClientConfig != nil {
			d.TLSClientConfig = t.TLSClientConfig.Clone()
		}
	}
	hdr := http.Header{"User-Agent": {c.ua}}
	if c.key != "" {
		hdr.Set("X-API-Key", c.key)
	}
	conn, resp, err := d.DialContext(ctx, u, hdr)
	if err != nil {
		switch {
		case resp != nil:
			body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
			resp.Body.Close()
			return nil, decodeError(resp.StatusCode, body)
		case ctx.Err() != nil:
			f := faults.Of(context.Cause(ctx))
			return nil, faults.Wrap(err, f.Code, f.Category, f.Source, "pty: "+f.Message)
		}
		return nil, unreachable(c.base, err)
	}
	conn.SetReadLimit(ptyMaxFrame)

	cmd := opts.Cmd
	if len(cmd) == 0 {
		cmd = []string{"bash", "-l"}
	}
	env := opts.Env
	if env == nil {
		env = map[string]string{}
	}
	init := api.PTYInitFrame{Type: api.PTYInit, Cmd: cmd, Env: env, Rows: opts.Rows, Cols: opts.Cols, LoginShell: opts.LoginShell}
	if opts.Cwd != "" {
		init.Cwd = &opts.Cwd
	}
	if init.Rows <= 0 {
		init.Rows = 24
	}
	if init.Cols <= 0 {
		init.Cols = 80
	}
	s := &PTYSession{
		conn:  conn,
		out:   make(chan []byte, 64),
		ready: make(chan struct{}),
		done:  make(chan struct{}),
		stop:  make(chan struct{}),
	}
	if err := s.send(init); err != nil {
		conn.Close()
		return nil, unreachable(c.base, err)
	}
	go s.read()
	s.stopCtx = context.AfterFunc(ctx, func() { s.abort(context.Cause(ctx)) })

	t := time.NewTimer(ptyReadyTimeout)
	defer t.Stop()
	select {
	case <-s.ready:
		select {
		case <-s.done:
			// Ended before it started (bad init, spawn failure): report
			// it now, unless it ran to an exit code.
			if _, err := s.Wait(); err != nil {
				s.Close()
				return nil, err
			}
		default:
		}
		return s, nil
	case <-t.C:
		s.abort(faults.Newf(faults.CodeTimeout, faults.Timeout, faults.Platform, "pty: session did not start within %s", ptyReadyTimeout))
	case <-ctx.Done():
		s.abort(context.Cause(ctx))
	}
	s.Close()
	_, err = s.Wait()
	return nil, err
}

// ptyURL is the WebSocket URL of the sandbox's PTY endpoint, with the API
// key in the query (browsers and Orchard Env's SDK cannot set headers).
func (c *Client) ptyURL(id string) (string, error) {
	u, err := url.Parse(c.base + sandboxPath(id) + "/exec/pty")
	if err != nil {
		return "", faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "invalid server URL "+c.base)
	}
	switch strings.ToLower(u.Scheme) {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	}
	if c.key != "" {
		u.RawQuery = url.Values{"api_key": {c.key}}.Encode()
	}
	return u.String(), nil
}

// PID is the command's process id inside the sandbox (0 if unknown).
func (s *PTYSession) PID() int { return s.pid }

// Output delivers the terminal's output (stdout and stderr merged) in
// chunks. It is closed when the session ends.
func (s *PTYSession) Output() <-chan []byte { return s.out }

// Done is closed when the session has ended; Wait then returns at once.
func (s *PTYSession) Done() <-chan struct{} { return s.done }

// Write sends p to the command's terminal as typed input. It implements
// io.Writer.
func (s *PTYSession) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), ptyStdinChunk)]
		if err := s.sendLive(api.PTYInputFrame{Type: api.PTYStdin, Data: chunk}); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// Resize changes the terminal size.
func (s *PTYSession) Resize(rows, cols int) error {
	return s.sendLive(api.PTYInputFrame{Type: api.PTYResize, Rows: rows, Cols: cols})
}

// Signal sends a signal to the command's process group: TERM, KILL, INT,
// HUP or QUIT (an unknown name is TERM).
func (s *PTYSession) Signal(name string) error {
	return s.sendLive(api.PTYInputFrame{Type: api.PTYSignal, Sig: strings.TrimPrefix(strings.ToUpper(name), "SIG")})
}

// Wait blocks until the session ends and returns the command's exit code:
// its exit status, or -N when signal N killed it. The error is non-nil when
// the session ended without an exit code (connection lost, server error,
// Close, ctx).
func (s *PTYSession) Wait() (int, error) {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.code, s.err
}

// Close ends the session: the command gets SIGTERM and a moment to exit,
// then the connection is dropped. Output not yet read is discarded. Close
// is safe to call more than once and after the session has ended.
func (s *PTYSession) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		select {
		case <-s.done:
		default:
			if s.send(api.PTYInputFrame{Type: api.PTYClose}) == nil {
				t := time.NewTimer(ptyCloseGrace)
				select {
				case <-s.done:
				case <-t.C:
				}
				t.Stop()
			}
		}
		s.abort(faults.New(faults.CodeCanceled, faults.Canceled, faults.Client, "pty session closed before the command exited"))
		<-s.done
		if s.stopCtx != nil {
			s.stopCtx()
		}
	})
	return nil
}

// abort cuts the connection; the reader then ends the session with why,
// unless the command had already exited.
func (s *PTYSession) abort(why error) {
	s.mu.Lock()
	if s.aborted == nil {
		s.aborted = why
	}
	s.mu.Unlock()
	_ = s.conn.Close()
}

// sendLive sends a frame to a session that has not ended.
func (s *PTYSession) sendLive(f api.PTYInputFrame) error {
	select {
	case <-s.done:
		return faults.Wrap(ErrSessionEnded, faults.CodePTYFailed, faults.Conflict, faults.Client, ErrSessionEnded.Error())
	default:
	}
	if err := s.send(f); err != nil {
		return faults.Wrap(err, faults.CodeUnreachable, faults.Unavailable, faults.Platform, "pty: send "+f.Type)
	}
	return nil
}

func (s *PTYSession) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return s.conn.WriteMessage(websocket.TextMessage, b)
}

// read is the session's only reader: it turns frames into output and the
// final result, and closes out, ready and done when the connection ends.
func (s *PTYSession) read() {
	defer close(s.done)
	defer s.readyOnce.Do(func() { close(s.ready) })
	defer close(s.out)
	for {
		_, data, err := s.conn.ReadMessage()
		if err != nil {
			s.finish(err)
			return
		}
		var f api.PTYOutputFrame
		if json.Unmarshal(data, &f) != nil {
			continue // the protocol ignores frames it cannot parse
		}
		switch f.Type {
		case api.PTYReady:
			s.readyOnce.Do(func() { s.pid = f.PID; close(s.ready) })
		case api.PTYStdout:
			if len(f.Data) == 0 {
				continue
			}
			select {
			case s.out <- f.Data:
			case <-s.stop:
			}
		case api.PTYExit:
			s.mu.Lock()
			s.exited = true
			if f.Code != nil {
				s.code = *f.Code
			}
			s.mu.Unlock()
		case api.PTYError:
			s.mu.Lock()
			s.errFrame = f.Message
			s.mu.Unlock()
		}
	}
}

// finish records the session's result once the connection has ended.
func (s *PTYSession) finish(readErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	closeCode := 0
	var ce *websocket.CloseError
	if errors.As(readErr, &ce) {
		closeCode = ce.Code
	}
	switch {
	case s.exited:
		s.err = nil
	case s.errFrame != "" || closeCode >= 4000:
		msg := s.errFrame
		if msg == "" {
			msg = ce.Text
		}
		s.err = ptyCloseError(closeCode, msg)
	case s.aborted != nil:
		f := faults.Of(s.aborted)
		s.err = faults.Wrap(s.aborted, f.Code, f.Category, f.Source, f.Message)
	default:
		s.err = faults.Wrap(readErr, faults.CodeUnreachable, faults.Unavailable, faults.Platform,
			"pty connection lost before the command exited")
	}
	if s.err != nil {
		s.code = -1
	}
}

// ptyCloseError classifies a session the server ended with an error, by
// the close codes of ORCHARD_COMPAT §3.17.
func ptyCloseError(code int, msg string) *faults.Error {
	if msg == "" {
		msg = "pty session failed"
	}
	msg = "pty: " + msg
	switch code {
	case 4400:
		return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, msg)
	case 4401:
		return faults.New(faults.CodeUnauthenticated, faults.Unauthenticated, faults.Client, msg)
	case 4404:
		return faults.New(faults.CodeSandboxNotFound, faults.NotFound, faults.Client, msg)
	case 4409:
		return faults.New(faults.CodeSandboxNotReady, faults.InvalidRequest, faults.Sandbox, msg)
	case 4503:
		return faults.New(faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, msg)
	}
	return faults.New(faults.CodePTYFailed, faults.Internal, faults.Sandbox, msg)
}
