package server_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/chromium"
	"github.com/orchard/orchard/internal/testing/floor"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// Browser-sandbox benchmarks through the REST API: one RL step, many
// sandboxes stepping at once, cold ready time and memory per sandbox.
// docs/benchmarks.md records the figures and the commands.

// browserStep is one RL step on testPage: a click by coordinates on the
// button, then a JPEG observation with set-of-marks.
var browserStep = map[string]any{
	"actions": []map[string]any{{"type": "click", "x": 200, "y": 140}},
	"observe": map[string]any{"screenshot": "jpeg", "som": true},
}

// benchBrowser creates a browser sandbox (800×600), waits for it, writes
// testPage to /workspace/page.html and navigates to it. It returns the
// sandbox id and the time from POST /sandboxes to ready.
// ORCHARD_BENCH_FAST_FRAMES=1 creates it with `"fast_frames": true`,
// ORCHARD_BENCH_PLAIN_SETTLE=1 with `"plain_settle": true`,
// ORCHARD_BENCH_ALWAYS_CAPTURE=1 with `"always_capture": true`;
// ORCHARD_BENCH_ENGINE=chromium|headless-shell sets its `engine`.
func benchBrowser(b testing.TB, srv *testserver.Server, memory string) (string, time.Duration) {
	b.Helper()
	return benchBrowserAt(b, srv, memory, 800, 600, testPage)
}

// benchBrowserAt is benchBrowser with a viewport and a page of its own.
func benchBrowserAt(b testing.TB, srv *testserver.Server, memory string, width, height int, html string) (string, time.Duration) {
	b.Helper()
	settings := map[string]any{"viewport": map[string]int{"width": width, "height": height}}
	if os.Getenv("ORCHARD_BENCH_FAST_FRAMES") == "1" {
		settings["fast_frames"] = true
	}
	if os.Getenv("ORCHARD_BENCH_PLAIN_SETTLE") == "1" {
		settings["plain_settle"] = true
	}
	if os.Getenv("ORCHARD_BENCH_ALWAYS_CAPTURE") == "1" {
		settings["always_capture"] = true
	}
	if e := os.Getenv("ORCHARD_BENCH_ENGINE"); e != "" {
		settings["engine"] = e
	}
	body := map[string]any{"image": "host", "block_network": true, "kind": "browser", "browser": settings}
	if memory != "" {
		body["memory"] = memory
	}
	t0 := time.Now()
	code, r := post(b, srv, "/sandboxes", body)
	if code != 200 {
		b.Fatalf("create browser sandbox: %d %v", code, r)
	}
	id, _ := r["sandbox_id"].(string)
	if w := getWait(b, srv, id); w["status"] != "ready" {
		b.Fatalf("browser sandbox %s: %v", id, w)
	}
	ready := time.Since(t0)
	if code, r := post(b, srv, "/sandboxes/"+id+"/files", map[string]any{"path": "/workspace/page.html",
		"content": base64.StdEncoding.EncodeToString([]byte(html))}); code != 200 {
		b.Fatalf("write page: %d %v", code, r)
	}
	nav := map[string]any{"actions": []map[string]any{{"type": "navigate", "url": "file:///workspace/page.html"}}}
	if code, r := post(b, srv, "/sandboxes/"+id+"/browser/actions", nav); code != 200 || r["ok"] != true {
		b.Fatalf("navigate: %d %v", code, r)
	}
	return id, ready
}

// step posts one action request and fails on anything but a successful
// result. It returns the round trip and the daemon's own total_ms.
func step(b testing.TB, srv *testserver.Server, id string, req map[string]any) (time.Duration, float64) {
	t0 := time.Now()
	code, r := post(b, srv, "/sandboxes/"+id+"/browser/actions", req)
	d := time.Since(t0)
	if code != 200 || r["ok"] != true {
		b.Errorf("step on %s: %d %.400v", id, code, r)
		return d, 0
	}
	timing, _ := r["timing"].(map[string]any)
	total, _ := timing["total_ms"].(float64)
	obs, _ := r["observation"].(map[string]any)
	ot, _ := obs["timing"].(map[string]any)
	frame, _ := ot["frame"].(string)
	stepFrames.Lock()
	stepFrames.n[frame]++
	stepFrames.Unlock()
	return d, total
}

// stepFrames counts where the steps' frames came from.
var stepFrames = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

// sandboxPSS sums Pss over every process in the sandbox's pids cgroup.
func sandboxPSS(id string) (kb int64, procs int, err error) {
	data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/orchard", id, "cgroup.procs"))
	if err != nil {
		return 0, 0, err
	}
	for _, f := range strings.Fields(string(data)) {
		pid, _ := strconv.Atoi(f)
		v, err := floor.PSS(pid)
		if err != nil {
			continue // exited meanwhile
		}
		kb += v
		procs++
	}
	if procs == 0 {
		return 0, 0, fmt.Errorf("no processes readable in sandbox %s", id)
	}
	return kb, procs, nil
}

