package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/orchard/orchard/tasks"
)

// PassAtK against values worked out by hand from 1 - C(n-c,k)/C(n,k).
func TestPassAtK(t *testing.T) {
	t.Parallel()
	tests := []struct {
		n, c, k int
		want    float64
	}{
		{5, 2, 1, 0.4},        // c/n
		{5, 2, 2, 0.7},        // 1 - C(3,2)/C(5,2) = 1 - 3/10
		{5, 2, 3, 0.9},        // 1 - C(3,3)/C(5,3) = 1 - 1/10
		{5, 2, 4, 1},          // n-c < k: every draw of 4 holds a pass
		{10, 1, 5, 0.5},       // 1 - C(9,5)/C(10,5) = 1 - 126/252
		{4, 1, 2, 0.5},        // 1 - C(3,2)/C(4,2) = 1 - 3/6
		{6, 3, 2, 0.8},        // 1 - C(3,2)/C(6,2) = 1 - 3/15
		{10, 3, 4, 1 - 1.0/6}, // 1 - C(7,4)/C(10,4) = 1 - 35/210
		{10, 0, 5, 0},         // none passed
		{10, 10, 5, 1},        // all passed
		{0, 0, 1, 0},          // nothing scored
		{2, 1, 5, 1},          // k above n is n: any pass
		{2, 0, 5, 0},          // k above n, none passed
		{200, 1, 1, 0.005},    // large n stays exact
		{200, 100, 50, 1 - 0}, // C(100,50)/C(200,50) is about 1e-17
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("n%d_c%d_k%d", tt.n, tt.c, tt.k), func(t *testing.T) {
			t.Parallel()
			if got := PassAtK(tt.n, tt.c, tt.k); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("PassAtK(%d, %d, %d) = %v, want %v", tt.n, tt.c, tt.k, got, tt.want)
			}
		})
	}
}

// Summary scoring: per task from each sample's final episode, env_error
// and canceled samples left out of n, an error a failed sample, and the
// overall figures the mean over the tasks that have a scored sample.
func TestScorePassAtK(t *testing.T) {
	t.Parallel()
	ep := func(sample int, outcome string) EpisodeResult {
		return EpisodeResult{TaskID: "x", Sample: sample, Outcome: outcome}
	}
	results := []TaskResult{
		// n=4, c=2: pass@1 0.5, pass@4 1.
		{TaskID: "a", Episodes: []EpisodeResult{ep(1, OutcomeSuccess), ep(2, OutcomeFailure), ep(3, OutcomeSuccess), ep(4, OutcomeFailure)}},
		// Sample 2 env_error then success (re-queued); sample 4's env_error
		// was never re-run: n=3, c=1: pass@1 1/3, pass@4 (k = n) 1.
		{TaskID: "b", Episodes: []EpisodeResult{ep(1, OutcomeFailure), ep(2, OutcomeEnvError), ep(3, OutcomeError), ep(2, OutcomeSuccess), ep(4, OutcomeEnvError)}},
		// n=4, c=0.
		{TaskID: "c", Episodes: []EpisodeResult{ep(1, OutcomeFailure), ep(2, OutcomeFailure), ep(3, OutcomeError), ep(4, OutcomeFailure)}},
		// Nothing scored: no pass_at_k, not in the mean.
		{TaskID: "d", Episodes: []EpisodeResult{ep(1, OutcomeEnvError), ep(2, OutcomeCanceled)}},
	}
	s := Summary{Tasks: results}
	s.ScorePassAtK(4)
	want := []struct {
		n, c   int
		p1, pk float64
	}{{4, 2, 0.5, 1}, {3, 1, 1.0 / 3, 1}, {4, 0, 0, 0}}
	for i, w := range want {
		tr := s.Tasks[i]
		if tr.Scored != w.n || tr.Passed != w.c || math.Abs(tr.PassAtK["pass@1"]-w.p1) > 1e-9 || math.Abs(tr.PassAtK["pass@4"]-w.pk) > 1e-9 {
			t.Errorf("task %s: n=%d c=%d %v, want n=%d c=%d pass@1 %v pass@4 %v", tr.TaskID, tr.Scored, tr.Passed, tr.PassAtK, w.n, w.c, w.p1, w.pk)
		}
	}
	if s.Tasks[3].PassAtK != nil {
		t.Errorf("task d: %v", s.Tasks[3].PassAtK)
	}
	if s.Attempts != 4 || math.Abs(s.PassAtK["pass@1"]-(0.5+1.0/3+0)/3) > 1e-9 || math.Abs(s.PassAtK["pass@4"]-2.0/3) > 1e-9 {
		t.Errorf("overall: attempts %d %v", s.Attempts, s.PassAtK)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(mustJSON(t, s)), &m); err != nil {
		t.Fatal(err)
	}
	if m["attempts"] != 4.0 || m["pass_at_k"].(map[string]any)["pass@4"] == nil {
		t.Errorf("json: attempts %v, pass_at_k %v", m["attempts"], m["pass_at_k"])
	}
	if tk := m["tasks"].([]any)[0].(map[string]any); tk["pass_at_k"].(map[string]any)["pass@1"] != 0.5 {
		t.Errorf("json task a: %v", tk["pass_at_k"])
	}
}

// A run with Samples: each task gets K scored episodes in real shell
// sandboxes, from a policy that solves a task on odd episodes only, and
// the summary scores them.
func TestRunPassAtK(t *testing.T) {
	srvClient := startShell(t)
	task := func(id string) tasks.Task {
		return tasks.Task{ID: id, Question: "Write ok to /workspace/out.",
			Setup: &tasks.Setup{Sandbox: json.RawMessage(`{"kind":"shell","block_network":true}`)},
			Eval:  &tasks.Eval{Type: tasks.EvalExec, Command: "cat /workspace/out", Text: "ok"}}
	}
	policy := func(task tasks.Task, attempt int) (Policy, error) {
		text := "ok"
		if attempt%2 == 0 || task.ID == "never" {
			text = "no"
		}
		steps := []json.RawMessage{mustRaw(map[string]any{"type": "write_file", "path": "/workspace/out", "content": text}), json.RawMessage(`{"type":"submit"}`)}
		return Scripted(func(string) ([]json.RawMessage, bool) { return steps, true })(task, attempt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	s, err := Run(ctx, Config{Client: srvClient, Concurrency: 2, Policy: policy, Samples: 4,
		Tasks: []tasks.Task{task("half"), task("never")}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Attempts != 4 || s.Episodes != 8 || s.Requeued != 0 {
		t.Fatalf("summary: %s", mustJSON(t, s))
	}
	half, never := s.Tasks[0], s.Tasks[1]
	if half.Scored != 4 || half.Passed != 2 || half.PassAtK["pass@1"] != 0.5 || half.PassAtK["pass@4"] != 1 || half.Outcome != OutcomeSuccess {
		t.Errorf("half: %s", mustJSON(t, half))
	}
	if never.Scored != 4 || never.Passed != 0 || never.PassAtK["pass@4"] != 0 || never.Outcome != OutcomeFailure {
		t.Errorf("never: %s", mustJSON(t, never))
	}
	if s.PassAtK["pass@1"] != 0.25 || s.PassAtK["pass@4"] != 0.5 {
		t.Errorf("overall: %v", s.PassAtK)
	}
	samples := map[int]int{}
	for _, e := range half.Episodes {
		samples[e.Sample]++
	}
	if len(samples) != 4 {
		t.Errorf("samples of half: %v", samples)
	}
}

func mustRaw(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
