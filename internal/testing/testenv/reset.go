package testenv

import (
	"errors"
	"net"
	"sync"
	"testing"
)

// Reset closes c with a TCP reset rather than a FIN (SO_LINGER 0), as a
// client that crashes, times out or is killed mid-answer does: the peer's
// next writes fail with ECONNRESET, then EPIPE, which raises SIGPIPE in the
// writer. c must be a *net.TCPConn (a WebSocket's is its NetConn).
func Reset(c net.Conn) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return errors.New("reset: not a TCP connection")
	}
	if err := tc.SetLinger(0); err != nil {
		tc.Close()
		return err
	}
	return tc.Close()
}

// ResettingSite listens on a free loopback port and resets every
// connection it accepts at once, before reading it: a site that drops
// what connects while the request is still on its way. It returns the
// port; the listener closes at cleanup.
func ResettingSite(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = Reset(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().(*net.TCPAddr).Port
}
