package egress

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

// A zone-qualified IPv6 literal ("::1%lo") never matches a netip.Prefix, so
// the private-range ban must not be bypassed by adding a zone.
func TestZonedAddressRefused(t *testing.T) {
	for _, s := range []string{"::1%lo", "::1%1", "fe80::1%lo", "fd00::1%eth0", "ff02::1%lo"} {
		if err := (Policy{}).CheckAddr("x", netip.MustParseAddr(s)); err == nil {
			t.Errorf("CheckAddr(%s) allowed", s)
		}
	}
}

// End to end: a sandbox asking for "[::1%lo]:port" reaches the host's
// IPv6 loopback through the dialer.
func TestDialZonedLoopbackRefused(t *testing.T) {
	port := hostService(t, "[::1]:0")
	d := &Dialer{Timeout: 2 * time.Second}
	if _, err := d.Dial(context.Background(), Policy{}, "::1", port); err == nil {
		t.Fatal("plain ::1 allowed")
	}
	host, p, _ := SplitHostPort("[::1%lo]:"+strconv.Itoa(port), 443)
	c, err := d.Dial(context.Background(), Policy{}, host, p)
	if err == nil {
		c.Close()
		t.Fatalf("dial %s:%d reached the host's loopback (%s)", host, p, c.RemoteAddr())
	}
}

// Through the whole path (proxy in the sandbox, tunnel, server's dialer):
// CONNECT to the host's IPv6 loopback with a zone is refused like ::1.
func TestConnectZonedLoopbackRefused(t *testing.T) {
	port := hostService(t, "[::1]:0")
	r := newRig(t, nil, nil)
	for _, target := range []string{fmt.Sprintf("[::1]:%d", port), fmt.Sprintf("[::1%%lo]:%d", port)} {
		conn := dialProxy(t, r)
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %[1]s\r\n\r\n", target)
		resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("CONNECT %s: %s, want 403", target, resp.Status)
		}
	}
}

// The NAT64 well-known prefix 64:ff9b::/96 (RFC 6052) carries an IPv4
// address in its last 32 bits; on a NAT64 network (an IPv6-only cloud
// subnet) a connection to it reaches that IPv4 address. The embedded
// address must pass the same ban, while public ones (DNS64 answers) pass.
// Deprecated site-local fec0::/10 is still routed on some LANs.
func TestNAT64AndSiteLocal(t *testing.T) {
	for _, s := range []string{
		"64:ff9b::7f00:1",    // 127.0.0.1
		"64:ff9b::a9fe:a9fe", // 169.254.169.254
		"64:ff9b::a00:1",     // 10.0.0.1
		"64:ff9b::c0a8:101",  // 192.168.1.1
		"fec0::1",
	} {
		if err := (Policy{}).CheckAddr("x", netip.MustParseAddr(s)); err == nil {
			t.Errorf("CheckAddr(%s) allowed", s)
		}
	}
	for _, s := range []string{"64:ff9b::5db8:d822", "2606:4700::1111"} {
		if err := (Policy{}).CheckAddr("x", netip.MustParseAddr(s)); err != nil {
			t.Errorf("CheckAddr(%s): %v", s, err)
		}
	}
	allow := Policy{AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	if err := allow.CheckAddr("x", netip.MustParseAddr("64:ff9b::a00:1")); err != nil {
		t.Errorf("server-allowed range via NAT64: %v", err)
	}
}

// A service on the host bound to every address (the server with
// HOST=0.0.0.0, a database firewalled only on eth0) must not be reachable
// from a sandbox through one of the host's own interface addresses that
// lies outside the banned ranges (a public address, say): traffic to it
// never leaves the host.
func TestHostOwnAddressRefused(t *testing.T) {
	port := hostService(t, ":0")
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var own []netip.Addr
	for _, ia := range ifAddrs {
		pre, err := netip.ParsePrefix(ia.String())
		if err != nil {
			continue
		}
		if (Policy{}).CheckAddr("x", pre.Addr()) == nil {
			own = append(own, pre.Addr())
		}
	}
	if len(own) == 0 {
		t.Skip("every address of this host is in a banned range")
	}
	d := &Dialer{Timeout: 2 * time.Second}
	for _, a := range own {
		c, err := d.Dial(context.Background(), Policy{}, a.String(), port)
		if err == nil {
			c.Close()
			t.Errorf("dial %s:%d reached a service on the host itself", a, port)
		}
	}
	// The server's own configuration may still allow it.
	for _, a := range own {
		p := Policy{AllowPrefixes: []netip.Prefix{netip.PrefixFrom(a, a.BitLen())}}
		c, err := d.Dial(context.Background(), p, a.String(), port)
		if err != nil {
			t.Errorf("dial %s allowed by EGRESS_ALLOW_PRIVATE: %v", a, err)
			continue
		}
		c.Close()
	}
}

// hostService listens on addr, a service of the host that sandboxes must
// not reach, and closes every connection it accepts; it returns its port.
// A test of an address family the host lacks is skipped.
func hostService(t *testing.T, addr string) int {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}
