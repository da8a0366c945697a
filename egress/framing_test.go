package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingSite accepts one connection and records every byte it gets; it
// never answers.
func recordingSite(t *testing.T) (port int, got func() string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var buf strings.Builder
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-t.Context().Done():
			case <-stop:
			}
			c.Close()
		}()
		b := make([]byte, 4096)
		for {
			n, err := c.Read(b)
			mu.Lock()
			buf.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
}

// A request body the proxy cannot forward is answered at once, not left
// waiting on a site that waits for the rest of it; a trailer is held to
// a header line's rules, since a bare CR (which some parsers take for a
// line end) would end the trailers early for the site and start a
// request there.
func TestMalformedChunkedBodyAnswered(t *testing.T) {
	for _, tc := range []struct{ name, body, never string }{
		{"bad chunk size", "zz\r\n", ""},
		{"bare CR in a trailer", "1\r\nx\r\n0\r\nX: a\r\r\nGET /smuggled HTTP/1.1\r\nHost: site.test\r\n\r\n", "/smuggled"},
		{"folded trailer", "1\r\nx\r\n0\r\nX: a\r\n b\r\n\r\n", " b\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, got := recordingSite(t)
			r := newRig(t, nil, nil)
			conn := dialProxy(t, r)
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(conn, "POST http://site.test:%d/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%s", port, tc.body)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", resp.StatusCode)
			}
			if s := got(); tc.never != "" && strings.Contains(s, tc.never) {
				t.Fatalf("the site received %q: %q", tc.never, s)
			}
		})
	}
}

// Bytes a site sends behind a complete response answer no request: the
// connection is not kept for the next one, which would take them for its
// answer.
func TestSurplusBytesNotNextResponse(t *testing.T) {
	site := newRawSite(t, func(req *http.Request, body string, w *bufio.Writer) bool {
		switch req.URL.Path {
		case "/a":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nA"+
				"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")
		default:
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal")
		}
		return true
	})
	r := newRig(t, nil, nil)
	conn := dialProxy(t, r)
	br := bufio.NewReader(conn)
	var got []string
	for _, path := range []string{"/a", "/b"} {
		fmt.Fprintf(conn, "GET http://site.test:%d%s HTTP/1.1\r\n\r\n", site.port(), path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		got = append(got, string(b))
	}
	if got[0] != "A" || got[1] != "real" {
		t.Fatalf("answers %q, want [A real]", got)
	}
}

// A client that gives up on a request the site has not answered yet (a
// browser navigating away from a hanging site) does not leave the proxy
// holding the site connection, and its goroutine, until the site answers,
// which may be never.
func TestClientGoneBeforeResponseHead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gotHead := make(chan struct{})
	siteClosed := make(chan struct{})
	hold := make(chan struct{})
	defer close(hold)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := readHead(br, nil); err != nil {
			return
		}
		close(gotHead)
		go func() { <-hold; c.Close() }()
		_, _ = br.ReadByte() // never answers; returns when the proxy closes its end
		close(siteClosed)
	}()
	r := newRig(t, nil, nil)
	conn := dialProxy(t, r)
	fmt.Fprintf(conn, "GET http://site.test:%d/hang HTTP/1.1\r\n\r\n", ln.Addr().(*net.TCPAddr).Port)
	select {
	case <-gotHead:
	case <-time.After(5 * time.Second):
		t.Fatal("request never reached the site")
	}
	conn.Close()
	select {
	case <-siteClosed:
	case <-time.After(3 * time.Second):
		t.Fatal("the client left 3 s ago and the proxy still holds the site connection")
	}
}

// A site slow enough that the proxy began watching the client still
// answers through it, and the client's connection carries the next
// request: the watch leaves no deadline or error behind.
func TestSlowAnswerAfterWatch(t *testing.T) {
	site := newRawSite(t, func(req *http.Request, body string, w *bufio.Writer) bool {
		if req.URL.Path == "/slow" {
			time.Sleep(watchAfter + 200*time.Millisecond)
		}
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(req.URL.Path), req.URL.Path)
		return true
	})
	r := newRig(t, nil, nil)
	conn := dialProxy(t, r)
	br := bufio.NewReader(conn)
	for _, path := range []string{"/slow", "/next", "/slow", "/last"} {
		fmt.Fprintf(conn, "GET http://site.test:%d%s HTTP/1.1\r\n\r\n", site.port(), path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != path {
			t.Fatalf("%s: %d %q", path, resp.StatusCode, b)
		}
	}
	if n := site.accepted.Load(); n != 1 {
		t.Fatalf("%d site connections, want the one kept alive", n)
	}
}
