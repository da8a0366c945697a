package egress

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/inject"
	"github.com/orchard/orchard/sitehealth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPolicy(t *testing.T) {
	allowLoop := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	cases := []struct {
		name  string
		p     Policy
		host  string
		ip    string
		code  string // "" = allowed
		phase string
	}{
		{"any host when no list", Policy{}, "example.com", "93.184.216.34", "", ""},
		{"exact allowed", Policy{Allow: []string{"example.com"}}, "Example.COM.", "93.184.216.34", "", ""},
		{"exact refuses sub", Policy{Allow: []string{"example.com"}}, "www.example.com", "", faults.CodeEgressDenied, "host"},
		{"wildcard sub", Policy{Allow: []string{"*.wikipedia.org"}}, "en.wikipedia.org", "1.1.1.1", "", ""},
		{"wildcard apex", Policy{Allow: []string{"*.wikipedia.org"}}, "wikipedia.org", "1.1.1.1", "", ""},
		{"wildcard suffix trick", Policy{Allow: []string{"*.wikipedia.org"}}, "evilwikipedia.org", "", faults.CodeEgressDenied, "host"},
		{"pattern with a trailing dot", Policy{Allow: []string{"Example.com."}}, "example.com", "93.184.216.34", "", ""},
		{"wildcard with a trailing dot", Policy{Allow: []string{"*.example.com."}}, "a.example.com.", "93.184.216.34", "", ""},
		{"loopback", Policy{}, "localhost", "127.0.0.1", faults.CodeEgressPrivate, "addr"},
		{"loopback v6", Policy{}, "x", "::1", faults.CodeEgressPrivate, "addr"},
		{"mapped v4 loopback", Policy{}, "x", "::ffff:127.0.0.1", faults.CodeEgressPrivate, "addr"},
		{"metadata", Policy{}, "x", "169.254.169.254", faults.CodeEgressPrivate, "addr"},
		{"rfc1918", Policy{}, "x", "10.1.2.3", faults.CodeEgressPrivate, "addr"},
		{"cgnat", Policy{}, "x", "100.64.0.1", faults.CodeEgressPrivate, "addr"},
		{"ula", Policy{}, "x", "fd00::1", faults.CodeEgressPrivate, "addr"},
		{"server allows loopback", Policy{AllowPrefixes: allowLoop}, "x", "127.0.0.5", "", ""},
		{"server allowance is exact", Policy{AllowPrefixes: allowLoop}, "x", "10.0.0.1", faults.CodeEgressPrivate, "addr"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.p.CheckHost(c.host)
			if err == nil && c.ip != "" {
				err = c.p.CheckAddr(c.host, netip.MustParseAddr(c.ip))
			}
			if c.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			f := faults.Of(err)
			if err == nil || f.Code != c.code || f.Source != faults.Policy || f.Retryable {
				t.Fatalf("got %v (%+v), want %s from policy", err, f, c.code)
			}
		})
	}
}

func TestValidatePatterns(t *testing.T) {
	for _, ok := range []string{"example.com", "*.example.com", "localhost", "example.com.", "*.example.com."} {
		if err := ValidatePatterns([]string{ok}); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "*", "a/b", "http://x", "x:80", "*.*.x", "a..b", "ex?mple.com", "[a-z].com", `a\.com`, "."} {
		if err := ValidatePatterns([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// rig is an agent and a server joined by a real tunnel over a unix socket:
// the proxy listens on loopback and dials through the hub's dialer.
type rig struct {
	proxyURL *url.URL
	log      *Log
	client   *http.Client
}

func newRig(t testing.TB, allow []string, plan *faults.Plan) *rig {
	t.Helper()
	return newRigRelay(t, allow, plan, false)
}

// newRigRelay is newRig whose server keeps every connection on the
// tunnel's streams when relayOnly is set.
func newRigRelay(t testing.TB, allow []string, plan *faults.Plan, relayOnly bool) *rig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sock := filepath.Join(t.TempDir(), "agent.sock")
	agentLn, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tun := NewTunnel(5 * time.Second)
	agentSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto := TunnelProtocol
		if r.Header.Get("Upgrade") == SocketProtocol {
			proto = SocketProtocol
		}
		conn, err := AcceptUpgrade(w, r, proto)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		if proto == SocketProtocol {
			_ = tun.AttachSockets(conn)
			return
		}
		_ = tun.Attach(conn)
	})}
	go agentSrv.Serve(agentLn)

	d := &Dialer{AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Hosts: testHosts("site", "status", "dns", "reset", "slow"), Timeout: 3 * time.Second}
	hub := NewHub(d, func(ctx context.Context, addr string) (net.Conn, http.Header, error) {
		var nd net.Dialer
		c, err := nd.DialContext(ctx, "unix", addr)
		return c, nil, err
	}, nil)
	hub.relayOnly = relayOnly
	hub.Attach("sb", sock, allow)

	log := NewLog(100)
	px := NewProxy(tun.Dial, log, inject.New(plan, 1), nil)
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = px.Serve(ctx, pln) }()
	pu, _ := url.Parse("http://" + pln.Addr().String())
	tr := &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		cancel()
		<-served
		hub.Close()
		tun.Close()
		agentSrv.Close()
	})
	return &rig{proxyURL: pu, log: log, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

func testHosts(names ...string) map[string]netip.Addr {
	m := map[string]netip.Addr{}
	for _, n := range names {
		m[n+".test"] = netip.MustParseAddr("127.0.0.1")
	}
	return m
}

func site(t *testing.T, tlsOn bool) (*httptest.Server, string) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	})
	var s *httptest.Server
	if tlsOn {
		s = httptest.NewTLSServer(h)
	} else {
		s = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	_, port, _ := net.SplitHostPort(s.Listener.Addr().String())
	return s, port
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header, error) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, nil
}

