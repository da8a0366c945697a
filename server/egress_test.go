package server_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// egressServer is a server whose sandboxes reach a "site" on the host's
// loopback by name: the server allows exactly 127.0.0.1, so loop.test
// (127.0.0.2) stands for every private address a sandbox must not reach.
func egressServer(t *testing.T) (*testserver.Server, string) {
	t.Helper()
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<html><head><title>site %s</title></head><body>hello from %s</body></html>", r.Host, r.URL.Path)
	}))
	t.Cleanup(site.Close)
	_, port, _ := net.SplitHostPort(site.Listener.Addr().String())
	hosts := map[string]netip.Addr{}
	for _, h := range []string{"site.test", "other.test", "dns.fault.test", "reset.fault.test", "status.fault.test"} {
		hosts[h] = netip.MustParseAddr("127.0.0.1")
	}
	hosts["loop.test"] = netip.MustParseAddr("127.0.0.2")
	srv := testserver.Start(t, testserver.Options{Egress: &egress.Dialer{
		Hosts: hosts, AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}})
	return srv, port
}

func TestEgressFromExec(t *testing.T) {
	srv, port := egressServer(t)
	id := createReady(t, srv, map[string]any{"block_network": false,
		"egress": map[string]any{"allow": []string{"site.test", "loop.test", "10.1.2.3"}}})

	curl := func(url string) string {
		j := execWait(t, srv, id, map[string]any{"command": "curl -s -o /dev/null -w '%{http_code} %header{x-orchard-error-code}' --max-time 20 " + url + "; echo \" exit=$?\""})
		return strings.TrimSpace(j.Stdout)
	}
	cases := []struct{ name, url, want string }{
		{"allowed host", "http://site.test:" + port + "/x", "200  exit=0"},
		{"not on the allow-list", "http://other.test:" + port + "/", "403 " + faults.CodeEgressDenied + " exit=0"},
		{"allowed name on a loopback address", "http://loop.test:" + port + "/", "403 " + faults.CodeEgressPrivate + " exit=0"},
		{"private literal", "http://10.1.2.3/", "403 " + faults.CodeEgressPrivate + " exit=0"},
	}
	for _, c := range cases {
		if got := curl(c.url); got != c.want {
			t.Errorf("%s: curl %s → %q, want %q", c.name, c.url, got, c.want)
		}
	}
	// CONNECT to a refused host fails the tunnel; curl reports its status.
	j := execWait(t, srv, id, map[string]any{"command": "curl -s -o /dev/null -w '%{http_connect}' https://other.test:" + port + "/; echo \" exit=$?\""})
	if got := strings.TrimSpace(j.Stdout); got != "403 exit=56" {
		t.Errorf("CONNECT to a refused host: %q", got)
	}
	// Every spelling of the proxy variables is set.
	j = execWait(t, srv, id, map[string]any{"command": "env | grep -i _proxy= | sort"})
	for _, k := range []string{"HTTP_PROXY=", "HTTPS_PROXY=", "NO_PROXY=", "http_proxy=", "https_proxy=", "no_proxy="} {
		if !strings.Contains(j.Stdout, k) {
			t.Errorf("exec env lacks %s: %s", k, j.Stdout)
		}
	}

	r := call(t, srv, "GET", "/sandboxes/"+id+"/network", nil)
	want(t, r, 200)
	var log struct {
		Entries []egress.Entry `json:"entries"`
	}
	if err := json.Unmarshal(r.raw, &log); err != nil {
		t.Fatal(err)
	}
	if len(log.Entries) != 5 {
		t.Fatalf("log has %d entries, want 5: %s", len(log.Entries), r.raw)
	}
	ok := log.Entries[0]
	if ok.Host != "site.test" || ok.Status != 200 || ok.Recv == 0 || ok.Error != nil || ok.Timings.Total <= 0 {
		t.Errorf("allowed entry: %+v", ok)
	}
	for i, code := range []string{faults.CodeEgressDenied, faults.CodeEgressPrivate, faults.CodeEgressPrivate, faults.CodeEgressDenied} {
		if e := log.Entries[i+1]; e.Error == nil || e.Error.Code != code || e.Error.Source != faults.Policy {
			t.Errorf("entry %d: %+v, want %s", i+1, e, code)
		}
	}
	har := call(t, srv, "GET", "/sandboxes/"+id+"/network?format=har", nil)
	want(t, har, 200)
	if l, _ := har.body["log"].(map[string]any); l == nil || l["version"] != "1.2" || len(l["entries"].([]any)) != 5 {
		t.Errorf("HAR: %s", har.raw)
	}

	// A sandbox without network has no proxy and says so.
	closed := createReady(t, srv, nil)
	r = call(t, srv, "GET", "/sandboxes/"+closed+"/network", nil)
	if r.status != 400 || !strings.Contains(string(r.raw), faults.CodeNetworkEgressOff) {
		t.Errorf("network log of a closed sandbox: %d %s", r.status, r.raw)
	}
	// An allow-list needs network.
	r = call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "egress": map[string]any{"allow": []string{"x.com"}}})
	if r.status != 400 {
		t.Errorf("allow-list with block_network: %d %s", r.status, r.raw)
	}
	r = call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": false, "egress": map[string]any{"allow": []string{"http://x.com"}}})
	if r.status != 400 {
		t.Errorf("bad pattern: %d %s", r.status, r.raw)
	}
}

