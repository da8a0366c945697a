package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// The chaos run: concurrent sandboxes run scripted steps while their fault
// plans inject every kind of fault; each step's attribution (source and
// code) is scored against the truth of what was injected. Network faults
// and browser faults are tagged by the system in the response (a result's
// `injected`, the X-Orchard-Injected header); agent kills and OOMs fire at
// a step the plan fixes, so their truth is known beforehand.

// chaosTargets is how many faults of each kind the run injects at least:
// 500 in all, fewer of the kinds that cost a browser restart each.
var chaosTargets = map[string]int{
	faults.InjectHTTPStatus: 80, faults.InjectDNSFailure: 80, faults.InjectConnectionReset: 80, faults.InjectLatency: 70,
	faults.InjectAgentKill: 60, faults.InjectOOM: 60, faults.InjectBrowserCrash: 35, faults.InjectHang: 35,
}

type outcome struct {
	truth    string // "source/code" of the injected fault, or "none"
	kind     string // injected kind, or ""
	observed string // "source/code", or "ok"
}

type chaosRun struct {
	mu       sync.Mutex // guards outcomes, counts
	outcomes []outcome
	counts   map[string]int
	ids      []string
}

func (c *chaosRun) record(kind string, truth faults.Truth, observed string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := outcome{truth: "none", observed: observed}
	if kind != "" {
		o.truth, o.kind = string(truth.Source)+"/"+truth.Code, kind
		c.counts[kind]++
	}
	c.outcomes = append(c.outcomes, o)
}

// need reports whether kind still lacks faults.
func (c *chaosRun) need(kind string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[kind] < chaosTargets[kind]
}

func (c *chaosRun) done() bool {
	for k := range chaosTargets {
		if c.need(k) {
			return false
		}
	}
	return true
}

func (c *chaosRun) track(id string) {
	c.mu.Lock()
	c.ids = append(c.ids, id)
	c.mu.Unlock()
}

func TestChaosAttribution(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run: minutes of real browsers and sandboxes")
	}
	testenv.RequireChromium(t)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, `<html><head><title>chaos</title></head><body style="height:3000px">
<button id="b" onclick="this.textContent='clicked'">press</button><a href="/next">next</a></body></html>`)
	}))
	defer site.Close()
	_, port, _ := net.SplitHostPort(site.Listener.Addr().String())
	hosts := map[string]netip.Addr{}
	for _, h := range []string{"site", "status", "dns", "reset", "slow"} {
		hosts[h+".chaos.test"] = netip.MustParseAddr("127.0.0.1")
	}
	srv := testserver.Start(t, testserver.Options{Egress: &egress.Dialer{Hosts: hosts,
		AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}})
	run := &chaosRun{counts: map[string]int{}}
	start := time.Now()
	deadline := start.Add(6 * time.Minute)

	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() { chaosBrowser(t, srv, run, port, uint64(w+1), deadline) })
	}
	for w := range 2 {
		wg.Go(func() { chaosShell(t, srv, run, uint64(w+10), deadline) })
	}
	wg.Wait()
	elapsed := time.Since(start)

	// Score.
	matrix := map[string]map[string]int{}
	injected, correct, clean, cleanFailed := 0, 0, 0, 0
	for _, o := range run.outcomes {
		if matrix[o.truth] == nil {
			matrix[o.truth] = map[string]int{}
		}
		matrix[o.truth][o.observed]++
		if o.kind == "" {
			clean++
			if o.observed != "ok" {
				cleanFailed++
			}
			continue
		}
		injected++
		if o.observed == o.truth {
			correct++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: %d steps, %d injected faults, %d clean steps, %s\n", len(run.outcomes), injected, clean, elapsed.Round(time.Second))
	fmt.Fprintf(&b, "%-40s %-40s %s\n", "truth (source/code)", "attributed", "count")
	truths := make([]string, 0, len(matrix))
	for k := range matrix {
		truths = append(truths, k)
	}
	sort.Strings(truths)
	for _, tr := range truths {
		obs := make([]string, 0, len(matrix[tr]))
		for o := range matrix[tr] {
			obs = append(obs, o)
		}
		sort.Strings(obs)
		for _, o := range obs {
			mark := ""
			if tr != "none" && o != tr || tr == "none" && o != "ok" {
				mark = "  ✗"
			}
			fmt.Fprintf(&b, "%-40s %-40s %5d%s\n", tr, o, matrix[tr][o], mark)
		}
	}
	acc := float64(correct) / float64(max(injected, 1))
	fmt.Fprintf(&b, "attribution accuracy: %.2f%% (%d/%d); clean steps failed: %d/%d\n", 100*acc, correct, injected, cleanFailed, clean)
	for k, n := range chaosTargets {
		fmt.Fprintf(&b, "  %-18s %4d injected (target %d)\n", k, run.counts[k], n)
	}
	t.Log("\n" + b.String())
	if out := os.Getenv("ORCHARD_CHAOS_REPORT"); out != "" {
		_ = os.WriteFile(out, []byte(b.String()), 0o644)
	}
	if injected < 500 {
		t.Errorf("only %d faults injected, want at least 500", injected)
	}
	for k, n := range chaosTargets {
		if run.counts[k] < n {
			t.Errorf("%s: %d injected, want %d", k, run.counts[k], n)
		}
	}
	if acc < 0.99 {
		t.Errorf("attribution accuracy %.2f%% is below 99%%", 100*acc)
	}
	if float64(cleanFailed) > 0.01*float64(clean) {
		t.Errorf("%d of %d clean steps failed", cleanFailed, clean)
	}

	// Nothing may be left of the sandboxes.
	for _, id := range run.ids {
		call(t, srv, "DELETE", "/sandboxes/"+id, nil)
	}
	waitGone(t, srv, run.ids)
}

// waitGone waits until the runtime holds none of ids and no cgroup of
// theirs remains.
func waitGone(t *testing.T, srv *testserver.Server, ids []string) {
	t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var left []string
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		insts, err := srv.Runtime.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		left = left[:0]
		for _, in := range insts {
			if want[in.ID] {
				left = append(left, in.ID)
			}
		}
		for _, id := range ids {
			// Cgroups are the host's view of what a sandbox holds; the
			// suite's leak check looks at mounts and processes at the end.
			if cg, _ := filepath.Glob("/sys/fs/cgroup/*/orchard/*" + id + "*"); len(cg) > 0 {
				left = append(left, id+" (cgroups)")
			}
		}
		if len(left) == 0 {
			return
		}
	}
	t.Errorf("sandboxes left after delete: %v", left)
}