// logPSS logs each process's Pss and Rss and its command line (shown with
// -v), largest first.
func logPSS(b testing.TB, id string) {
	data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/orchard", id, "cgroup.procs"))
	if err != nil {
		b.Logf("pss: %v", err)
		return
	}
	type row struct {
		pss, rss int64
		cmd      string
	}
	var rows []row
	for _, pid := range strings.Fields(string(data)) {
		rollup, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
		if err != nil {
			continue
		}
		var r row
		for _, line := range strings.Split(string(rollup), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			v, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "Pss:":
				r.pss = v
			case "Rss:":
				r.rss = v
			}
		}
		cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline")
		r.cmd = strings.ReplaceAll(string(cmd), "\x00", " ")
		if len(r.cmd) > 90 {
			r.cmd = r.cmd[:90]
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b row) int { return int(b.pss - a.pss) })
	for _, r := range rows {
		b.Logf("pss %6.1f MB  rss %6.1f MB  %s", float64(r.pss)/1024, float64(r.rss)/1024, r.cmd)
	}
}

// BenchmarkBrowserStep: one RL step through POST /browser/actions, p50/p90.
// "button" clicks the button (its handler changes the page); "blank" clicks
// where nothing reacts; in both the settle wait ends once the page has
// nothing pending, or with `plain_settle` at the idle window; "observe" is
// the observation alone;
// "navigate" reloads the page by navigating to it. The "-settle30" cases
// send a request-level settle of 30 ms quiet / 10 ms idle instead of the
// defaults (250 / 100). "memory" steps, then reports the PSS summed over the
// sandbox's processes, and as x_floor over the same browser binary's alone.
func BenchmarkBrowserStep(b *testing.B) {
	testenv.RequireChromium(b)
	// The floor for "memory": the same browser binary alone, at its own
	// defaults, on a one-button page, with nothing of Orchard's; measured
	// before the sandbox starts, which would share the binary's pages.
	fkb := browserFloor(b, 1)
	srv := testserver.Start(b, testserver.Options{})
	id, _ := benchBrowser(b, srv, "1Gi")
	if os.Getenv("ORCHARD_BENCH_VIEWER") != "" {
		watchLive(b, srv, id)
	}
	cases := []struct {
		name string
		req  map[string]any
	}{
		{"button", browserStep},
		{"blank", map[string]any{
			"actions": []map[string]any{{"type": "click", "x": 700, "y": 550}},
			"observe": map[string]any{"screenshot": "jpeg", "som": true}}},
		{"button-settle30", map[string]any{
			"actions": browserStep["actions"], "observe": browserStep["observe"],
			"settle": map[string]any{"quiet_ms": 30, "idle_ms": 10}}},
		{"blank-settle30", map[string]any{
			"actions": []map[string]any{{"type": "click", "x": 700, "y": 550}},
			"observe": map[string]any{"screenshot": "jpeg", "som": true},
			"settle":  map[string]any{"quiet_ms": 30, "idle_ms": 10}}},
		{"observe", map[string]any{"observe": map[string]any{"screenshot": "jpeg", "som": true}}},
		{"navigate", map[string]any{
			"actions": []map[string]any{{"type": "navigate", "url": "file:///workspace/page.html"}}}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for range 5 {
				step(b, srv, id, c.req)
			}
			var rt []time.Duration
			var daemon []time.Duration
			b.ResetTimer()
			for range b.N {
				d, total := step(b, srv, id, c.req)
				rt = append(rt, d)
				daemon = append(daemon, time.Duration(total*float64(time.Millisecond)))
			}
			b.StopTimer()
			b.ReportMetric(ms(percentile(rt, 0.5)), "p50_ms")
			b.ReportMetric(ms(percentile(rt, 0.9)), "p90_ms")
			b.ReportMetric(ms(percentile(daemon, 0.5)), "daemon_p50_ms")
		})
	}
	b.Run("memory", func(b *testing.B) {
		for range b.N {
			step(b, srv, id, browserStep)
		}
		b.StopTimer()
		kb, n, err := sandboxPSS(id)
		if err != nil {
			b.Fatalf("pss: %v", err)
		}
		logPSS(b, id)
		b.ReportMetric(float64(kb)/1024, "pss_MB")
		b.ReportMetric(float64(n), "procs")
		b.ReportMetric(float64(fkb)/1024, "floor_pss_MB")
		b.ReportMetric(float64(kb)/float64(fkb), "x_floor")
	})
}

