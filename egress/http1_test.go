package egress

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/orchard/orchard/faults"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name   string
		head   string
		status int // 0: accepted
		check  func(t *testing.T, h *head)
	}{
		{"absolute-form GET", "GET http://site.test:8080/a?b=1 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n", 0, func(t *testing.T, h *head) {
			if h.method != "GET" || h.target != "http://site.test:8080/a?b=1" || h.minor != 1 || h.hasBody() || !h.persistent() {
				t.Errorf("%+v", h)
			}
			if len(h.fields) != 2 || h.fields[1] != (field{"Accept", "*/*"}) {
				t.Errorf("fields %+v", h.fields)
			}
		}},
		{"LF-only lines", "GET http://a/ HTTP/1.1\nHost: a\n\n", 0, nil},
		{"content length", "POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\n\r\n", 0, func(t *testing.T, h *head) {
			if h.contentLength != 5 || !h.hasBody() {
				t.Errorf("%+v", h)
			}
		}},
		{"repeated equal content length", "POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", 0, nil},
		{"chunked", "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 0, func(t *testing.T, h *head) {
			if !h.chunked || !h.hasBody() {
				t.Errorf("%+v", h)
			}
		}},
		{"connection close", "GET http://a/ HTTP/1.1\r\nConnection: close\r\n\r\n", 0, func(t *testing.T, h *head) {
			if h.persistent() {
				t.Error("persistent after Connection: close")
			}
		}},
		{"HTTP/1.0 ends after one exchange", "GET http://a/ HTTP/1.0\r\n\r\n", 0, func(t *testing.T, h *head) {
			if h.persistent() || h.minor != 0 {
				t.Errorf("%+v", h)
			}
		}},
		{"connection tokens are hop-by-hop", "GET http://a/ HTTP/1.1\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n\r\n", 0, func(t *testing.T, h *head) {
			if !h.hopByHop("x-secret") || !h.hopByHop("Keep-Alive") || h.hopByHop("Accept") || !h.persistent() {
				t.Errorf("%+v", h)
			}
		}},
		{"upgrade", "GET http://a/ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 0, func(t *testing.T, h *head) {
			if !h.upgrade {
				t.Error("not an upgrade")
			}
		}},
		{"expect 100-continue", "PUT http://a/ HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n", 0, func(t *testing.T, h *head) {
			if !h.expect100 {
				t.Error("expect100 not seen")
			}
		}},
		{"both lengths", "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400, nil},
		{"conflicting lengths", "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400, nil},
		{"signed length", "POST http://a/ HTTP/1.1\r\nContent-Length: +3\r\n\r\n", 400, nil},
		{"length list", "POST http://a/ HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n", 400, nil},
		{"gzip coding", "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, nil},
		{"chunked twice", "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 501, nil},
		{"chunked not last", "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 501, nil},
		{"TE in HTTP/1.0", "POST http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, nil},
		{"folded header", "GET http://a/ HTTP/1.1\r\nX-A: 1\r\n 2\r\n\r\n", 400, nil},
		{"space before colon", "GET http://a/ HTTP/1.1\r\nHost : a\r\n\r\n", 400, nil},
		{"no colon", "GET http://a/ HTTP/1.1\r\nHost\r\n\r\n", 400, nil},
		{"bare CR in value", "GET http://a/ HTTP/1.1\r\nX-A: 1\r2\r\n\r\n", 400, nil},
		{"NUL in value", "GET http://a/ HTTP/1.1\r\nX-A: 1\x002\r\n\r\n", 400, nil},
		{"HTTP/2", "PRI * HTTP/2.0\r\n\r\n", 505, nil},
		{"garbage line", "hello\r\n\r\n", 400, nil},
		{"space in target", "GET http://a/ b HTTP/1.1\r\n\r\n", 400, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var h head
			err := parseRequest(c.head, &h)
			if c.status == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if c.check != nil {
					c.check(t, &h)
				}
				return
			}
			f := faults.Of(err)
			if err == nil || statusOf(f) != c.status || f.Code != faults.CodeValidation {
				t.Fatalf("got %v (status %d), want %d", err, statusOf(f), c.status)
			}
		})
	}
}

func TestParseResponse(t *testing.T) {
	cases := []struct {
		name     string
		head     string
		method   string
		ok       bool
		bodyless bool
		reusable bool
	}{
		{"200 with length", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", "GET", true, false, true},
		{"no reason", "HTTP/1.1 204\r\n\r\n", "GET", true, true, true},
		{"HEAD has no body", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", "HEAD", true, true, true},
		{"304 has no body", "HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\n\r\n", "GET", true, true, true},
		{"1xx has no body", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", "GET", true, true, true},
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", "GET", true, false, false},
		{"HTTP/1.0 closes", "HTTP/1.0 200 OK\r\n\r\n", "GET", true, false, false},
		{"HTTP/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n", "GET", true, false, true},
		{"bad status", "HTTP/1.1 2x0 OK\r\n\r\n", "GET", false, false, false},
		{"bad version", "HTTP/2 200 OK\r\n\r\n", "GET", false, false, false},
		{"conflicting lengths", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 2\r\n\r\n", "GET", false, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var h head
			err := parseResponse(c.head, &h)
			if (err == nil) != c.ok {
				t.Fatalf("err %v", err)
			}
			if !c.ok {
				return
			}
			if h.bodyless(c.method) != c.bodyless || h.reusable() != c.reusable {
				t.Errorf("bodyless %v reusable %v", h.bodyless(c.method), h.reusable())
			}
		})
	}
}

func TestReadHead(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want string
		err  error
	}{
		{"one head", "GET / HTTP/1.1\r\nA: b\r\n\r\nbody", "GET / HTTP/1.1\r\nA: b\r\n\r\n", nil},
		{"leading empty lines", "\r\n\nGET / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\n\r\n", nil},
		{"nothing", "", "", io.EOF},
		{"cut short", "GET / HTTP/1.1\r\nA: b\r\n", "", io.ErrUnexpectedEOF},
		{"too large", "GET / HTTP/1.1\r\nA: " + strings.Repeat("x", maxHeadBytes) + "\r\n\r\n", "", errHeadTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A small buffer: lines longer than it arrive in pieces.
			br := bufio.NewReaderSize(strings.NewReader(c.in), 16)
			got, err := readHead(br, nil)
			if !errors.Is(err, c.err) || string(got) != c.want {
				t.Fatalf("got %q, %v; want %q, %v", got, err, c.want, c.err)
			}
		})
	}
}

func TestCopyChunked(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		encoded string // passed through; "" with err
		decoded string
		err     error
	}{
		{"two chunks", "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nNEXT", "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "abcde", nil},
		{"extensions and trailers", "3;x=1\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n", "3;x=1\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n", "abc", nil},
		{"upper-case hex", "A\r\n0123456789\r\n0\r\n\r\n", "A\r\n0123456789\r\n0\r\n\r\n", "0123456789", nil},
		{"empty", "0\r\n\r\n", "0\r\n\r\n", "", nil},
		{"no size", "\r\nabc\r\n0\r\n\r\n", "", "", errBadChunk},
		{"bad size", "x\r\nabc\r\n0\r\n\r\n", "", "", errBadChunk},
		{"junk after size", "3 x\r\nabc\r\n0\r\n\r\n", "", "", errBadChunk},
		{"data longer than size", "2\r\nabc\r\n0\r\n\r\n", "", "", errBadChunk},
		{"LF-only size line", "3\nabc\r\n0\r\n\r\n", "", "", errBadChunk},
		{"overflow", "fffffffffffffffff\r\n", "", "", errBadChunk},
		{"cut short", "5\r\nab", "", "", io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, decode := range []bool{false, true} {
				var out bytes.Buffer
				bw := bufio.NewWriter(&out)
				src := bufio.NewReaderSize(strings.NewReader(c.in), 16)
				n, err := copyChunked(bw, src, decode)
				bw.Flush()
				if !errors.Is(err, c.err) {
					t.Fatalf("decode=%v: err %v, want %v", decode, err, c.err)
				}
				if err != nil {
					continue
				}
				want := c.encoded
				if decode {
					want = c.decoded
				}
				if out.String() != want || n != int64(len(c.decoded)) {
					t.Errorf("decode=%v: wrote %q (%d data bytes), want %q", decode, out.String(), n, want)
				}
				if rest, _ := io.ReadAll(src); strings.HasSuffix(c.in, "NEXT") && string(rest) != "NEXT" {
					t.Errorf("read past the body: left %q", rest)
				}
			}
		})
	}
}

func TestSplitTarget(t *testing.T) {
	cases := []struct {
		target, scheme, authority, path string
		ok                              bool
	}{
		{"http://a.test/x?y", "http", "a.test", "/x?y", true},
		{"http://a.test", "http", "a.test", "/", true},
		{"http://a.test?q=1", "http", "a.test", "/?q=1", true},
		{"http://user:pw@a.test:81/p#frag", "http", "a.test:81", "/p", true},
		{"HTTP://[::1]:8080/", "HTTP", "[::1]:8080", "/", true},
		{"https://a.test/", "https", "a.test", "/", true},
		{"http:///x", "", "", "", false},
		{"a.test/x", "", "", "", false},
	}
	for _, c := range cases {
		s, a, p, ok := splitTarget(c.target)
		if ok != c.ok || (ok && (s != c.scheme || a != c.authority || p != c.path)) {
			t.Errorf("%q: %q %q %q %v", c.target, s, a, p, ok)
		}
	}
}

func TestStatusOfFixedStatus(t *testing.T) {
	err := headError(http.StatusRequestHeaderFieldsTooLarge, "x")
	if st := statusOf(faults.Of(err)); st != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d", st)
	}
}
