package runner

import (
	"cmp"
	_ "embed" // the report's template
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Wilson is the Wilson score interval of success successes out of n
// trials at z standard deviations (1.96: 95%). Unlike p ± z·√(p(1−p)/n)
// it stays inside [0, 1] and is honest about 0/n and n/n, which small
// suites hit often.
func Wilson(success, n int, z float64) (lo, hi float64) {
	if n <= 0 {
		return 0, 1
	}
	p, nf := float64(success)/float64(n), float64(n)
	d := 1 + z*z/nf
	c := (p + z*z/(2*nf)) / d
	h := z * math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf)) / d
	return max(0, c-h), min(1, c+h)
}

// reportView is what the report shows. It is read back from the summary's
// JSON rather than from Summary's fields so that fields added to the JSON
// (pass@k) show as soon as the summary writes them.
type reportView struct {
	Tasks []struct {
		TaskID      string             `json:"task_id"`
		Outcome     string             `json:"outcome"`
		Reward      *float64           `json:"reward"`
		Steps       int                `json:"steps"`
		Attempts    int                `json:"attempts"`
		Attribution *Attribution       `json:"attribution"`
		PassAtK     map[string]float64 `json:"pass_at_k"`
	} `json:"tasks"`
	// Outcome counts are copied from Summary (renderReport): the view
	// needs no second set of their JSON names.
	Total, Success, Failure, EnvError, Error, Canceled int `json:"-"`

	SuccessRate       float64            `json:"success_rate"`
	Episodes          int                `json:"episodes"`
	Requeued          int                `json:"requeued"`
	Steps             int                `json:"steps"`
	StepLatency       Latency            `json:"step_latency"`
	ElapsedS          float64            `json:"elapsed_s"`
	EpisodesPerMinute float64            `json:"episodes_per_minute"`
	PassAtK           map[string]float64 `json:"pass_at_k"`
	Attempts          int                `json:"attempts"`
}

// bar is one bar of a chart, in the chart's own units (0..100 wide).
type bar struct {
	Label, Value, Class string
	Y, W                float64
}

type reportPage struct {
	Title       string
	Generated   string
	S           reportView
	Rate        string
	CILo, CIHi  string
	RateX       float64 // 0..100 along the success-rate axis
	LoX, HiX    float64
	N           int // tasks the rate is over
	Outcomes    []bar
	Faults      []bar
	Latency     []bar
	LatencyNote string
	PerMinute   []bar
	PassAtK     []bar
	TaskPass    []string // the per-task pass@k keys, in order
}

//go:embed report.html.tmpl
var reportTemplateText string

var reportTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"add":    func(a, b float64) float64 { return a + b },
	"mul2":   func(f float64) float64 { return 2 * f }, // bar widths 0..100 → 0..200 units
	"mul4":   func(f float64) float64 { return 4 * f }, // the rate axis is 400 units
	"height": func(b []bar) int { return 22*len(b) + 4 },
}).Parse(reportTemplateText))

// WriteReport writes s as one self-contained HTML page (inline style and
// SVG, no script, nothing fetched): the success rate with its 95% Wilson
// interval, outcome counts, env_error and error causes, the step-latency
// distribution, episodes per minute over the run, pass@k when the summary
// has it, and the tasks.
func (s Summary) WriteReport(w io.Writer, title string) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	var v reportView
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return renderReport(w, title, s, v)
}

// renderReport draws s, with v its JSON view (which may hold fields
// Summary does not have yet).
func renderReport(w io.Writer, title string, s Summary, v reportView) error {
	v.Total, v.Success, v.Failure, v.EnvError, v.Error, v.Canceled = s.Total, s.Success, s.Failure, s.EnvError, s.Error, s.Canceled
	p := reportPage{Title: title, Generated: time.Now().UTC().Format(time.RFC3339), S: v}
	p.N = s.Success + s.Failure + s.Error
	lo, hi := Wilson(s.Success, p.N, 1.96)
	p.Rate, p.CILo, p.CIHi = pct(s.SuccessRate), pct(lo), pct(hi)
	p.RateX, p.LoX, p.HiX = 100*s.SuccessRate, 100*lo, 100*hi
	p.Outcomes = bars([]string{OutcomeSuccess, OutcomeFailure, OutcomeEnvError, OutcomeError, OutcomeCanceled},
		[]float64{float64(s.Success), float64(s.Failure), float64(s.EnvError), float64(s.Error), float64(s.Canceled)}, "%.0f")
	fl, fv := causeCounts(s)
	p.Faults = bars(fl, fv, "%.0f")
	p.Latency, p.LatencyNote = latencyBars(s)
	p.PerMinute = perMinuteBars(s)
	keys := passKeys(v.PassAtK)
	pv := make([]float64, len(keys))
	for i, k := range keys {
		pv[i] = v.PassAtK[k]
	}
	p.PassAtK = bars(keys, pv, "%.2f")
	seen := map[string]bool{}
	for _, t := range v.Tasks {
		for k := range t.PassAtK {
			seen[k] = true
		}
	}
	p.TaskPass = passKeys(seen)
	return reportTemplate.Execute(w, p)
}

