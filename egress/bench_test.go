package egress

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// BenchmarkFetch measures a loopback HTTP fetch directly and through a
// sandbox's egress path (proxy, tunnel over a unix socket, server dialer),
// in the same run, for page-sized and larger bodies, with kept-alive and
// fresh connections. The ratio proxy/direct per case is the overhead.
//
//	go test -run XXX -bench Fetch -count 10 ./egress | benchstat -
func BenchmarkFetch(b *testing.B) {
	sizes := []int{16 << 10, 1 << 20}
	body := bytes.Repeat([]byte("x"), 1<<20)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(body[:n])
	}))
	defer site.Close()
	_, port, _ := net.SplitHostPort(site.Listener.Addr().String())
	r := newRig(b, nil, nil)
	for _, keep := range []bool{true, false} {
		for _, n := range sizes {
			for _, via := range []string{"direct", "proxy"} {
				name := fmt.Sprintf("keepalive=%v/size=%dKiB/%s", keep, n>>10, via)
				b.Run(name, func(b *testing.B) {
					tr := &http.Transport{DisableKeepAlives: !keep, MaxIdleConnsPerHost: 4}
					if via == "proxy" {
						tr.Proxy = http.ProxyURL(r.proxyURL)
					}
					defer tr.CloseIdleConnections()
					c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
					u := "http://site.test:" + port + "/?n=" + strconv.Itoa(n)
					if via == "direct" {
						u = site.URL + "/?n=" + strconv.Itoa(n)
					}
					b.SetBytes(int64(n))
					b.ResetTimer()
					for b.Loop() {
						resp, err := c.Get(u)
						if err != nil {
							b.Fatal(err)
						}
						if m, _ := io.Copy(io.Discard, resp.Body); m != int64(n) {
							b.Fatalf("read %d of %d", m, n)
						}
						resp.Body.Close()
					}
				})
			}
		}
	}
}
