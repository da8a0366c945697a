package egress

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// FuzzRequestFramingAgreesWithNetHTTP: a request head the forwarder
// accepts frames its body as net/http's parser does (same method, same
// chunked or length), and net/http never refuses the forwarder's accepted
// head over its framing. A difference there is how a request smuggled past
// a proxy starts. The forwarder may refuse more than net/http.
//
//	go test -run XXX -fuzz FuzzRequestFramingAgreesWithNetHTTP -fuzztime 60s ./egress
func FuzzRequestFramingAgreesWithNetHTTP(f *testing.F) {
	for _, s := range []string{
		"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: +5\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 05\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding : chunked\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding:\tchunked\r\n\r\n",
		"POST http://a.test/x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: Chunked\r\n\r\n",
		"POST http://a.test/x HTTP/1.0\r\nHost: a.test\r\nContent-Length: 3\r\n\r\n",
		"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n folded\r\n\r\n",
		"GET http://a.test/ HTTP/1.1\nHost: a.test\n\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		br := bufio.NewReader(strings.NewReader(raw))
		headBytes, err := readHead(br, nil)
		if err != nil {
			return
		}
		var h head
		if err := parseRequest(string(headBytes), &h); err != nil {
			return
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(headBytes)))
		if err != nil {
			msg := strings.ToLower(err.Error())
			for _, w := range []string{"content-length", "transfer-encoding", "chunked", "transfer encoding"} {
				if strings.Contains(msg, w) {
					t.Fatalf("accepted a head net/http refuses over its framing (%v):\n%q", err, headBytes)
				}
			}
			return
		}
		if req.Method != h.method {
			t.Fatalf("method %q, net/http %q:\n%q", h.method, req.Method, headBytes)
		}
		netChunked := len(req.TransferEncoding) > 0 && req.TransferEncoding[len(req.TransferEncoding)-1] == "chunked"
		if h.chunked != netChunked {
			t.Fatalf("chunked %v, net/http %v (%q):\n%q", h.chunked, netChunked, req.TransferEncoding, headBytes)
		}
		if !h.chunked {
			want := req.ContentLength
			got := max(h.contentLength, 0)
			if want != got {
				t.Fatalf("length %d, net/http %d:\n%q", got, want, headBytes)
			}
		}
	})
}
