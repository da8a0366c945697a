package egress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/orchard/orchard/faults"
)

// The tunnel: the server opens a connection to the agent's socket and
// upgrades it (POST /egress/tunnel, Upgrade: TunnelProtocol); both ends then
// speak yamux over it. For each connection the sandbox makes, the agent
// opens a stream, writes a dialRequest line, and reads a dialResponse line;
// after a successful response the stream carries the connection's bytes.
// One multiplexed connection per sandbox keeps the server's file
// descriptors at one per sandbox however many connections are open. The
// socket channel (fdpass.go), when the agent speaks it, carries the dials
// instead and spends two descriptors per connection for a shorter path;
// the streams remain the fallback.

// TunnelProtocol is the Upgrade token of the tunnel.
const TunnelProtocol = "orchard-egress/1"

// TunnelPath is the agent path the server upgrades.
const TunnelPath = "/egress/tunnel"

type dialRequest struct {
	ID   uint64 `json:"id,omitempty"` // socket channel only
	Host string `json:"host"`
	Port int    `json:"port"`
}

type dialResponse struct {
	ID     uint64       `json:"id,omitempty"` // socket channel only
	Remote string       `json:"remote,omitempty"`
	Error  *faults.Info `json:"error,omitempty"`
	FD     bool         `json:"fd,omitempty"` // a socket is attached
}

const (
	// handshakeTimeout bounds reading a stream's request line: the agent
	// writes it at once.
	handshakeTimeout = 10 * time.Second
	// maxHandshake bounds that line.
	maxHandshake = 4 << 10
)

func yamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.Logger = nil
	// A page load opens tens of connections at once; the default 256 KiB
	// window throttles a single large download on a fast link.
	c.MaxStreamWindowSize = 4 << 20
	c.KeepAliveInterval = 15 * time.Second
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamOpenTimeout = 15 * time.Second
	return c
}

// Tunnel is the agent's end: it dials through whichever session the server
// attached last.
type Tunnel struct {
	mu      sync.Mutex // guards sess, ready, sockets, closed
	sess    *yamux.Session
	sockets *fdClient     // nil until the server attaches a socket channel
	ready   chan struct{} // closed when a session is attached
	closed  bool
	waitFor time.Duration
}

// NewTunnel returns a tunnel with no session. Dial waits up to waitFor
// for the server to attach one.
func NewTunnel(waitFor time.Duration) *Tunnel {
	return &Tunnel{ready: make(chan struct{}), waitFor: waitFor}
}

// Attach makes conn, already upgraded, the tunnel's session. A live
// session stays: the server that holds it keeps the sandbox; a restarted
// server re-attaches once the old session has died with its process.
func (t *Tunnel) Attach(conn net.Conn) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		conn.Close()
		return errors.New("tunnel closed")
	}
	if t.sess != nil && !t.sess.IsClosed() {
		// Another server replica serves this sandbox; taking its tunnel
		// would cut the connections open through it.
		conn.Close()
		return faults.New(faults.CodeEgressUnavailable, faults.Conflict, faults.Platform, "egress tunnel already attached by another server")
	}
	s, err := yamux.Client(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return err
	}
	old := t.sess
	t.sess = s
	select {
	case <-t.ready:
	default:
		close(t.ready)
	}
	if old != nil {
		old.Close()
	}
	return nil
}

// Held reports whether a live session is attached.
func (t *Tunnel) Held() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sess != nil && !t.sess.IsClosed()
}

// Close closes the current session.
func (t *Tunnel) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.sess != nil {
		t.sess.Close()
	}
	if t.sockets != nil {
		t.sockets.close()
	}
}

// AttachSockets makes conn, already upgraded with SocketProtocol, the
// channel that later dials receive their connections over. The same rule
// as Attach holds: a live channel stays.
func (t *Tunnel) AttachSockets(conn net.Conn) error {
	uc := unixOf(conn)
	if uc == nil || conn != net.Conn(uc) {
		// Bytes already buffered would separate replies from their
		// descriptors; the server sends nothing before a request.
		conn.Close()
		return fmt.Errorf("egress socket channel: %T is not a bare unix socket", conn)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		conn.Close()
		return errors.New("tunnel closed")
	}
	if t.sockets != nil && t.sockets.live() {
		conn.Close()
		return faults.New(faults.CodeEgressUnavailable, faults.Conflict, faults.Platform, "egress socket channel already attached by another server")
	}
	t.sockets = newFDClient(uc)
	return nil
}

