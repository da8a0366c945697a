package server_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/docimg"
	"github.com/orchard/orchard/internal/testing/pagetest"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/runner"
)

// writeRun writes the summary of a run with the given final outcome per
// task, as `orchard run --json` does, with pass@k when given (as the
// summary writes it once attempts are counted), and returns its path.
func writeRun(t *testing.T, dir, name string, outcomes map[string]string, passAtK map[string]float64) string {
	t.Helper()
	start := time.Now().Add(-time.Minute).UTC()
	var tasks []runner.TaskResult
	for _, id := range []string{"a", "b", "c", "d"} {
		o := outcomes[id]
		e := runner.EpisodeResult{TaskID: id, Outcome: o, Steps: 2, StepMS: []float64{100, 300}, StartedAt: start, DurationMS: 2000}
		if o == runner.OutcomeEnvError {
			e.Attribution = &runner.Attribution{Info: faults.Info{Category: faults.Unavailable, Source: faults.Site, Code: "site.http_503"}, Step: 1}
		}
		start = start.Add(10 * time.Second)
		tasks = append(tasks, runner.TaskResult{TaskID: id, Outcome: o, Steps: 2, Attempts: 1, Attribution: e.Attribution, Episodes: []runner.EpisodeResult{e}})
	}
	var doc map[string]any
	b, _ := json.Marshal(runner.Summarize(tasks, 50*time.Second))
	_ = json.Unmarshal(b, &doc)
	if passAtK != nil {
		doc["pass_at_k"] = passAtK
	}
	b, _ = json.Marshal(doc)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The dashboard in Chromium with a running episode and two run summaries:
// the episode's row offers its latest step (the screenshot with the click
// drawn at the action's pixels) and its sandbox's live view; the run's
// charts show its counts; the comparison marks the task that regressed;
// every request stays on the server's origin and none carries the key.
func TestDashboardRunsInChromium(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	loadShop(t, srv)
	e := call(t, srv, "POST", "/episodes", map[string]any{"task_id": "search-lamp", "max_steps": 10})
	want(t, e, 200)
	ep := e.body["episode_id"].(string)
	want(t, call(t, srv, "POST", "/episodes/"+ep+"/step", map[string]any{"action": map[string]any{"type": "click", "x": 390, "y": 95}}), 200)

	dir := t.TempDir()
	base := writeRun(t, dir, "monday.json", map[string]string{"a": "success", "b": "success", "c": "env_error", "d": "failure"}, nil)
	run := writeRun(t, dir, "tuesday.json", map[string]string{"a": "success", "b": "failure", "c": "success", "d": "success"}, map[string]float64{"pass@1": 0.75, "pass@3": 1})

	ctx, requests := pagetest.Open(t, srv.URL+"/ui", 1200, 1000)
	wait := func(what, cond string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool]("!!("+cond+")", chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			var page string
			page, _ = chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("%s: %v; the page shows:\n%s", what, err, page)
		}
	}
	eval := func(expr string, v any) {
		t.Helper()
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatalf("%s: %s: %v", expr, raw, err)
		}
	}
	wait("the key form", `!document.querySelector('#login').hidden`)
	if err := chromedp.Do(ctx, chromedp.SendKeys("#key", srv.APIKey+"\r")); err != nil {
		t.Fatal(err)
	}
	row := `document.querySelector('#episodes tr[data-episode="` + ep + `"]')`
	wait("the running episode", row+` && `+row+`.querySelector('td.steps').textContent === '1'`)

	// Its latest step: step 0's screenshot, where the click was chosen.
	if err := chromedp.Do(ctx, chromedp.Click(`button[data-latest="`+ep+`"]`)); err != nil {
		t.Fatal(err)
	}
	wait("the latest step", `(() => { const i = document.querySelector('#latest img'); return i.complete && i.naturalWidth > 0 && document.querySelector('#latest circle.click'); })()`)
	var latest struct {
		Step, Kind string
		CX, CY     string
		Status     string
	}
	eval(`(() => { const c = document.querySelector('#latest circle.click'); return {Step: document.querySelector('#latest img').dataset.step,
	  Kind: document.querySelector('#latest svg').dataset.kind, CX: c.getAttribute('cx'), CY: c.getAttribute('cy'), Status: document.querySelector('#latest-status').textContent}; })()`, &latest)
	if latest.Step != "0" || latest.Kind != "click" || latest.CX != "390" || latest.CY != "95" || !strings.Contains(latest.Status, "step 1") {
		t.Errorf("latest step: %+v", latest)
	}
	// A step that lands while the page is open shows up in the row and in
	// the latest step without a reload: a type, drawn as its text.
	want(t, call(t, srv, "POST", "/episodes/"+ep+"/step", map[string]any{"action": map[string]any{"type": "type", "text": "lamp"}}), 200)
	wait("the second step", row+`.querySelector('td.steps').textContent === '2' && document.querySelector('#latest svg').dataset.kind === 'type'`)
	var typed string
	eval(`document.querySelector('#latest svg text.typed').textContent`, &typed)
	if typed != `type "lamp"` {
		t.Errorf("latest step's caption %q", typed)
	}
	// The sandbox's live view, one click from the row.
	if err := chromedp.Do(ctx, chromedp.Click(`button[data-live="`+ep+`"]`)); err != nil {
		t.Fatal(err)
	}
	wait("live view frames", `Number(document.querySelector('#viewer img').dataset.frames) >= 1`)
	if err := chromedp.Do(ctx, chromedp.Click("#viewer-close")); err != nil {
		t.Fatal(err)
	}

	// A run's charts, read back from the SVG.
	if err := chromedp.Do(ctx, chromedp.SetUploadFiles("#run-file", []string{run})); err != nil {
		t.Fatal(err)
	}
	wait("the run's charts", `document.querySelector('#run-outcomes g[data-label="success"]')`)
	var charts struct {
		Outcomes map[string]string
		Rate     string
		Latency  int
		PerMin   int
		PassAtK  map[string]string
	}
	eval(`(() => ({Outcomes: Object.fromEntries([...document.querySelectorAll('#run-outcomes g')].map(g => [g.dataset.label, g.dataset.value])),
	  Rate: document.querySelector('[data-rate]').dataset.rate, Latency: document.querySelectorAll('#run-latency g').length,
	  PerMin: document.querySelectorAll('#run-per-minute g').length,
	  PassAtK: Object.fromEntries([...document.querySelectorAll('#run-pass-at-k g')].map(g => [g.dataset.label, g.dataset.value]))}))()`, &charts)
	if charts.Outcomes["success"] != "3" || charts.Outcomes["failure"] != "1" || charts.Outcomes["env_error"] != "0" || charts.Rate != "75.0%" || charts.Latency != 4 || charts.PerMin != 12 ||
		charts.PassAtK["pass@1"] != "0.75" || charts.PassAtK["pass@3"] != "1.00" {
		t.Errorf("run charts: %+v", charts)
	}
	// Compared with the day before: b regressed, c left env_error, d improved.
	if err := chromedp.Do(ctx, chromedp.SetUploadFiles("#run-base", []string{base})); err != nil {
		t.Fatal(err)
	}
	wait("the comparison", `document.querySelector('#run-compare tr[data-task="b"]')`)
	var changes map[string]string
	eval(`Object.fromEntries([...document.querySelectorAll('#run-compare tr[data-task]')].map(r => [r.dataset.task, r.dataset.change]))`, &changes)
	if changes["a"] != "same" || changes["b"] != "regressed" || changes["c"] != "env_error" || changes["d"] != "improved" {
		t.Errorf("comparison: %v", changes)
	}
	if shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil { // quality 100: PNG
		docimg.Save(t, "dashboard.png", shot)
	}

	for _, u := range requests() {
		if !strings.HasPrefix(u, srv.URL+"/") && !strings.HasPrefix(u, "blob:"+srv.URL+"/") {
			t.Errorf("the dashboard requested %s", u)
		}
		if strings.Contains(u, srv.APIKey) {
			t.Errorf("the key is in a URL: %s", u)
		}
	}
	want(t, call(t, srv, "DELETE", "/episodes/"+ep, nil), 200)
}