func TestProxyThroughTunnel(t *testing.T) {
	_, port := site(t, false)
	_, tport := site(t, true)
	r := newRig(t, []string{"site.test", "127.0.0.1"}, nil)

	st, body, _, err := get(t, r.client, "http://site.test:"+port+"/a")
	if err != nil || st != 200 || body != "hello /a" {
		t.Fatalf("plain http: %d %q %v", st, body, err)
	}
	st, body, _, err = get(t, r.client, "https://site.test:"+tport+"/b")
	if err != nil || st != 200 || body != "hello /b" {
		t.Fatalf("https via CONNECT: %d %q %v", st, body, err)
	}
	cases := []struct {
		name, url, code string
		status          int
	}{
		{"not on allow-list", "http://other.test:" + port + "/", faults.CodeEgressDenied, 403},
		{"refused port", "http://127.0.0.1:1/", faults.CodeSiteConnectionRefused, 502},
		{"nxdomain", "http://no-such-host.invalid/", faults.CodeEgressDenied, 403},
	}
	for _, c := range cases {
		st, _, h, err := get(t, r.client, c.url)
		if err != nil || st != c.status || h.Get(HeaderErrorCode) != c.code {
			t.Errorf("%s: status %d code %q err %v; want %d %s", c.name, st, h.Get(HeaderErrorCode), err, c.status, c.code)
		}
	}
	// A kept-alive tunnel is logged when it closes.
	r.client.Transport.(*http.Transport).CloseIdleConnections()
	var entries []Entry
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if entries = r.log.Entries(0); len(entries) == 5 && entries[1].Done {
			break
		}
	}
	if len(entries) != 5 {
		t.Fatalf("log has %d entries, want 5: %+v", len(entries), entries)
	}
	first := entries[0]
	if first.Host != "site.test" || first.Status != 200 || first.Recv == 0 || !first.Done || first.Scheme != "http" {
		t.Errorf("first entry %+v", first)
	}
	tunnel := entries[1]
	if tunnel.Method != "CONNECT" || tunnel.Status != 200 || tunnel.Recv == 0 || tunnel.Sent == 0 {
		t.Errorf("tunnel entry %+v", tunnel)
	}
	if e := entries[2]; e.Error == nil || e.Error.Code != faults.CodeEgressDenied {
		t.Errorf("denied entry %+v", e)
	}
	har := HAR(entries, "orchard")
	b, _ := json.Marshal(har)
	if !strings.Contains(string(b), `"version":"1.2"`) || strings.Count(string(b), `"startedDateTime"`) != 5 {
		t.Errorf("HAR: %s", b)
	}
}

func TestDialClassifiesDNSByEvidence(t *testing.T) {
	d := &Dialer{Timeout: 2 * time.Second}
	_, err := d.Dial(context.Background(), Policy{}, "no-such-host.invalid", 80)
	if f := faults.Of(err); f.Code != faults.CodeSiteDNS || f.Source != faults.Site {
		t.Errorf("nxdomain: %+v", f)
	}
	// A resolver that cannot answer is the network's fault.
	d.Resolver = failingResolver{}
	_, err = d.Dial(context.Background(), Policy{}, "example.com", 80)
	if f := faults.Of(err); f.Code != faults.CodeNetworkDNS || f.Source != faults.Network || !f.Retryable {
		t.Errorf("resolver down: %+v", f)
	}
	// A public name that resolves to a private address is refused.
	d.Resolver = nil
	d.Hosts = map[string]netip.Addr{"rebind.test": netip.MustParseAddr("10.0.0.1")}
	_, err = d.Dial(context.Background(), Policy{}, "rebind.test", 80)
	if f := faults.Of(err); f.Code != faults.CodeEgressPrivate {
		t.Errorf("rebind: %+v", f)
	}
}