// HeldSockets reports whether a live socket channel is attached.
func (t *Tunnel) HeldSockets() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sockets != nil && t.sockets.live()
}

func (t *Tunnel) session(ctx context.Context) (*yamux.Session, error) {
	ctx, cancel := context.WithTimeout(ctx, t.waitFor)
	defer cancel()
	for {
		t.mu.Lock()
		s, ready := t.sess, t.ready
		if s != nil && s.IsClosed() {
			// The server went away; wait for the next attach.
			t.ready = make(chan struct{})
			t.sess, s, ready = nil, nil, t.ready
		}
		t.mu.Unlock()
		if s != nil {
			return s, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, faults.New(faults.CodeEgressUnavailable, faults.Unavailable, faults.Network,
				"egress: the sandbox's tunnel to the server is down")
		}
	}
}

// Dial connects to host:port through the server: over the socket channel
// when one is attached, else (or when it breaks) over a tunnel stream.
func (t *Tunnel) Dial(ctx context.Context, host string, port int) (net.Conn, error) {
	t.mu.Lock()
	sc := t.sockets
	t.mu.Unlock()
	if sc != nil {
		c, err := sc.dial(ctx, host, port)
		if !errors.Is(err, errChannelDown) {
			return c, err
		}
	}
	return t.dialStream(ctx, host, port)
}

func (t *Tunnel) dialStream(ctx context.Context, host string, port int) (net.Conn, error) {
	s, err := t.session(ctx)
	if err != nil {
		return nil, err
	}
	st, err := s.OpenStream()
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeEgressUnavailable, faults.Unavailable, faults.Network, "egress: open tunnel stream")
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = st.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(time.Now()) })
	defer stop()
	req, _ := json.Marshal(dialRequest{Host: host, Port: port})
	if _, err := st.Write(append(req, '\n')); err != nil {
		st.Close()
		return nil, faults.Wrap(err, faults.CodeEgressUnavailable, faults.Unavailable, faults.Network, "egress: tunnel write")
	}
	br := bufio.NewReaderSize(st, 512)
	line, err := readLine(br)
	if err != nil {
		st.Close()
		if ctx.Err() != nil {
			return nil, classifyDial(context.Cause(ctx), host)
		}
		return nil, faults.Wrap(err, faults.CodeEgressUnavailable, faults.Unavailable, faults.Network, "egress: tunnel read")
	}
	var resp dialResponse
	if err := json.Unmarshal(line, &resp); err != nil {
		st.Close()
		return nil, faults.Wrap(err, faults.CodeEgressUnavailable, faults.Unavailable, faults.Network, "egress: bad tunnel response")
	}
	if resp.Error != nil {
		st.Close()
		return nil, faults.FromInfo(*resp.Error, 0)
	}
	if !stop() {
		return nil, classifyDial(context.Cause(ctx), host)
	}
	_ = st.SetDeadline(time.Time{})
	return &bufConn{Conn: st, r: br}, nil
}

func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, chunk...)
		if len(line) > maxHandshake {
			return nil, errors.New("handshake line too long")
		}
		if !isPrefix {
			return line, nil
		}
	}
}

// bufConn is a connection whose first bytes sit in a reader's buffer.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) {
	if c.r.Buffered() > 0 {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes: a yamux stream's Close sends FIN and keeps reading.
func (c *bufConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// DialFunc dials host:port for one sandbox.
type DialFunc func(ctx context.Context, host string, port int) (net.Conn, error)

// ServeTunnel serves the server's end of an upgraded tunnel connection
// until it closes or ctx ends: every stream is a dial request answered
// with dial.
func ServeTunnel(ctx context.Context, conn net.Conn, dial DialFunc, log *slog.Logger) error {
	sess, err := yamux.Server(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return err
	}
	defer sess.Close()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveStream(ctx, st, dial, log)
		}()
	}
}