// chaosCall is call without failing the test on non-JSON answers.
func chaosCall(srv *testserver.Server, method, path string, body any) (int, http.Header, map[string]any, error) {
	var rd io.Reader
	if body != nil {
		buf, _ := json.Marshal(body)
		rd = bytes.NewReader(buf)
	}
	req, _ := http.NewRequest(method, srv.URL+path, rd)
	req.Header.Set("X-API-Key", srv.APIKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer res.Body.Close()
	var m map[string]any
	raw, _ := io.ReadAll(res.Body)
	_ = json.Unmarshal(raw, &m)
	return res.StatusCode, res.Header, m, nil
}

func attributed(status int, body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	if status != 200 {
		if e == nil {
			return fmt.Sprintf("http/%d", status)
		}
		return fmt.Sprintf("%v/%v", e["source"], e["code"])
	}
	return "ok"
}

func chaosBrowser(t *testing.T, srv *testserver.Server, run *chaosRun, port string, seed uint64, deadline time.Time) {
	rng := rand.New(rand.NewPCG(seed, 7))
	plan := map[string]any{"faults": []map[string]any{
		{"kind": "http_status", "p": 1, "match": "status.chaos.test", "status": 503},
		{"kind": "dns_failure", "p": 1, "match": "dns.chaos.test"},
		{"kind": "connection_reset", "p": 1, "match": "reset.chaos.test"},
		// Latency past the navigation timeout; the timeout leaves a clean
		// navigation room on two loaded cores (1.2 s failed 6 of 339 there).
		{"kind": "latency", "p": 1, "match": "slow.chaos.test", "latency_ms": 3200},
		{"kind": "browser_crash", "p": 0.06},
		{"kind": "hang", "p": 0.06},
	}}
	status, _, body, err := chaosCall(srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": false, "kind": "browser",
		"egress":  map[string]any{"allow": []string{"*.chaos.test"}},
		"browser": map[string]any{"viewport": map[string]int{"width": 800, "height": 600}, "call_timeout_ms": 2600, "navigation_timeout_ms": 2000, "settle_timeout_ms": 300},
		"faults":  plan})
	if err != nil || status != 200 {
		t.Errorf("create browser sandbox: %d %v %v", status, body, err)
		return
	}
	id := body["sandbox_id"].(string)
	run.track(id)
	if st, _, b, _ := chaosCall(srv, "GET", "/sandboxes/"+id+"/wait?timeout=120", nil); st != 200 || b["status"] != "ready" {
		t.Errorf("browser sandbox not ready: %v", b)
		return
	}
	kinds := map[string]string{faults.InjectHTTPStatus: "status", faults.InjectDNSFailure: "dns", faults.InjectConnectionReset: "reset", faults.InjectLatency: "slow"}
	for !run.done() && time.Now().Before(deadline) {
		// A step: a navigation to a host whose fault is still wanted, a
		// clean navigation, or a click on the page.
		var action map[string]any
		wanted := []string{}
		for k := range kinds {
			if run.need(k) {
				wanted = append(wanted, k)
			}
		}
		sort.Strings(wanted)
		scheme := []string{"http", "https"}[rng.IntN(2)]
		switch r := rng.IntN(10); {
		case r < 6 && len(wanted) > 0:
			k := wanted[rng.IntN(len(wanted))]
			if k == faults.InjectLatency {
				scheme = "http" // the site speaks plain HTTP: a delayed TLS handshake would fail on it
			}
			action = map[string]any{"type": "navigate", "url": scheme + "://" + kinds[k] + ".chaos.test:" + port + "/"}
		case r < 8:
			action = map[string]any{"type": "navigate", "url": "http://site.chaos.test:" + port + "/p" + strconv.Itoa(rng.IntN(100))}
		default:
			action = map[string]any{"type": "scroll", "dy": 200}
		}
		st, h, b, err := chaosCall(srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{"actions": []any{action}})
		if err != nil {
			t.Errorf("step: %v", err)
			return
		}
		kind := h.Get("X-Orchard-Injected")
		var truth faults.Truth
		obs := attributed(st, b)
		if st == 200 {
			res, _ := b["results"].([]any)
			if len(res) > 0 {
				r0 := res[0].(map[string]any)
				if e, ok := r0["error"].(map[string]any); ok {
					obs = fmt.Sprintf("%v/%v", e["source"], e["code"])
				}
				if inj, ok := r0["injected"].(map[string]any); ok && kind == "" {
					kind = inj["kind"].(string)
				}
			}
		}
		if kind != "" {
			f := faults.Injection{Kind: kind, Status: 503}
			truth = faults.TruthOf(f)
		}
		run.record(kind, truth, obs)
		if kind == faults.InjectBrowserCrash || kind == faults.InjectHang || strings.HasPrefix(obs, "browser/") {
			// The trainer's move after a browser fault: wait for the
			// restarted browser before the next step.
			awaitBrowser(t, srv, id)
		}
	}
}