// BenchmarkBrowserConcurrent: 16 browser sandboxes (1 GiB each) each run
// steps back to back for a fixed time; aggregate steps/s. The duration is
// ORCHARD_BENCH_BROWSER_SECONDS (default 20) per iteration; the sandbox
// count is ORCHARD_BENCH_BROWSERS (default 16). In the same run, once the
// sandboxes are deleted: as many bare copies of the browser binary
// (x_floor: PSS per sandbox over theirs), then as many Playwright browsers
// clicking and taking a JPEG on the same page (x_playwright: steps/s over
// theirs).
func BenchmarkBrowserConcurrent(b *testing.B) {
	testenv.RequireChromium(b)
	node, pwDir := testenv.RequirePlaywright(b)
	n := envInt("ORCHARD_BENCH_BROWSERS", 16)
	dur := time.Duration(envInt("ORCHARD_BENCH_BROWSER_SECONDS", 20)) * time.Second
	srv := testserver.Start(b, testserver.Options{})
	ids := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	t0 := time.Now()
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ids[i], _ = benchBrowser(b, srv, "1Gi")
		})
	}
	wg.Wait()
	b.Logf("%d browser sandboxes ready in %v", n, time.Since(t0).Round(time.Millisecond))
	if b.Failed() {
		b.FailNow()
	}
	for _, id := range ids { // warm every tab
		step(b, srv, id, browserStep)
	}
	var steps atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var elapsed time.Duration
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		cpu0 := machineCPU(b)
		deadline := start.Add(dur)
		for _, id := range ids {
			wg.Go(func() {
				var mine []time.Duration
				for time.Now().Before(deadline) {
					d, _ := step(b, srv, id, browserStep)
					mine = append(mine, d)
					steps.Add(1)
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		elapsed += time.Since(start)
		cpu += machineCPU(b) - cpu0
	}
	b.StopTimer()
	b.ReportMetric(float64(steps.Load())/elapsed.Seconds(), "steps/s")
	// What a step costs the whole machine (sandboxes, server and this
	// client alike): on a machine the steps saturate, the figure that
	// decides steps per second.
	cpuPerStep := ms(cpu) / float64(steps.Load())
	b.ReportMetric(cpuPerStep, "cpu_ms/step")
	stepFrames.Lock()
	b.Logf("frames: %v", stepFrames.n)
	stepFrames.Unlock()
	b.ReportMetric(ms(percentile(lat, 0.5)), "p50_ms")
	b.ReportMetric(ms(percentile(lat, 0.9)), "p90_ms")
	var total int64
	for _, id := range ids {
		kb, _, err := sandboxPSS(id)
		if err != nil {
			b.Logf("pss: %v", err)
			continue
		}
		total += kb
	}
	b.ReportMetric(float64(total)/1024/float64(n), "pss_MB/sandbox")
	// The floor: as many bare copies of the same browser binary at once,
	// once the sandboxes are gone (they would share its pages otherwise).
	for _, id := range ids {
		if err := del(srv, id); err != nil {
			b.Fatalf("delete %s: %v", id, err)
		}
	}
	fkb := browserFloor(b, n)
	b.ReportMetric(float64(fkb)/1024, "floor_pss_MB/browser")
	b.ReportMetric(float64(total)/float64(n)/float64(fkb), "x_floor")
	// The baseline: as many Playwright browsers of the same binary, on
	// the same page, clicking and taking a JPEG back to back as long.
	pw, pwCPU := playwrightSteps(b, node, pwDir, n, dur)
	b.ReportMetric(pw, "playwright_steps/s")
	b.ReportMetric(pwCPU, "playwright_cpu_ms/step")
	b.ReportMetric(cpuPerStep/pwCPU, "x_playwright_cpu")
	b.ReportMetric(float64(steps.Load())/elapsed.Seconds()/pw, "x_playwright")
}

// playwrightSteps runs testdata/playwright/steps.js: n Playwright browsers
// stepping on testPage for dur; it returns their aggregate steps/s and the
// machine's CPU time per step.
func playwrightSteps(b *testing.B, node, dir string, n int, dur time.Duration) (float64, float64) {
	exe, err := chromium.Find(chromium.Auto, true)
	if err != nil {
		b.Fatalf("find chromium: %v", err)
	}
	page := filepath.Join(b.TempDir(), "page.html")
	if err := os.WriteFile(page, []byte(testPage), 0o644); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur+5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "steps.js")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CHROMIUM="+exe, "PAGE_FILE="+page,
		"BROWSERS="+strconv.Itoa(n), "SECONDS="+strconv.Itoa(int(dur.Seconds())))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("playwright: %v\n%s", err, stderr.String())
	}
	var r struct {
		Steps   int     `json:"steps"`
		Seconds float64 `json:"seconds"`
		P50     float64 `json:"p50_ms"`
		CPU     float64 `json:"cpu_s"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.Seconds <= 0 || r.Steps == 0 {
		b.Fatalf("playwright printed %q: %v", out, err)
	}
	b.Logf("playwright: %d steps in %.1f s, p50 %.1f ms", r.Steps, r.Seconds, r.P50)
	return float64(r.Steps) / r.Seconds, r.CPU * 1000 / float64(r.Steps)
}

// machineCPU is the CPU time every core of the machine has spent busy
// since boot: /proc/stat's first line, all but idle and iowait, in the
// kernel's USER_HZ ticks (100 a second on Linux).
func machineCPU(b *testing.B) time.Duration {
	f, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatalf("machine CPU: %v", err)
	}
	line, _, _ := strings.Cut(string(f), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		b.Fatalf("machine CPU: /proc/stat starts %q", line)
	}
	var ticks int64
	for i, v := range fields[1:9] { // user nice system idle iowait irq softirq steal
		if i == 3 || i == 4 {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatalf("machine CPU: %q: %v", line, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// browserFloor is floor.BrowserPSS for the binary a browser sandbox runs.
func browserFloor(b *testing.B, n int) int64 {
	exe, err := chromium.Find(chromium.Auto, true)
	if err != nil {
		b.Fatalf("find chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kb, err := floor.BrowserPSS(ctx, exe, n, 3*time.Second)
	if err != nil {
		b.Fatalf("browser floor: %v", err)
	}
	return kb
}

// BenchmarkBrowserReady: cold browser sandbox, POST /sandboxes kind browser
// then /wait until ready, one at a time; each is deleted (untimed) before
// the next. first_obs is the time from POST to the first JPEG observation
// answered by the sandbox's browser. Between sandboxes, the same browser
// binary is started bare until it has loaded a page (floor_p50_ms; x_floor
// is the ready p50 over it).
func BenchmarkBrowserReady(b *testing.B) {
	testenv.RequireChromium(b)
	srv := testserver.Start(b, testserver.Options{})
	body := func() map[string]any {
		return map[string]any{"image": "host", "block_network": true, "kind": "browser", "memory": "1Gi",
			"browser": map[string]any{"viewport": map[string]int{"width": 800, "height": 600}}}
	}
	// One untimed sandbox first, so page-cache misses on Chromium's
	// files do not count as the first sample.
	code, r := post(b, srv, "/sandboxes", body())
	if code != 200 {
		b.Fatalf("create: %d %v", code, r)
	}
	getWait(b, srv, r["sandbox_id"].(string))
	if err := del(srv, r["sandbox_id"].(string)); err != nil {
		b.Fatal(err)
	}
	exe, err := chromium.Find(chromium.Auto, true)
	if err != nil {
		b.Fatalf("find chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var ready, firstObs, floorStart []time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		code, r := post(b, srv, "/sandboxes", body())
		if code != 200 {
			b.Fatalf("create: %d %v", code, r)
		}
		id := r["sandbox_id"].(string)
		if w := getWait(b, srv, id); w["status"] != "ready" {
			b.Fatalf("browser sandbox %s: %v", id, w)
		}
		ready = append(ready, time.Since(t0))
		// The first action served by the browser in the new sandbox.
		if code, r := post(b, srv, "/sandboxes/"+id+"/browser/actions",
			map[string]any{"observe": map[string]any{"screenshot": "jpeg"}}); code != 200 || r["ok"] != true {
			b.Fatalf("first observation on %s: %d %.400v", id, code, r)
		}
		firstObs = append(firstObs, time.Since(t0))
		b.StopTimer()
		if err := del(srv, id); err != nil {
			b.Fatal(err)
		}
		// The floor, interleaved: the same browser binary started bare
		// until it has loaded a page.
		d, err := floor.BrowserStart(ctx, exe)
		if err != nil {
			b.Fatalf("browser floor: %v", err)
		}
		floorStart = append(floorStart, d)
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(ms(percentile(floorStart, 0.5)), "floor_p50_ms")
	b.ReportMetric(float64(percentile(ready, 0.5))/float64(percentile(floorStart, 0.5)), "x_floor")
	b.ReportMetric(ms(percentile(ready, 0.5)), "p50_ms")
	b.ReportMetric(ms(percentile(ready, 0.9)), "p90_ms")
	b.ReportMetric(ms(percentile(ready, 1)), "max_ms")
	b.ReportMetric(ms(percentile(firstObs, 0.5)), "first_obs_p50_ms")
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// watchLive keeps a viewer on the sandbox's live view (5 frames a second)
// until the benchmark ends: ORCHARD_BENCH_VIEWER=1 measures steps while
// someone watches.
func watchLive(b *testing.B, srv *testserver.Server, id string) {
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/sandboxes/"+id+"/browser/stream?fps=5", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		cancel()
		b.Fatalf("live view: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	b.Cleanup(func() {
		cancel()
		resp.Body.Close()
		<-done
	})
}
