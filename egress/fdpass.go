package egress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/faults"
)

// The socket channel: a second connection to the agent's socket, upgraded
// with SocketProtocol, over which the agent asks for connections and the
// server answers each with a connected socket (SCM_RIGHTS) instead of
// relaying the bytes itself. Requests and replies are JSON lines carrying
// an id, so dials run concurrently; a reply with fd=true has exactly one
// descriptor attached to its bytes, and descriptors arrive in the order of
// the replies that carry them.
//
// What the agent receives is one end of a socket pair whose other end the
// server splices to and from the dialed TCP connection. Handing over the
// dialed TCP socket itself would save the server's hop too, but the agent
// could then disconnect it (connect with AF_UNSPEC) and reconnect or listen
// anywhere from the server's network namespace; a socket pair can reach
// nothing but the connection the policy allowed.

// SocketProtocol is the Upgrade token of the socket channel.
const SocketProtocol = "orchard-egress-fd/1"

// errChannelDown is a socket channel that broke; the dial falls back on
// the tunnel's streams.
var errChannelDown = errors.New("egress socket channel down")

type fdReply struct {
	conn net.Conn
	err  error
}

// fdClient is the agent's end of a socket channel.
type fdClient struct {
	conn *net.UnixConn

	wmu sync.Mutex // serializes request lines

	mu      sync.Mutex // guards pending, next, err
	pending map[uint64]chan fdReply
	next    uint64
	err     error // set once the channel is down
	done    chan struct{}
}

func newFDClient(conn *net.UnixConn) *fdClient {
	c := &fdClient{conn: conn, pending: map[uint64]chan fdReply{}, done: make(chan struct{})}
	go c.read()
	return c
}

func (c *fdClient) close() {
	c.conn.Close()
	<-c.done
}

func (c *fdClient) live() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// dial asks the server for a connection to host:port. errChannelDown
// means the request may not have reached the server.
func (c *fdClient) dial(ctx context.Context, host string, port int) (net.Conn, error) {
	ch := make(chan fdReply, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, errChannelDown
	}
	c.next++
	id := c.next
	c.pending[id] = ch
	c.mu.Unlock()

	req, _ := json.Marshal(dialRequest{ID: id, Host: host, Port: port})
	c.wmu.Lock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	_, err := c.conn.Write(append(req, '\n'))
	c.wmu.Unlock()
	if err != nil {
		c.conn.Close()
		c.forget(id)
		return nil, errChannelDown
	}
	select {
	case r := <-ch:
		return r.conn, r.err
	case <-ctx.Done():
		if c.forget(id) {
			return nil, classifyDial(context.Cause(ctx), host)
		}
		// The reply is being delivered: take it so its socket is not lost.
		r := <-ch
		if r.conn != nil {
			r.conn.Close()
		}
		return nil, classifyDial(context.Cause(ctx), host)
	}
}

// forget drops request id; false if its reply was already delivered.
func (c *fdClient) forget(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.pending[id]
	delete(c.pending, id)
	return ok
}

// deliver hands a reply to its waiting dial, or closes its socket if the
// dial gave up.
func (c *fdClient) deliver(id uint64, r fdReply) {
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if ok {
		ch <- r
	} else if r.conn != nil {
		r.conn.Close()
	}
}

// maxFDsPerRead sizes the control buffer: the kernel hands over one
// message's descriptors per read, and each reply carries at most one.
const maxFDsPerRead = 4

func (c *fdClient) read() {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
		c.mu.Lock()
		c.err = errChannelDown
		pending := c.pending
		c.pending = map[uint64]chan fdReply{}
		c.mu.Unlock()
		for _, ch := range pending {
			ch <- fdReply{err: errChannelDown}
		}
		c.conn.Close()
		close(c.done)
	}()
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*maxFDsPerRead))
	var line []byte
	for {
		n, oobn, flags, _, err := c.conn.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			got, perr := parseRights(oob[:oobn])
			fds = append(fds, got...)
			if perr != nil {
				return
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			// A descriptor was dropped (the agent is out of them): the
			// order of replies and descriptors is lost.
			return
		}
		data := buf[:max(n, 0)]
		for len(data) > 0 {
			i := indexNL(data)
			if i < 0 {
				line = append(line, data...)
				if len(line) > maxHandshake {
					return
				}
				break
			}
			line = append(line, data[:i]...)
			data = data[i+1:]
			var resp dialResponse
			if json.Unmarshal(line, &resp) != nil || resp.ID == 0 {
				return
			}
			line = line[:0]
			var r fdReply
			switch {
			case resp.Error != nil:
				r.err = faults.FromInfo(*resp.Error, 0)
			case resp.FD && len(fds) > 0:
				fd := fds[0]
				fds = fds[1:]
				r.conn, r.err = fdConn(fd)
			default:
				return
			}
			c.deliver(resp.ID, r)
		}
		if err != nil {
			return
		}
	}
}

