package runner

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	cases := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"empty", nil, 50, 0},
		{"one", []float64{7}, 99, 7},
		{"two p50 is the lower", []float64{1, 2}, 50, 1},
		{"two p90 is the upper", []float64{1, 2}, 90, 2},
		{"odd median", []float64{1, 2, 3}, 50, 2},
		{"hundred p50", hundred, 50, 50},
		{"hundred p90", hundred, 90, 90},
		{"hundred p99", hundred, 99, 99},
		{"hundred p100", hundred, 100, 100},
		{"tiny p rounds to the first", hundred, 0.001, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Percentile(c.sorted, c.p); got != c.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", c.sorted, c.p, got, c.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func att(src faults.Source, code string, step int) *Attribution {
	return &Attribution{Info: faults.Info{Source: src, Code: code}, Step: step}
}

// results is a run with every kind of outcome: a success, a failure, a
// task re-queued twice after env_errors before it succeeded, one whose
// env_errors spent its attempts, a policy error, and a canceled task.
func results() []TaskResult {
	crash := att(faults.Browser, faults.CodeBrowserCrashed, 1)
	return []TaskResult{
		{TaskID: "ok", Outcome: OutcomeSuccess, Reward: ptr(1.0), Steps: 3, Attempts: 1,
			Episodes: []EpisodeResult{{Outcome: OutcomeSuccess, EpisodeID: "e1", Steps: 3, StepMS: []float64{100, 200, 300}}}},
		{TaskID: "wrong", Outcome: OutcomeFailure, Reward: ptr(0.0), Steps: 2, Attempts: 1,
			Episodes: []EpisodeResult{{Outcome: OutcomeFailure, EpisodeID: "e2", Steps: 2, StepMS: []float64{400, 500}}}},
		{TaskID: "flaky", Outcome: OutcomeSuccess, Reward: ptr(1.0), Steps: 1, Attempts: 3,
			Episodes: []EpisodeResult{
				{Outcome: OutcomeEnvError, EpisodeID: "e3", Steps: 1, Attribution: crash, StepMS: []float64{600}},
				{Outcome: OutcomeEnvError, EpisodeID: "e4", Attribution: att(faults.Site, "site.http_503", 0)},
				{Outcome: OutcomeSuccess, EpisodeID: "e5", Steps: 1, StepMS: []float64{700}},
			}},
		{TaskID: "broken", Outcome: OutcomeEnvError, Attempts: 2, Attribution: crash,
			Episodes: []EpisodeResult{
				{Outcome: OutcomeEnvError, EpisodeID: "e6", Steps: 1, Attribution: crash, StepMS: []float64{800}},
				{Outcome: OutcomeEnvError, EpisodeID: "e7", Steps: 1, Attribution: crash, StepMS: []float64{900}},
			}},
		{TaskID: "no-policy", Outcome: OutcomeError, Attempts: 1, Attribution: att(faults.Policy, faults.CodePolicyEndpointFailed, 2),
			Episodes: []EpisodeResult{{Outcome: OutcomeError, EpisodeID: "e8", Steps: 1, Attribution: att(faults.Policy, faults.CodePolicyEndpointFailed, 2), StepMS: []float64{1000}}}},
		{TaskID: "late", Outcome: OutcomeCanceled},
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	s := Summarize(results(), 2*time.Minute)
	checks := []struct {
		name      string
		got, want any
	}{
		{"total", s.Total, 6},
		{"success", s.Success, 2},
		{"failure", s.Failure, 1},
		{"env_error", s.EnvError, 1},
		{"error", s.Error, 1},
		{"canceled", s.Canceled, 1},
		// 2 of success+failure+error = 4; env_error and canceled left out.
		{"success rate", s.SuccessRate, 0.5},
		{"episodes", s.Episodes, 8},
		{"requeued", s.Requeued, 3},
		{"steps", s.Steps, 10},
		{"p50", s.StepLatency.P50, 500.0},
		{"p90", s.StepLatency.P90, 900.0},
		{"p99", s.StepLatency.P99, 1000.0},
		{"max", s.StepLatency.Max, 1000.0},
		{"episodes per minute", s.EpisodesPerMinute, 4.0},
		{"env_errors", s.EnvErrors, []FaultCount{{"browser", "browser.crashed", 3}, {"site", "site.http_503", 1}}},
		{"errors", s.Errors, []FaultCount{{"policy", "policy.endpoint_failed", 1}}},
	}
	for _, c := range checks {
		if a, b := mustJSON(t, c.got), mustJSON(t, c.want); a != b {
			t.Errorf("%s = %s, want %s", c.name, a, b)
		}
	}
}

func TestSummarizeEmpty(t *testing.T) {
	t.Parallel()
	s := Summarize(nil, 0)
	if s.SuccessRate != 0 || s.EpisodesPerMinute != 0 || s.StepLatency != (Latency{}) || s.EnvErrors == nil {
		t.Errorf("empty summary: %+v", s)
	}
	var buf bytes.Buffer
	if err := s.WriteTable(&buf); err != nil || !strings.Contains(buf.String(), "0 tasks") {
		t.Errorf("empty table: %v\n%s", err, buf.String())
	}
}

func TestWriteTable(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := Summarize(results(), 2*time.Minute).WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"TASK       OUTCOME    REWARD  STEPS  ATTEMPTS  ATTRIBUTION\n",
		"ok         success    1       3      1         \n",
		"broken     env_error  -       0      2         browser/browser.crashed at step 1\n",
		"no-policy  error      -       0      1         policy/policy.endpoint_failed at step 2\n",
		"late       canceled   -       0      0",
		"6 tasks: 2 success, 1 failure, 1 env_error, 1 error, 1 canceled; success rate 50.0%\n",
		"8 episodes (3 re-queued), 10 steps; step latency p50 500ms p90 900ms p99 1.00s; 4.0 episodes/min over 2m0s\n",
		"env_error by cause: browser/browser.crashed ×3, site/site.http_503 ×1\n",
		"error by cause: policy/policy.endpoint_failed ×1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// The JSON form carries the counts and per-task results under stable names.
func TestSummaryJSON(t *testing.T) {
	t.Parallel()
	var m map[string]any
	if err := json.Unmarshal([]byte(mustJSON(t, Summarize(results(), time.Minute))), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"tasks", "success", "failure", "env_error", "error", "success_rate", "env_errors", "step_latency", "episodes_per_minute"} {
		if _, ok := m[k]; !ok {
			t.Errorf("summary JSON lacks %q", k)
		}
	}
	lat := m["step_latency"].(map[string]any)
	if lat["p50_ms"] != 500.0 {
		t.Errorf("step_latency: %v", lat)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
