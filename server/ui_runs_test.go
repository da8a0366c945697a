package server_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/internal/testing/docimg"
	"github.com/orchard/orchard/internal/testing/pagetest"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/runner"
)

// shopRun runs the shop suite with a scripted policy, as `orchard run
// shop --policy scripted` does: search-lamp answers wrong (failure), the
// other two succeed. It writes the summary where --json would, with
// pass@k added as the summary writes it once attempts are counted, and
// a baseline from the day before in which search-lamp succeeded,
// search-dom ended env_error and search-url failed.
func shopRun(t *testing.T, srv *testserver.Server, dir string) (run, base string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := client.New(srv.URL, srv.APIKey)
	ts, err := c.SuiteTasks(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	var search []json.RawMessage
	for _, a := range searchSteps {
		search = append(search, mustJSON(a))
	}
	scripts := map[string][]json.RawMessage{
		"search-lamp": append(slices.Clone(search), json.RawMessage(`{"type":"answer","text":"5"}`)),
		"search-dom":  search, "search-url": search,
	}
	s, err := runner.Run(ctx, runner.Config{Client: c, Tasks: ts, Concurrency: 2, Record: true,
		Policy: runner.Scripted(func(id string) ([]json.RawMessage, bool) { a, ok := scripts[id]; return a, ok })})
	if err != nil {
		t.Fatal(err)
	}
	if s.Success != 2 || s.Failure != 1 {
		t.Fatalf("the shop run: %d success, %d failure, want 2 and 1", s.Success, s.Failure)
	}
	write := func(name string, edit func(doc map[string]any)) string {
		var doc map[string]any
		b, _ := json.Marshal(s)
		_ = json.Unmarshal(b, &doc)
		edit(doc)
		b, _ = json.Marshal(doc)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run = write("tuesday.json", func(doc map[string]any) { doc["pass_at_k"] = map[string]float64{"pass@1": 0.67, "pass@3": 1} })
	base = write("monday.json", func(doc map[string]any) {
		was := map[string]string{"search-lamp": "success", "search-dom": "env_error", "search-url": "failure"}
		for _, t := range doc["tasks"].([]any) {
			t := t.(map[string]any)
			t["outcome"] = was[t["task_id"].(string)]
		}
	})
	return run, base
}

// The dashboard in Chromium with a running episode and two run summaries,
// one of a run the test made:
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

	run, base := shopRun(t, srv, t.TempDir())

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
	if charts.Outcomes["success"] != "2" || charts.Outcomes["failure"] != "1" || charts.Outcomes["env_error"] != "0" || charts.Rate != "66.7%" || charts.Latency != 4 || charts.PerMin != 12 ||
		charts.PassAtK["pass@1"] != "0.67" || charts.PassAtK["pass@3"] != "1.00" {
		t.Errorf("run charts: %+v", charts)
	}
	// Compared with the day before: search-lamp regressed, search-dom left
	// env_error, search-url improved.
	if err := chromedp.Do(ctx, chromedp.SetUploadFiles("#run-base", []string{base})); err != nil {
		t.Fatal(err)
	}
	wait("the comparison", `document.querySelector('#run-compare tr[data-task="search-lamp"]')`)
	var changes map[string]string
	eval(`Object.fromEntries([...document.querySelectorAll('#run-compare tr[data-task]')].map(r => [r.dataset.task, r.dataset.change]))`, &changes)
	if len(changes) != 3 || changes["search-lamp"] != "regressed" || changes["search-dom"] != "env_error" || changes["search-url"] != "improved" {
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