func pct(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

// passKeys orders "pass@1", "pass@3", "pass@10" by k.
func passKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	kOf := func(s string) int {
		n, _ := strconv.Atoi(s[min(len(s), len("pass@")):])
		return n
	}
	slices.SortFunc(keys, func(a, b string) int { return kOf(a) - kOf(b) })
	return keys
}

// bars scales values to widths 0..100 of the largest; each bar is 22
// units below the last.
func bars(labels []string, values []float64, format string) []bar {
	top := 0.0
	for _, v := range values {
		top = max(top, v)
	}
	out := make([]bar, len(labels))
	for i, l := range labels {
		w := 0.0
		if top > 0 {
			w = 100 * values[i] / top
		}
		out[i] = bar{Label: l, Value: fmt.Sprintf(format, values[i]), Class: l, Y: float64(22 * i), W: w}
	}
	return out
}

// latencyBars is a histogram of the run's step round trips in ten equal
// bins; a summary read back from JSON has only the percentiles, shown
// instead.
func latencyBars(s Summary) ([]bar, string) {
	var all []float64
	for _, t := range s.Tasks {
		for _, e := range t.Episodes {
			all = append(all, e.StepMS...)
		}
	}
	if len(all) == 0 {
		l := s.StepLatency
		return bars([]string{"p50", "p90", "p99", "max"}, []float64{l.P50, l.P90, l.P99, l.Max}, "%.0f ms"), "percentiles"
	}
	const bins = 10
	hi := slices.Max(all)
	width := max(hi/bins, 1)
	counts := make([]float64, bins)
	for _, v := range all {
		counts[min(int(v/width), bins-1)]++
	}
	labels := make([]string, bins)
	for i := range labels {
		labels[i] = fmt.Sprintf("%s–%s", fmtMS(float64(i)*width), fmtMS(float64(i+1)*width))
	}
	return bars(labels, counts, "%.0f"), fmt.Sprintf("%d steps", len(all))
}

// perMinuteBars counts the episodes that ended in each of up to 12 equal
// slices of the run, as episodes per minute.
func perMinuteBars(s Summary) []bar {
	var first time.Time
	var ends []time.Time
	for _, t := range s.Tasks {
		for _, e := range t.Episodes {
			if e.StartedAt.IsZero() {
				continue
			}
			if first.IsZero() || e.StartedAt.Before(first) {
				first = e.StartedAt
			}
			ends = append(ends, e.StartedAt.Add(time.Duration(e.DurationMS*float64(time.Millisecond))))
		}
	}
	if len(ends) == 0 {
		return nil
	}
	last := slices.MaxFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	const slots = 12
	span := max(last.Sub(first)/slots+1, time.Second)
	counts := make([]float64, slots)
	for _, e := range ends {
		counts[min(int(e.Sub(first)/span), slots-1)]++
	}
	labels := make([]string, slots)
	for i := range counts {
		counts[i] /= span.Minutes()
		labels[i] = "+" + (time.Duration(i) * span).Round(time.Second).String()
	}
	return bars(labels, counts, "%.1f/min")
}

// causeCounts counts the episodes that ended env_error or error by their
// attribution's category and code, most frequent first, as the dashboard
// does: "env_error unavailable/site.http_503".
func causeCounts(s Summary) ([]string, []float64) {
	m := map[string]int{}
	for _, t := range s.Tasks {
		for _, e := range t.Episodes {
			if e.Outcome != OutcomeEnvError && e.Outcome != OutcomeError {
				continue
			}
			cat, code := "?", "?"
			if a := e.Attribution; a != nil {
				cat, code = string(a.Category), a.Code
			}
			m[e.Outcome+" "+cat+"/"+code]++
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(m[b]-m[a], strings.Compare(a, b)) })
	vals := make([]float64, len(keys))
	for i, k := range keys {
		vals[i] = float64(m[k])
	}
	return keys, vals
}
