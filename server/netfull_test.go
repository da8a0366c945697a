package server_test

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// wanSite serves HTTP from a network namespace standing in for the
// internet: 198.51.100.2, one hop from the host (198.51.100.1). It answers
// with the address the request came from.
func wanSite(t *testing.T) string {
	t.Helper()
	var ln net.Listener
	testenv.WAN(t, "orwan", "198.51.100.1/30", "198.51.100.2/30", func() (err error) {
		ln, err = net.Listen("tcp", "198.51.100.2:0")
		return err
	})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "from %s", r.RemoteAddr)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func TestFullNetworkMode(t *testing.T) {
	site := wanSite(t)
	srv := testserver.Start(t, testserver.Options{})
	full := map[string]any{"block_network": false, "egress": map[string]any{"mode": "full"}}
	a := createReady(t, srv, full)
	b := createReady(t, srv, map[string]any{"block_network": false, "egress": map[string]any{"mode": "full"}})
	sh := func(id, cmd string) string {
		return strings.TrimSpace(execWait(t, srv, id, map[string]any{"command": cmd, "timeout": 30}).Stdout)
	}
	ipOf := func(id string) string {
		m := regexp.MustCompile(`inet (10\.200\.[0-9.]+)/30`).FindStringSubmatch(sh(id, "ip -4 addr show eth0"))
		if m == nil {
			t.Fatalf("sandbox %s has no full-network address", id)
		}
		return m[1]
	}
	bIP := ipOf(b)
	if ipOf(a) == bIP {
		t.Fatal("two sandboxes share an address")
	}
	gw := regexp.MustCompile(`default via ([0-9.]+)`).FindStringSubmatch(sh(a, "ip route"))
	if gw == nil {
		t.Fatal("no default route")
	}
	// The site is reached, through NAT.
	if got := sh(a, "curl -s --max-time 10 http://"+site+"/"); !strings.HasPrefix(got, "from 198.51.100.1:") {
		t.Fatalf("site: %q", got)
	}
	// No proxy in this mode.
	if got := sh(a, "echo ${HTTP_PROXY:-none}"); got != "none" {
		t.Errorf("HTTP_PROXY in full mode: %q", got)
	}
	// B listens; A must not reach it, nor the host, nor private ranges.
	execWait(t, srv, b, map[string]any{"command": "busybox httpd -p 9000 -h /tmp && sleep 0.2"})
	// The listener is up (the host reaches it: its replies are
	// established traffic) — so A's timeout below is the firewall's drop.
	if c, err := net.DialTimeout("tcp", bIP+":9000", 3*time.Second); err != nil {
		t.Fatalf("B's listener from the host: %v", err)
	} else {
		c.Close()
	}
	for name, url := range map[string]string{
		"other sandbox":    "http://" + bIP + ":9000/",
		"host via gateway": "http://" + gw[1] + ":1/",
		"private range":    "http://10.1.2.3/",
		"link-local":       "http://169.254.169.254/",
	} {
		// Dropped, not refused: curl times out (28).
		if got := sh(a, "curl -s -o /dev/null --max-time 2 "+url+"; echo $?"); got != "28" {
			t.Errorf("%s (%s): curl exit %s, want 28 (dropped)", name, url, got)
		}
	}
	// The host end of the veth goes with the sandbox.
	links := func() string { out, _ := exec.Command("ip", "-o", "link").Output(); return string(out) }
	before := strings.Count(links(), ": ob")
	call(t, srv, "DELETE", "/sandboxes/"+a, nil)
	call(t, srv, "DELETE", "/sandboxes/"+b, nil)
	waitGone(t, srv, []string{a, b})
	if after := strings.Count(links(), ": ob"); after != before-2 {
		t.Errorf("veths: %d before delete, %d after", before, after)
	}
	// Allow-lists need the proxy.
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": false,
		"egress": map[string]any{"mode": "full", "allow": []string{"example.com"}}})
	if r.status != 422 {
		t.Errorf("full mode with allow-list: %d %s", r.status, r.raw)
	}
}