func serveStream(ctx context.Context, st *yamux.Stream, dial DialFunc, log *slog.Logger) {
	_ = st.SetReadDeadline(time.Now().Add(handshakeTimeout))
	br := bufio.NewReaderSize(st, 512)
	line, err := readLine(br)
	if err != nil {
		st.Close()
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	var req dialRequest
	if err := json.Unmarshal(line, &req); err != nil {
		st.Close()
		return
	}
	up, err := dial(ctx, req.Host, req.Port)
	var resp dialResponse
	if err != nil {
		f := faults.Of(err)
		info := f.Info()
		resp.Error = &info
		log.Debug("egress dial failed", "host", req.Host, "port", req.Port, "code", f.Code, "err", err)
	} else {
		resp.Remote = up.RemoteAddr().String()
	}
	b, _ := json.Marshal(resp)
	if _, werr := st.Write(append(b, '\n')); werr != nil || err != nil {
		st.Close()
		if up != nil {
			up.Close()
		}
		return
	}
	pipe(&bufConn{Conn: st, r: br}, up)
}

// pipe copies both ways until both directions end, passing half-closes
// on, and closes both connections. It returns the bytes a→b and b→a.
func pipe(a, b net.Conn) (ab, ba int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ba = copyBuf(a, b)
		closeWrite(a)
	}()
	ab = copyBuf(b, a)
	closeWrite(b)
	wg.Wait()
	a.Close()
	b.Close()
	return ab, ba
}

// copyBufSize is large enough that a bulk transfer crosses the tunnel in
// big yamux frames rather than io.Copy's 32 KiB ones.
const copyBufSize = 256 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

func copyBuf(dst io.Writer, src io.Reader) int64 {
	if spliceable(dst, src) {
		n, _ := io.Copy(dst, src)
		return n
	}
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	// Hidden from io.CopyBuffer: a TCP socket's ReadFrom would copy from
	// anything but a socket through its own 32 KiB buffer.
	n, _ := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *buf)
	return n
}

// spliceable reports whether Go copies between a and b with splice(2),
// the bytes never entering user space: a TCP socket with a TCP or unix one.
func spliceable(a, b any) bool {
	sock := func(c any) (tcp, ok bool) {
		switch c.(type) {
		case *net.TCPConn:
			return true, true
		case *net.UnixConn:
			return false, true
		}
		return false, false
	}
	at, aok := sock(a)
	bt, bok := sock(b)
	return aok && bok && (at || bt)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	c.Close()
}

// Upgrade turns a fresh connection to an agent into a tunnel connection
// (proto TunnelProtocol) or a socket channel (SocketProtocol).
func Upgrade(ctx context.Context, conn net.Conn, proto string, header http.Header) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	defer conn.SetDeadline(time.Time{})
	req := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: TunnelPath}, Host: "agent",
		Header: http.Header{"Connection": {"Upgrade"}, "Upgrade": {proto}}}
	for k, v := range header {
		req.Header[k] = v
	}
	err := req.Write(conn)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("egress tunnel: agent answered %s: %s", resp.Status, body)
	}
	return &bufConn{Conn: conn, r: br}, nil
}

// AcceptUpgrade is the agent's handler side of Upgrade to proto: it
// answers 101 and returns the hijacked connection.
func AcceptUpgrade(w http.ResponseWriter, r *http.Request, proto string) (net.Conn, error) {
	if r.Header.Get("Upgrade") != proto {
		return nil, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "egress tunnel: want Upgrade: %s", proto)
	}
	rc := http.NewResponseController(w)
	conn, brw, err := rc.Hijack()
	if err != nil {
		return nil, err
	}
	_, err = fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", proto)
	if err == nil {
		err = brw.Flush()
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	if brw.Reader.Buffered() > 0 {
		return &bufConn{Conn: conn, r: brw.Reader}, nil
	}
	return conn, nil
}