func indexNL(b []byte) int {
	for i, c := range b {
		if c == '\n' {
			return i
		}
	}
	return -1
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// fdConn turns a received descriptor into a connection and closes it.
func fdConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "egress")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeEgressUnavailable, faults.Unavailable, faults.Network, "egress: received socket")
	}
	return c, nil
}

// ServeSockets serves the server's end of an upgraded socket channel until
// it closes or ctx ends: every request is dialed with dial and answered
// with one end of a socket pair spliced to the connection. Spliced
// connections end with ctx too.
func ServeSockets(ctx context.Context, conn net.Conn, dial DialFunc, log *slog.Logger) error {
	uc := unixOf(conn)
	if uc == nil {
		conn.Close()
		return fmt.Errorf("egress socket channel: %T is not a unix socket", conn)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	var wmu sync.Mutex // serializes replies with their descriptors
	reply := func(resp dialResponse, fd int) error {
		b, _ := json.Marshal(resp)
		b = append(b, '\n')
		var oob []byte
		if fd >= 0 {
			oob = unix.UnixRights(fd)
		}
		wmu.Lock()
		defer wmu.Unlock()
		_ = uc.SetWriteDeadline(time.Now().Add(handshakeTimeout))
		n, _, err := uc.WriteMsgUnix(b, oob, nil)
		if err == nil && n != len(b) {
			err = errors.New("short write")
		}
		if err != nil {
			conn.Close() // the order of replies and descriptors is lost
		}
		return err
	}
	br := bufio.NewReaderSize(conn, 512)
	for {
		line, err := readLine(br)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return err
		}
		var req dialRequest
		if err := json.Unmarshal(line, &req); err != nil || req.ID == 0 {
			return fmt.Errorf("egress socket channel: bad request %q", line)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveSocket(ctx, req, dial, reply, &wg, log)
		}()
	}
}

func serveSocket(ctx context.Context, req dialRequest, dial DialFunc, reply func(dialResponse, int) error, wg *sync.WaitGroup, log *slog.Logger) {
	resp := dialResponse{ID: req.ID}
	up, err := dial(ctx, req.Host, req.Port)
	if err != nil {
		f := faults.Of(err)
		info := f.Info()
		resp.Error = &info
		log.Debug("egress dial failed", "host", req.Host, "port", req.Port, "code", f.Code, "err", err)
		_ = reply(resp, -1)
		return
	}
	ours, theirs, err := socketPair()
	if err != nil {
		up.Close()
		info := faults.Of(faults.Wrap(err, faults.CodeEgressUnavailable, faults.Unavailable, faults.Platform, "egress: socket pair")).Info()
		resp.Error = &info
		_ = reply(resp, -1)
		return
	}
	resp.Remote, resp.FD = up.RemoteAddr().String(), true
	err = reply(resp, theirs)
	unix.Close(theirs)
	if err != nil {
		up.Close()
		ours.Close()
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		stop := context.AfterFunc(ctx, func() { up.Close(); ours.Close() })
		defer stop()
		pipe(ours, up)
	}()
}

// socketPair returns the server's end as a connection and the agent's as a
// descriptor.
func socketPair() (net.Conn, int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("socketpair: %w", err)
	}
	c, err := fdConn(fds[0])
	if err != nil {
		unix.Close(fds[1])
		return nil, -1, err
	}
	return c, fds[1], nil
}

// unixOf is the unix socket under a connection Upgrade or AcceptUpgrade
// returned.
func unixOf(c net.Conn) *net.UnixConn {
	if bc, ok := c.(*bufConn); ok {
		c = bc.Conn
	}
	uc, _ := c.(*net.UnixConn)
	return uc
}
