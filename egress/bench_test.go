package egress

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"testing"
	"time"
)

// BenchmarkFetch measures a loopback HTTP fetch directly and through a
// sandbox's egress path (proxy, server dialer, and either the socket
// channel or the tunnel's streams over a unix socket), in the same run,
// for page-sized and larger bodies, with kept-alive and fresh connections.
// The ratio proxy/direct per case is the overhead; relay is the path
// without the socket channel; pod is the proxy dialing the site itself, as
// a sandbox on Kubernetes does (one hop). connect=true sends the fetch through a
// CONNECT tunnel, as HTTPS goes (without TLS, whose cost would hide the
// proxy's).
//
//	go test -run XXX -bench Fetch -benchtime 200x -count 6 ./egress | benchstat -
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
	rigs := map[string]*rig{"proxy": newRig(b, nil, nil), "relay": newRigRelay(b, nil, nil, true), "pod": newRigPod(b)}
	for _, connect := range []bool{false, true} {
		for _, keep := range []bool{true, false} {
			for _, n := range sizes {
				for _, via := range []string{"direct", "relay", "proxy", "pod"} {
					if connect && via == "direct" {
						continue
					}
					name := fmt.Sprintf("keepalive=%v/size=%dKiB/%s", keep, n>>10, via)
					if connect {
						name = "connect=true/" + name
					}
					b.Run(name, func(b *testing.B) {
						tr := &http.Transport{DisableKeepAlives: !keep, MaxIdleConnsPerHost: 4}
						u := "http://site.test:" + port + "/?n=" + strconv.Itoa(n)
						switch {
						case via == "direct":
							u = site.URL + "/?n=" + strconv.Itoa(n)
						case connect:
							tr.DialContext = connectDialer(rigs[via].proxyURL.Host)
						default:
							tr.Proxy = http.ProxyURL(rigs[via].proxyURL)
						}
						defer tr.CloseIdleConnections()
						c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
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
}

// connectDialer dials through the proxy at proxy with CONNECT.
func connectDialer(proxy string) func(ctx context.Context, _, addr string) (net.Conn, error) {
	return func(ctx context.Context, _, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", proxy)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err == nil && (resp.StatusCode != 200 || br.Buffered() > 0) {
			err = fmt.Errorf("CONNECT %s: %s", addr, resp.Status)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// newRigPod is the proxy of a sandbox that dials from inside (Kubernetes,
// --egress-direct): the same proxy and dialer, no server between them.
func newRigPod(b *testing.B) *rig {
	d := &Dialer{AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Hosts: testHosts("site"), Timeout: 3 * time.Second}
	px := NewProxy(func(ctx context.Context, host string, port int) (net.Conn, error) {
		return d.Dial(ctx, Policy{AllowPrefixes: d.AllowPrefixes}, host, port)
	}, NewLog(100), nil, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); _ = px.Serve(ctx, ln) }()
	b.Cleanup(func() { cancel(); <-served })
	return &rig{proxyURL: &url.URL{Scheme: "http", Host: ln.Addr().String()}}
}