func awaitBrowser(t *testing.T, srv *testserver.Server, id string) {
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if st, _, _, err := chaosCall(srv, "GET", "/sandboxes/"+id+"/browser/tabs", nil); err == nil && st == 200 {
			return
		}
	}
	t.Errorf("browser of %s did not come back", id)
}

func chaosShell(t *testing.T, srv *testserver.Server, run *chaosRun, seed uint64, deadline time.Time) {
	rng := rand.New(rand.NewPCG(seed, 9))
	for !run.done() && time.Now().Before(deadline) {
		kind := faults.InjectAgentKill
		if !run.need(kind) || run.need(faults.InjectOOM) && rng.IntN(2) == 0 {
			kind = faults.InjectOOM
		}
		if !run.need(kind) {
			return
		}
		at := 1 + rng.IntN(3)
		st, _, body, err := chaosCall(srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "memory": "96Mi",
			"faults": map[string]any{"faults": []map[string]any{{"kind": kind, "p": 1, "after_steps": at, "times": 1}}}})
		if err != nil || st != 200 {
			t.Errorf("create: %d %v %v", st, body, err)
			return
		}
		id := body["sandbox_id"].(string)
		run.track(id)
		if st, _, b, _ := chaosCall(srv, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil); st != 200 || b["status"] != "ready" {
			t.Errorf("sandbox not ready: %v", b)
			return
		}
		for step := 1; step <= at; step++ {
			st, _, job, err := chaosCall(srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "echo ok", "wait": true, "timeout": 60})
			if err != nil {
				t.Errorf("exec: %v", err)
				return
			}
			obs := attributed(st, job)
			if st == 200 {
				if f, ok := job["fault"].(map[string]any); ok {
					obs = fmt.Sprintf("%v/%v", f["source"], f["code"])
				} else if job["status"] != "succeeded" || job["exit_code"] != 0.0 {
					obs = fmt.Sprintf("job/%v/%v", job["status"], job["exit_code"])
				}
			}
			k := ""
			var truth faults.Truth
			if step == at {
				k, truth = kind, faults.TruthOf(faults.Injection{Kind: kind})
			}
			run.record(k, truth, obs)
		}
		chaosCall(srv, "DELETE", "/sandboxes/"+id, nil)
	}
}
