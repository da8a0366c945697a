package runner

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/docimg"
	"github.com/orchard/orchard/internal/testing/pagetest"
)

func TestWilson(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		success, n     int
		wantLo, wantHi float64
	}{
		{0, 0, 0, 1},
		{0, 10, 0, 0.2775},
		{10, 10, 0.7225, 1},
		{5, 10, 0.2366, 0.7634},
		{81, 263, 0.2553, 0.3662}, // Wilson's own worked example is 0.2553–0.3662 at 95%
	} {
		lo, hi := Wilson(tt.success, tt.n, 1.96)
		if math.Abs(lo-tt.wantLo) > 5e-4 || math.Abs(hi-tt.wantHi) > 5e-4 {
			t.Errorf("Wilson(%d, %d) = %.4f, %.4f; want %.4f, %.4f", tt.success, tt.n, lo, hi, tt.wantLo, tt.wantHi)
		}
	}
}

// reportRun is a run of five tasks: two successes, a failure, an
// env_error re-queued once and then a success, and an error.
func reportRun() Summary {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ep := func(task, outcome string, at time.Duration, steps ...float64) EpisodeResult {
		e := EpisodeResult{TaskID: task, Outcome: outcome, Steps: len(steps), StepMS: steps, StartedAt: t0.Add(at), DurationMS: 4000}
		if outcome == OutcomeEnvError {
			e.Attribution = &Attribution{Info: faults.Info{Source: faults.Site, Code: "site.http_503", Category: faults.Unavailable}, Step: 1}
		}
		if outcome == OutcomeError {
			e.Attribution = &Attribution{Info: faults.Info{Source: faults.Client, Code: "policy.unreachable", Category: faults.Unavailable}}
		}
		return e
	}
	task := func(eps ...EpisodeResult) TaskResult {
		last := eps[len(eps)-1]
		return TaskResult{TaskID: last.TaskID, Outcome: last.Outcome, Steps: last.Steps, Attempts: len(eps), Attribution: last.Attribution, Episodes: eps}
	}
	return Summarize([]TaskResult{
		task(ep("a", OutcomeSuccess, 0, 100, 200)),
		task(ep("b", OutcomeSuccess, 10*time.Second, 150)),
		task(ep("c", OutcomeFailure, 20*time.Second, 900, 950, 1000)),
		task(ep("d", OutcomeEnvError, 0, 300), ep("d", OutcomeSuccess, 70*time.Second, 400)),
		task(ep("e", OutcomeError, 30*time.Second)),
	}, 80*time.Second)
}

// The report in Chromium shows the run's counts and the interval, draws
// its charts, shows pass@k when the summary has it, and fetches nothing.
func TestReportInChromium(t *testing.T) {
	t.Parallel()
	var page bytes.Buffer
	s := reportRun()
	if err := s.WriteReport(&page, "orchard run shop"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page.String(), "<script") || !strings.Contains(page.String(), `content="default-src 'none'; style-src`) {
		t.Error("the report has a script, or no policy that forbids scripts and requests")
	}
	file := filepath.Join(t.TempDir(), "run.html")
	if err := os.WriteFile(file, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, requests := pagetest.Open(t, "file://"+file, 1100, 900)
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](`(() => {
	  const bars = (id) => Object.fromEntries([...document.querySelectorAll('#' + id + ' g[data-label]')].map(g => [g.dataset.label, g.dataset.value]));
	  return {rate: document.querySelector('[data-rate]').dataset.rate, ci: document.querySelector('#rate').textContent,
	    outcomes: bars('outcomes'), faults: bars('faults'), latency: document.querySelectorAll('#latency rect').length,
	    perMinute: document.querySelectorAll('#per-minute rect').length, tasks: document.querySelectorAll('#tasks tbody tr').length};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Rate      string            `json:"rate"`
		CI        string            `json:"ci"`
		Outcomes  map[string]string `json:"outcomes"`
		Faults    map[string]string `json:"faults"`
		Latency   int               `json:"latency"`
		PerMinute int               `json:"perMinute"`
		Tasks     int               `json:"tasks"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"success": "3", "failure": "1", "env_error": "0", "error": "1", "canceled": "0"}
	for k, v := range want {
		if got.Outcomes[k] != v {
			t.Errorf("outcome %s: %q, want %s (all: %v)", k, got.Outcomes[k], v, got.Outcomes)
		}
	}
	// 3 of 5 finished tasks: Wilson 23.1%–88.2%.
	if got.Rate != "60.0%" || !strings.Contains(got.CI, "23.1% – 88.2%") {
		t.Errorf("rate %q, interval text %q", got.Rate, got.CI)
	}
	if got.Faults["env_error unavailable/site.http_503"] != "1" || got.Faults["error unavailable/policy.unreachable"] != "1" {
		t.Errorf("causes %v", got.Faults)
	}
	if got.Latency != 10 || got.PerMinute != 12 || got.Tasks != 5 {
		t.Errorf("%d latency bins, %d per-minute slices, %d task rows", got.Latency, got.PerMinute, got.Tasks)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err == nil {
		docimg.Save(t, "report.png", shot)
	}
	for _, u := range requests() {
		if !strings.HasPrefix(u, "file://") {
			t.Errorf("the report requested %s", u)
		}
	}
}

// pass@k, once the summary's JSON carries it, is charted overall (in
// order of k) and given per task. The report reads the JSON, so it is
// decoded here from JSON that has the field.
func TestReportPassAtK(t *testing.T) {
	t.Parallel()
	s := reportRun()
	var v reportView
	b, _ := json.Marshal(s)
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"attempts":3,"pass_at_k":{"pass@3":0.8,"pass@1":0.5,"pass@10":0.9},
		"tasks":[{"task_id":"a","pass_at_k":{"pass@1":1,"pass@3":1}}]}`), &v); err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	if err := renderReport(&page, "run", s, v); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	i1, i3, i10 := strings.Index(html, `data-label="pass@1"`), strings.Index(html, `data-label="pass@3"`), strings.Index(html, `data-label="pass@10"`)
	if i1 < 0 || !(i1 < i3 && i3 < i10) {
		t.Errorf("pass@k bars missing or out of order: %d %d %d", i1, i3, i10)
	}
	for _, want := range []string{`data-value="0.80"`, "<th>pass@3</th>", "3 attempts per task", "<td>1.00</td>"} {
		if !strings.Contains(html, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
