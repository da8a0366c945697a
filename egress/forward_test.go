package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
)

// rawSite is a site that answers each request with whatever its handler
// writes, byte for byte, so tests control framing exactly.
type rawSite struct {
	ln       net.Listener
	accepted atomic.Int32
	mu       sync.Mutex // guards heads
	heads    []string   // each request's head as received
}

// siteHandler answers one request (its body already read); it returns
// false to close the connection.
type siteHandler func(req *http.Request, body string, w *bufio.Writer) bool

func newRawSite(t *testing.T, h siteHandler) *rawSite {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawSite{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				stop := make(chan struct{})
				defer close(stop)
				go func() {
					select {
					case <-stop:
					case <-t.Context().Done():
						c.Close()
					}
				}()
				br := bufio.NewReader(c)
				bw := bufio.NewWriter(c)
				for {
					head, err := readHead(br, nil)
					if err != nil {
						return
					}
					s.mu.Lock()
					s.heads = append(s.heads, string(head))
					s.mu.Unlock()
					req, err := http.ReadRequest(bufio.NewReader(io.MultiReader(strings.NewReader(string(head)), br)))
					if err != nil {
						return
					}
					body, _ := io.ReadAll(req.Body)
					keep := h(req, string(body), bw)
					if bw.Flush() != nil || !keep {
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *rawSite) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

func (s *rawSite) head(i int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.heads) {
		return ""
	}
	return s.heads[i]
}

// exchange is one request a test client writes raw and the response it
// expects.
type exchange struct {
	req    string // %s is replaced by the site's host:port
	method string // of the request, for reading the response
	status int
	body   string
	header map[string]string // response headers expected ("" = absent)
}

func TestForwarder(t *testing.T) {
	// The site's answers by path.
	handler := func(req *http.Request, body string, w *bufio.Writer) bool {
		switch req.URL.Path {
		case "/len":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello")
		case "/chunked-and-length":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
		case "/chunked":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 11\r\n\r\n")
		case "/head":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
			if req.Method != http.MethodHead {
				w.WriteString(strings.Repeat("x", 1000))
			}
		case "/304":
			fmt.Fprintf(w, "HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\n\r\n")
		case "/204":
			fmt.Fprintf(w, "HTTP/1.1 204 No Content\r\n\r\n")
		case "/close":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye")
			return false
		case "/eof":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\n\r\nuntil the end")
			return false
		case "/hints":
			fmt.Fprintf(w, "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		case "/echo":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Method: %s\r\n\r\n%s", len(body), req.Method, body)
		case "/count":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d", len(fmt.Sprint(len(body))), len(body))
		case "/hop":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Site-Private\r\nKeep-Alive: timeout=5\r\nX-Site-Private: 1\r\nContent-Length: 0\r\n\r\n")
		case "/big":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", 200<<10, strings.Repeat("b", 200<<10))
		case "/bad":
			fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc")
			return false
		default:
			fmt.Fprintf(w, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
		}
		return true
	}
	cases := []struct {
		name string
		ex   []exchange
		// siteConns is how many connections the site sees (0: not checked).
		siteConns int32
		// closed: the proxy closes the client connection after the last
		// exchange.
		closed bool
		check  func(t *testing.T, s *rawSite)
	}{
		{name: "content length, kept alive", ex: []exchange{
			{req: "GET http://%s/len HTTP/1.1\r\nHost: wrong.test\r\n\r\n", status: 200, body: "hello"},
			{req: "GET http://%s/len HTTP/1.1\r\n\r\n", status: 200, body: "hello"},
		}, siteConns: 1, check: func(t *testing.T, s *rawSite) {
			h := s.head(0)
			if !strings.HasPrefix(h, "GET /len HTTP/1.1\r\nHost: site.test:") || strings.Contains(h, "wrong.test") {
				t.Errorf("forwarded head %q", h)
			}
		}},
		{name: "chunked passes through with its trailer", ex: []exchange{
			{req: "GET http://%s/chunked HTTP/1.1\r\n\r\n", status: 200, body: "hello world"},
			{req: "GET http://%s/len HTTP/1.1\r\n\r\n", status: 200, body: "hello"},
		}, siteConns: 1},
		{name: "chunked wins over a length", ex: []exchange{
			{req: "GET http://%s/chunked-and-length HTTP/1.1\r\n\r\n", status: 200, body: "ok"},
			{req: "GET http://%s/len HTTP/1.1\r\n\r\n", status: 200, body: "hello"},
		}, siteConns: 1},
		{name: "chunked decoded for HTTP/1.0", ex: []exchange{
			{req: "GET http://%s/chunked HTTP/1.0\r\n\r\n", status: 200, body: "hello world", header: map[string]string{"Transfer-Encoding": "", "Connection": "close"}},
		}, closed: true},
		{name: "HEAD has no body", ex: []exchange{
			{req: "HEAD http://%s/head HTTP/1.1\r\n\r\n", method: "HEAD", status: 200, header: map[string]string{"Content-Length": "1000"}},
			{req: "GET http://%s/head HTTP/1.1\r\n\r\n", status: 200, body: strings.Repeat("x", 1000)},
		}, siteConns: 1},
		{name: "304 and 204 have no body", ex: []exchange{
			{req: "GET http://%s/304 HTTP/1.1\r\n\r\n", status: 304, header: map[string]string{"Etag": `"a"`}},
			{req: "GET http://%s/204 HTTP/1.1\r\n\r\n", status: 204},
			{req: "GET http://%s/len HTTP/1.1\r\n\r\n", status: 200, body: "hello"},
		}, siteConns: 1},
		{name: "site closes: the next request dials again", ex: []exchange{
			{req: "GET http://%s/close HTTP/1.1\r\n\r\n", status: 200, body: "bye", header: map[string]string{"Connection": ""}},
			{req: "GET http://%s/len HTTP/1.1\r\n\r\n", status: 200, body: "hello"},
		}, siteConns: 2},
		{name: "body until the site closes", ex: []exchange{
			{req: "GET http://%s/eof HTTP/1.1\r\n\r\n", status: 200, body: "until the end", header: map[string]string{"Connection": "close"}},
		}, closed: true},
		{name: "client asks to close", ex: []exchange{
			{req: "GET http://%s/len HTTP/1.1\r\nConnection: close\r\n\r\n", status: 200, body: "hello", header: map[string]string{"Connection": "close"}},
		}, closed: true, check: func(t *testing.T, s *rawSite) {
			if strings.Contains(strings.ToLower(s.head(0)), "connection") {
				t.Errorf("the client's Connection header reached the site: %q", s.head(0))
			}
		}},
		{name: "informational responses are passed on", ex: []exchange{
			{req: "GET http://%s/hints HTTP/1.1\r\n\r\n", status: 103, header: map[string]string{"Link": "</s.css>; rel=preload"}},
			{status: 200, body: "ok"},
		}},
		{name: "pipelined requests are answered in order", ex: []exchange{
			{req: "GET http://%s/len HTTP/1.1\r\n\r\nGET http://%[1]s/chunked HTTP/1.1\r\n\r\nHEAD http://%[1]s/head HTTP/1.1\r\n\r\n", status: 200, body: "hello"},
			{status: 200, body: "hello world"},
			{method: "HEAD", status: 200},
		}, siteConns: 1},
		{name: "request bodies", ex: []exchange{
			{req: "POST http://%s/echo HTTP/1.1\r\nContent-Length: 4\r\n\r\nping", status: 200, body: "ping", header: map[string]string{"X-Method": "POST"}},
			{req: "PUT http://%s/echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\npi\r\n3\r\nng!\r\n0\r\n\r\n", status: 200, body: "ping!"},
			{req: "POST http://%s/echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n", status: 100},
		}},
		{name: "large uploads", ex: []exchange{
			{req: "POST http://%s/count HTTP/1.1\r\nContent-Length: 300000\r\n\r\n" + strings.Repeat("u", 300000), status: 200, body: "300000"},
			{req: "POST http://%s/count HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n30000\r\n" + strings.Repeat("u", 0x30000) + "\r\n0\r\n\r\n", status: 200, body: fmt.Sprint(0x30000)},
			{req: "GET http://%s/len HTTP/1.1\r\n\r\n", status: 200, body: "hello"},
		}, siteConns: 1},
		{name: "hop-by-hop headers stay on their hop", ex: []exchange{
			{req: "GET http://%s/hop HTTP/1.1\r\nConnection: X-Client-Private\r\nX-Client-Private: 1\r\nProxy-Authorization: Basic eDp5\r\nKeep-Alive: 1\r\nTE: trailers, deflate\r\nX-End: 1\r\n\r\n",
				status: 200, header: map[string]string{"X-Site-Private": "", "Keep-Alive": "", "Connection": ""}},
		}, check: func(t *testing.T, s *rawSite) {
			h := s.head(0)
			for _, hop := range []string{"X-Client-Private", "Proxy-Authorization", "Keep-Alive", "Connection", "deflate"} {
				if strings.Contains(h, hop) {
					t.Errorf("%s reached the site: %q", hop, h)
				}
			}
			if !strings.Contains(h, "TE: trailers\r\n") || !strings.Contains(h, "X-End: 1\r\n") {
				t.Errorf("forwarded head %q", h)
			}
		}},
		{name: "body larger than the buffer", ex: []exchange{
			{req: "GET http://%s/big HTTP/1.1\r\n\r\n", status: 200, body: strings.Repeat("b", 200<<10)},
			{req: "GET http://%s/len HTTP/1.1\r\n\r\n", status: 200, body: "hello"},
		}, siteConns: 1},
		{name: "malformed response", ex: []exchange{
			{req: "GET http://%s/bad HTTP/1.1\r\n\r\n", status: 502, header: map[string]string{HeaderErrorCode: faults.CodeNavigationFailed}},
		}, closed: true},
		{name: "both lengths refused", ex: []exchange{
			{req: "POST http://%s/echo HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", status: 400, header: map[string]string{HeaderErrorCode: faults.CodeValidation}},
		}, closed: true, siteConns: -1},
		{name: "oversized head refused", ex: []exchange{
			{req: "GET http://%s/len HTTP/1.1\r\nX-Big: " + strings.Repeat("x", maxHeadBytes) + "\r\n\r\n", status: 431, header: map[string]string{HeaderErrorCode: faults.CodeValidation}},
		}, closed: true, siteConns: -1},
		{name: "not HTTP/1", ex: []exchange{
			{req: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", status: 505},
		}, closed: true, siteConns: -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			site := newRawSite(t, handler)
			r := newRig(t, nil, nil)
			conn := dialProxy(t, r)
			br := bufio.NewReader(conn)
			hostport := fmt.Sprintf("site.test:%d", site.port())
			for i, ex := range c.ex {
				if ex.req != "" {
					if _, err := fmt.Fprintf(conn, ex.req, hostport); err != nil {
						t.Fatal(err)
					}
				}
				method := ex.method
				if method == "" {
					method = "GET"
				}
				resp, err := http.ReadResponse(br, &http.Request{Method: method})
				if err != nil {
					t.Fatalf("exchange %d: %v", i, err)
				}
				body, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatalf("exchange %d: body: %v", i, err)
				}
				// Error answers are the proxy's own: their body is a message.
				if resp.StatusCode != ex.status || (resp.StatusCode >= 200 && resp.StatusCode < 400 && string(body) != ex.body) {
					t.Fatalf("exchange %d: %d %.80q, want %d %q", i, resp.StatusCode, body, ex.status, ex.body)
				}
				for k, v := range ex.header {
					got := resp.Header.Get(k)
					if k == "Connection" && resp.Close {
						got = "close"
					}
					if k == "Transfer-Encoding" && len(resp.TransferEncoding) > 0 {
						got = resp.TransferEncoding[0]
					}
					if got != v {
						t.Errorf("exchange %d: %s = %q, want %q", i, k, got, v)
					}
				}
			}
			if c.closed {
				_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := br.Read(make([]byte, 1)); err != io.EOF {
					t.Errorf("connection still open after the last exchange (%d, %v)", n, err)
				}
			}
			switch {
			case c.siteConns > 0 && site.accepted.Load() != c.siteConns:
				t.Errorf("site saw %d connections, want %d", site.accepted.Load(), c.siteConns)
			case c.siteConns < 0 && site.accepted.Load() != 0:
				t.Errorf("a refused request reached the site")
			}
			if c.check != nil {
				c.check(t, site)
			}
		})
	}
}

// TestForwarderLogs: every forwarded request is logged with its status,
// type, bytes and timings, and a connection a client reuses is not dialed
// again.
func TestForwarderLogs(t *testing.T) {
	site := newRawSite(t, func(req *http.Request, body string, w *bufio.Writer) bool {
		fmt.Fprintf(w, "HTTP/1.1 201 Created\r\nContent-Type: text/x-test\r\nContent-Length: 7\r\n\r\ncreated")
		return true
	})
	r := newRig(t, nil, nil)
	u := fmt.Sprintf("http://site.test:%d/x", site.port())
	for range 2 {
		resp, err := r.client.Post(u, "text/plain", strings.NewReader("abc"))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// An entry is finished just after its response's last byte is sent.
	var entries []Entry
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if entries = r.log.Entries(0); len(entries) == 2 && entries[1].Done {
			break
		}
	}
	if len(entries) != 2 {
		t.Fatalf("%d entries", len(entries))
	}
	for i, e := range entries {
		if e.Method != "POST" || e.URL != u || e.Status != 201 || e.MIME != "text/x-test" || e.Sent != 3 || e.Recv != 7 ||
			!e.Done || e.Error != nil || e.Scheme != "http" || e.Timings.Wait < 0 || e.Timings.Total < e.Timings.Wait {
			t.Errorf("entry %d: %+v", i, e)
		}
	}
	if entries[0].Timings.Connect < 0 || entries[1].Timings.Connect != -1 {
		t.Errorf("connect timings %v, %v: want the first dialed, the second reused", entries[0].Timings.Connect, entries[1].Timings.Connect)
	}
}

// TestForwarderRetriesClosedIdle: a site connection that the site closed
// while it sat idle, kept by the client's connection or in the pool, is
// replaced without the client seeing an error.
func TestForwarderRetriesClosedIdle(t *testing.T) {
	for _, keepAlive := range []bool{true, false} {
		t.Run(fmt.Sprintf("client keep-alive=%v", keepAlive), func(t *testing.T) {
			var n atomic.Int32
			site := newRawSite(t, func(req *http.Request, body string, w *bufio.Writer) bool {
				n.Add(1)
				fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return false // closes after answering, without saying so
			})
			r := newRig(t, nil, nil)
			r.client.Transport.(*http.Transport).DisableKeepAlives = !keepAlive
			u := fmt.Sprintf("http://site.test:%d/", site.port())
			for i := range 3 {
				st, body, _, err := get(t, r.client, u)
				if err != nil || st != 200 || body != "ok" {
					t.Fatalf("request %d: %d %q %v", i, st, body, err)
				}
				time.Sleep(20 * time.Millisecond) // the close reaches the proxy
			}
			if n.Load() != 3 || site.accepted.Load() != 3 {
				t.Errorf("site answered %d requests on %d connections", n.Load(), site.accepted.Load())
			}
		})
	}
}

// TestForwarderEarlyAnswer: a site that refuses an upload before reading
// it has its answer passed on, not replaced by a proxy error.
func TestForwarderEarlyAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	siteDone := make(chan struct{})
	go func() {
		defer close(siteDone)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		readHead(bufio.NewReader(c), nil)
		io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbig")
		c.(*net.TCPConn).CloseWrite()
		// Closing with the body unread resets the connection, as a site
		// that will not take an upload does.
		time.Sleep(200 * time.Millisecond)
		c.Close()
	}()
	r := newRig(t, nil, nil)
	conn := dialProxy(t, r)
	const size = 32 << 20 // more than the sockets on the way buffer
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		fmt.Fprintf(conn, "POST http://site.test:%d/upload HTTP/1.1\r\nContent-Length: %d\r\n\r\n", ln.Addr().(*net.TCPAddr).Port, size)
		io.Copy(conn, io.LimitReader(zeros{}, size)) // fails once the proxy closes
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: "POST"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || string(body) != "big" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	// The rest of the body will not be read: the connection ends.
	if n, err := conn.Read(make([]byte, 1)); err == nil {
		t.Errorf("connection still open (%d bytes)", n)
	}
	conn.Close()
	<-wrote
	<-siteDone
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// TestForwarderClientLeavesMidUpload: a client that goes away in the
// middle of its request body ends the exchange, and the site's connection,
// without an error blamed on the site.
func TestForwarderClientLeavesMidUpload(t *testing.T) {
	site := newRawSite(t, func(req *http.Request, body string, w *bufio.Writer) bool {
		fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
		return true
	})
	r := newRig(t, nil, nil)
	conn, err := net.Dial("tcp", r.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST http://site.test:%d/ HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s", site.port(), 1<<20, strings.Repeat("u", 10<<10))
	time.Sleep(50 * time.Millisecond)
	conn.Close()
	var entries []Entry
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if entries = r.log.Entries(0); len(entries) == 1 && entries[0].Done {
			break
		}
	}
	if len(entries) != 1 || !entries[0].Done || entries[0].Error != nil {
		t.Fatalf("entries %+v", entries)
	}
}

// TestForwarderUpgrade: a 101 answer turns the connection into a tunnel
// both ways, as a WebSocket over plain HTTP needs.
func TestForwarderUpgrade(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err.Error()
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		head, _ := readHead(br, nil)
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		line, _ := br.ReadString('\n')
		io.WriteString(c, "echo: "+line)
		done <- string(head)
	}()
	r := newRig(t, nil, nil)
	conn := dialProxy(t, r)
	fmt.Fprintf(conn, "GET http://site.test:%d/ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nhi\n", ln.Addr().(*net.TCPAddr).Port)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil || resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "echo" {
		t.Fatalf("%v %+v", err, resp)
	}
	line, err := br.ReadString('\n')
	if err != nil || line != "echo: hi\n" {
		t.Fatalf("tunnelled %q %v", line, err)
	}
	if h := <-done; !strings.Contains(h, "Upgrade: echo\r\n") || !strings.Contains(h, "Connection: Upgrade\r\n") {
		t.Errorf("forwarded head %q", h)
	}
}

// dialProxy connects to r's proxy with a deadline that bounds the test; the
// connection is closed at the test's end.
func dialProxy(t *testing.T, r *rig) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", r.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn
}