type failingResolver struct{}

func (failingResolver) LookupNetIP(ctx context.Context, _, host string) ([]netip.Addr, error) {
	return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
}

func TestInjectedNetworkFaults(t *testing.T) {
	_, port := site(t, false)
	_, tport := site(t, true)
	plan := &faults.Plan{Faults: []faults.Injection{
		{Kind: faults.InjectHTTPStatus, P: 1, Match: "status.test", Status: 503},
		{Kind: faults.InjectDNSFailure, P: 1, Match: "dns.test"},
		{Kind: faults.InjectConnectionReset, P: 1, Match: "reset.test"},
		{Kind: faults.InjectLatency, P: 1, Match: "slow.test", LatencyMS: 300},
	}}
	if err := plan.Validate(); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, nil, plan)
	cases := []struct {
		url      string
		status   int
		code     string
		wantErr  bool
		minDelay time.Duration
	}{
		{"http://status.test:" + port + "/", 503, faults.CodeSiteHTTPPrefix + "503", false, 0},
		{"https://status.test:" + tport + "/", 0, faults.CodeSiteHTTPPrefix + "503", true, 0},
		{"http://dns.test:" + port + "/", 502, faults.CodeSiteDNS, false, 0},
		{"https://dns.test:" + tport + "/", 0, faults.CodeSiteDNS, true, 0},
		{"http://reset.test:" + port + "/", 0, faults.CodeSiteConnectionReset, true, 0},
		{"https://reset.test:" + tport + "/", 0, faults.CodeSiteConnectionReset, true, 0},
	}
	for _, c := range cases {
		since := time.Now()
		st, _, _, err := get(t, r.client, c.url)
		if (err != nil) != c.wantErr || (!c.wantErr && st != c.status) {
			t.Errorf("%s: status %d err %v", c.url, st, err)
		}
		u, _ := url.Parse(c.url)
		e, ok := r.log.Evidence(u.Hostname(), since)
		if !ok || e.Injected == nil || e.Error == nil || e.Error.Code != c.code || e.Injected.Code != c.code {
			t.Errorf("%s: evidence %+v (ok %v), want error and truth %s", c.url, e, ok, c.code)
		}
	}
	// Latency delays a matching host only, and the fetch succeeds.
	start := time.Now()
	st, _, _, err := get(t, r.client, "http://slow.test:"+port+"/")
	if err != nil || st != 200 || time.Since(start) < 300*time.Millisecond {
		t.Errorf("slow.test: %d %v after %v", st, err, time.Since(start))
	}
	if e, ok := r.log.Evidence("slow.test", start); !ok || e.Injected == nil || e.Injected.Kind != faults.InjectLatency || e.Error != nil {
		t.Errorf("slow.test evidence %+v", e)
	}
	start = time.Now()
	st, _, _, err = get(t, r.client, "http://site.test:"+port+"/")
	if err != nil || st != 200 || time.Since(start) > 250*time.Millisecond {
		t.Errorf("unmatched host was delayed or failed: %d %v %v", st, err, time.Since(start))
	}
}

func TestTunnelDownIsClassified(t *testing.T) {
	tun := NewTunnel(50 * time.Millisecond)
	defer tun.Close()
	_, err := tun.Dial(context.Background(), "example.com", 80)
	if f := faults.Of(err); f.Code != faults.CodeEgressUnavailable || !f.Retryable {
		t.Fatalf("%+v", f)
	}
	if !errors.Is(err, err) {
		t.Fatal()
	}
}

// A host that refuses connections opens its breaker: later dials fail at
// once with site.unavailable instead of reaching it.
func TestDialerBreaker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // refused from now on
	tr, err := sitehealth.New(sitehealth.NewMemory(), sitehealth.Config{FailureThreshold: 3, OpenFor: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &Dialer{Gate: tr, Hosts: testHosts("down"), Timeout: 2 * time.Second}
	p := Policy{AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	for i := range 3 {
		if _, err := d.Dial(context.Background(), p, "down.test", port); !faults.Is(err, faults.CodeSiteConnectionRefused) {
			t.Fatalf("dial %d: %v", i, err)
		}
	}
	_, err = d.Dial(context.Background(), p, "down.test", port)
	if f := faults.Of(err); f.Code != faults.CodeSiteUnavailable || f.Source != faults.Site || !f.Retryable {
		t.Fatalf("open breaker: %+v", f)
	}
	st, _ := tr.Status(context.Background())
	if len(st) != 1 || st[0].Host != "down.test" || st[0].State != sitehealth.Open {
		t.Fatalf("status %+v", st)
	}
	// Policy refusals never count against a site.
	_, err = d.Dial(context.Background(), Policy{}, "down.test", port)
	if !faults.Is(err, faults.CodeEgressPrivate) {
		t.Fatalf("policy: %v", err)
	}
}
