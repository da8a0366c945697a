package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/chromium"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// vsPage is the page of BenchmarkBrowserVsPlaywright: a button whose click
// changes the DOM (a counter) and an empty area where a click changes
// nothing.
const vsPage = `<!doctype html><html><head><title>Orchard bench</title></head>
<body style="margin:0;font:16px sans-serif">
<button id="b" style="position:absolute;left:100px;top:100px;width:200px;height:80px"
  onclick="document.getElementById('out').textContent='clicked '+(++window.n)">Press</button>
<p id="out" style="position:absolute;left:100px;top:400px">idle</p>
<script>window.n=0</script>
</body></html>`

// Where the benchmark clicks: the button, and an empty spot.
const (
	vsChangeX, vsChangeY = 200, 140
	vsStillX, vsStillY   = 900, 600
)

// BenchmarkBrowserVsPlaywright: a browser sandbox with the default
// settings at 1280×720 against Playwright driving the same Chromium binary
// on the same page in the same run (testdata/playwright/shots.js), in
// alternating batches of ORCHARD_BENCH_VS_BATCH (default 20) for
// ORCHARD_BENCH_VS_ROUNDS (default 5) rounds. Three operations, each
// reported as our p50, Playwright's p50 and the ratio:
//
//   - screenshot: GET /browser/screenshot (JPEG q80) against page.screenshot;
//   - step_change: POST /browser/actions (click on the button, then a JPEG
//     q80 observation) against mouse.click + page.screenshot;
//   - step_still: the same with a click where nothing changes.
func BenchmarkBrowserVsPlaywright(b *testing.B) {
	testenv.RequireChromium(b)
	node, pwDir := testenv.RequirePlaywright(b)
	batch := envInt("ORCHARD_BENCH_VS_BATCH", 20)
	rounds := envInt("ORCHARD_BENCH_VS_ROUNDS", 5)
	srv := testserver.Start(b, testserver.Options{})
	id, _ := benchBrowserAt(b, srv, "1Gi", 1280, 720, vsPage)
	pw := startShots(b, node, pwDir)

	click := func(x, y int) map[string]any {
		return map[string]any{
			"action":  map[string]any{"type": "click", "x": x, "y": y},
			"observe": map[string]any{"screenshot": "jpeg", "quality": 80},
		}
	}
	frames := map[string]int{}
	ours := map[string]func() time.Duration{
		"screenshot": func() time.Duration {
			t0 := time.Now()
			frames["screenshot "+screenshot(b, srv, id)]++
			return time.Since(t0)
		},
		"step-change": func() time.Duration { return vsStep(b, srv, id, click(vsChangeX, vsChangeY), frames, "change ") },
		"step-still":  func() time.Duration { return vsStep(b, srv, id, click(vsStillX, vsStillY), frames, "still ") },
	}
	ops := []string{"screenshot", "step-change", "step-still"}
	mine := map[string][]time.Duration{}
	theirs := map[string][]time.Duration{}
	for _, op := range ops { // warm both
		ours[op]()
		pw.run(b, op, 2)
	}
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			for _, op := range ops {
				// Alternate who goes first, so neither always follows the other.
				if r%2 == 0 {
					theirs[op] = append(theirs[op], pw.run(b, op, batch)...)
				}
				for range batch {
					mine[op] = append(mine[op], ours[op]())
				}
				if r%2 == 1 {
					theirs[op] = append(theirs[op], pw.run(b, op, batch)...)
				}
			}
		}
	}
	b.StopTimer()
	for _, op := range ops {
		name := map[string]string{"screenshot": "screenshot", "step-change": "step_change", "step-still": "step_still"}[op]
		m, t := ms(percentile(mine[op], 0.5)), ms(percentile(theirs[op], 0.5))
		b.ReportMetric(m, name+"_ms")
		b.ReportMetric(t, name+"_pw_ms")
		b.ReportMetric(m/t, name+"_x_pw")
	}
	b.Logf("frames: %v", frames)
}

// vsStep posts one step and counts where its frame came from.
func vsStep(b *testing.B, srv *testserver.Server, id string, req map[string]any, frames map[string]int, prefix string) time.Duration {
	t0 := time.Now()
	code, r := post(b, srv, "/sandboxes/"+id+"/browser/actions", req)
	d := time.Since(t0)
	if code != 200 || r["ok"] != true {
		b.Fatalf("step: %d %.400v", code, r)
	}
	obs, _ := r["observation"].(map[string]any)
	timing, _ := obs["timing"].(map[string]any)
	frame, _ := timing["frame"].(string)
	frames[prefix+frame]++
	return d
}

// screenshot GETs a JPEG q80 screenshot and returns where its frame came
// from (X-Orchard-Capture).
func screenshot(b testing.TB, srv *testserver.Server, id string) string {
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/"+id+"/browser/screenshot?format=jpeg&quality=80", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := httpClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	if _, err := io.Copy(io.Discard, res.Body); err != nil || res.StatusCode != 200 {
		b.Fatalf("screenshot: %d %v", res.StatusCode, err)
	}
	return res.Header.Get("X-Orchard-Capture")
}

// shots is a running testdata/playwright/shots.js.
type shots struct {
	in  io.Writer
	out *bufio.Scanner
}

func startShots(b *testing.B, node, dir string) *shots {
	exe, err := chromium.Find(chromium.Auto, true)
	if err != nil {
		b.Fatalf("find chromium: %v", err)
	}
	page := filepath.Join(b.TempDir(), "page.html")
	if err := os.WriteFile(page, []byte(vsPage), 0o644); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, node, "shots.js")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CHROMIUM="+exe, "PAGE_FILE="+page,
		"CHANGE_X="+strconv.Itoa(vsChangeX), "CHANGE_Y="+strconv.Itoa(vsChangeY),
		"STILL_X="+strconv.Itoa(vsStillX), "STILL_Y="+strconv.Itoa(vsStillY))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cancel()
			<-done
		}
		cancel()
	})
	s := &shots{in: in, out: bufio.NewScanner(out)}
	s.out.Buffer(make([]byte, 1<<20), 1<<20)
	if !s.out.Scan() {
		b.Fatalf("shots.js did not start: %v", s.out.Err())
	}
	return s
}

// run has Playwright run op n times and returns each duration.
func (s *shots) run(b *testing.B, op string, n int) []time.Duration {
	if _, err := io.WriteString(s.in, op+" "+strconv.Itoa(n)+"\n"); err != nil {
		b.Fatalf("shots.js: %v", err)
	}
	if !s.out.Scan() {
		b.Fatalf("shots.js ended: %v", s.out.Err())
	}
	var r struct {
		MS []float64 `json:"ms"`
	}
	if err := json.Unmarshal(s.out.Bytes(), &r); err != nil || len(r.MS) != n {
		b.Fatalf("shots.js printed %q: %v", s.out.Bytes(), err)
	}
	d := make([]time.Duration, n)
	for i, v := range r.MS {
		d[i] = time.Duration(v * float64(time.Millisecond))
	}
	return d
}
