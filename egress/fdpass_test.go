package egress

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/faults"
)

// unixPair returns the two ends of a connected unix stream socket pair.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestTunnelDialPaths: a dial takes the socket channel when it is up and
// falls back on the tunnel's streams when it is absent or broken; either
// way policy refusals come back as the server's faults.
func TestTunnelDialPaths(t *testing.T) {
	_, port := site(t, false)
	p, _ := strconv.Atoi(port)
	d := &Dialer{AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Hosts: testHosts("site"), Timeout: 3 * time.Second}
	pol := Policy{Allow: []string{"site.test"}, AllowPrefixes: d.AllowPrefixes}
	dial := func(ctx context.Context, host string, port int) (net.Conn, error) {
		return d.Dial(ctx, pol, host, port)
	}
	cases := []struct {
		name    string
		sockets string // "", "live", "dead"
		socket  bool   // the connection is a socket of its own, not a stream
	}{
		{"tunnel only", "", false},
		{"socket channel", "live", true},
		{"broken socket channel", "dead", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			tun := NewTunnel(2 * time.Second)
			served := make(chan struct{}, 2)
			a, b := unixPair(t)
			go func() { _ = ServeTunnel(ctx, b, dial, discard()); served <- struct{}{} }()
			if err := tun.Attach(a); err != nil {
				t.Fatal(err)
			}
			waiting := 1
			if c.sockets != "" {
				sa, sb := unixPair(t)
				if c.sockets == "live" {
					waiting++
					go func() { _ = ServeSockets(ctx, sb, dial, discard()); served <- struct{}{} }()
				} else {
					sb.Close()
				}
				if err := tun.AttachSockets(sa); err != nil {
					t.Fatal(err)
				}
			}
			defer func() {
				tun.Close()
				cancel()
				for range waiting {
					<-served
				}
			}()

			conn, err := tun.Dial(ctx, "site.test", p)
			if err != nil {
				t.Fatal(err)
			}
			_, isUnix := conn.(*net.UnixConn)
			if isUnix != c.socket {
				t.Errorf("connection is %T", conn)
			}
			if _, err := io.WriteString(conn, "GET /x HTTP/1.0\r\nHost: site.test\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := io.ReadAll(conn)
			conn.Close()
			if err != nil || len(resp) < 12 || string(resp[:12]) != "HTTP/1.0 200" {
				t.Errorf("response %q %v", resp, err)
			}
			_, err = tun.Dial(ctx, "other.test", p)
			if f := faults.Of(err); f.Code != faults.CodeEgressDenied || f.Source != faults.Policy {
				t.Errorf("refused host: %v", err)
			}
		})
	}
}

// TestPassedSocketReachesNothingElse: what the agent receives over the
// socket channel is a unix socket pair end, which cannot be disconnected
// and pointed elsewhere, as a TCP socket (connect with AF_UNSPEC, then
// connect again) could from the server's network namespace.
func TestPassedSocketReachesNothingElse(t *testing.T) {
	_, port := site(t, false)
	p, _ := strconv.Atoi(port)
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	d := &Dialer{AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Hosts: testHosts("site"), Timeout: 3 * time.Second}
	dial := func(ctx context.Context, host string, port int) (net.Conn, error) {
		return d.Dial(ctx, Policy{Allow: []string{"site.test"}, AllowPrefixes: d.AllowPrefixes}, host, port)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sa, sb := unixPair(t)
	served := make(chan struct{})
	go func() { defer close(served); _ = ServeSockets(ctx, sb, dial, discard()) }()
	defer func() { cancel(); <-served }()
	fc := newFDClient(sa)
	defer fc.close()
	conn, err := fc.dial(ctx, "site.test", p)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rc, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	op := func(f func(fd int) error) error {
		var ferr error
		if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
			t.Fatal(err)
		}
		return ferr
	}
	var domain int
	err = op(func(fd int) (err error) {
		domain, err = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
		return err
	})
	if err != nil || domain != unix.AF_UNIX {
		t.Errorf("passed socket's domain %d (%v), want AF_UNIX", domain, err)
	}
	_ = op(func(fd int) error {
		sa := unix.RawSockaddr{Family: unix.AF_UNSPEC}
		_, _, errno := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
		if errno != 0 {
			return errno
		}
		return nil
	})
	target := &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: other.Addr().(*net.TCPAddr).Port}
	err = op(func(fd int) error { return unix.Connect(fd, target) })
	if err == nil || errors.Is(err, unix.EINPROGRESS) {
		_ = other.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Second))
		if c, aerr := other.Accept(); aerr == nil {
			c.Close()
		}
		t.Fatalf("the passed socket connected to an address the server never dialed (%v)", err)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