func TestEgressFromBrowser(t *testing.T) {
	testenv.RequireChromium(t)
	srv, port := egressServer(t)
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": false, "kind": "browser",
		"egress": map[string]any{"allow": []string{"site.test", "*.fault.test"}},
		"faults": map[string]any{"faults": []map[string]any{
			{"kind": "dns_failure", "p": 1, "match": "dns.fault.test"},
			{"kind": "connection_reset", "p": 1, "match": "reset.fault.test"},
			{"kind": "http_status", "p": 1, "match": "status.fault.test", "status": 502},
		}}})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	if w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=120", nil); w.body["status"] != "ready" {
		t.Fatalf("browser sandbox: %s", w.raw)
	}
	nav := func(url string) map[string]any {
		a := call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{
			"actions": []map[string]any{{"type": "navigate", "url": url}}, "observe": map[string]any{"screenshot": "none"}})
		want(t, a, 200)
		return a.body
	}
	body := nav("http://site.test:" + port + "/page")
	if body["ok"] != true || body["observation"].(map[string]any)["title"] != "site site.test:"+port {
		t.Fatalf("allowed navigation: %v", body)
	}
	cases := []struct {
		url, code, injected string
	}{
		{"http://other.test:" + port + "/", faults.CodeEgressDenied, ""},
		{"https://other.test:" + port + "/", faults.CodeEgressDenied, ""},
		{"http://dns.fault.test:" + port + "/", faults.CodeSiteDNS, faults.CodeSiteDNS},
		{"https://dns.fault.test:" + port + "/", faults.CodeSiteDNS, faults.CodeSiteDNS},
		{"https://reset.fault.test:" + port + "/", faults.CodeSiteConnectionReset, faults.CodeSiteConnectionReset},
		{"http://status.fault.test:" + port + "/", "site.http_502", "site.http_502"},
		{"https://status.fault.test:" + port + "/", "site.http_502", "site.http_502"},
	}
	for _, c := range cases {
		body := nav(c.url)
		res := body["results"].([]any)[0].(map[string]any)
		e, _ := res["error"].(map[string]any)
		if body["ok"] != false || e == nil || e["code"] != c.code {
			t.Errorf("%s: %v, want error %s", c.url, res, c.code)
			continue
		}
		inj, _ := res["injected"].(map[string]any)
		if c.injected == "" && inj != nil || c.injected != "" && (inj == nil || inj["code"] != c.injected) {
			t.Errorf("%s: injected %v, want %q", c.url, inj, c.injected)
		}
	}
	r = call(t, srv, "GET", "/sandboxes/"+id+"/browser/network", nil)
	want(t, r, 200)
	if !strings.Contains(string(r.raw), `"host":"site.test"`) || !strings.Contains(string(r.raw), faults.CodeEgressDenied) {
		t.Errorf("browser network log: %s", r.raw)
	}
}
