package runner

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/sites"
	"github.com/orchard/orchard/tasks"
)

// bundled loads the bundled suite on the server, as orchard run does, and
// returns its tasks.
func bundled(t testing.TB, c *client.Client) []tasks.Task {
	t.Helper()
	if _, err := c.LoadTasks(context.Background(), sites.SuiteName, "suite.jsonl", sites.SuiteJSONL()); err != nil {
		t.Fatal(err)
	}
	ts, err := sites.Suite()
	if err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		ts[i].Suite = sites.SuiteName
	}
	return ts
}

// A seeded random policy over the whole bundled suite: it must finish
// every episode and score low but not zero — the suite separates a policy
// that reads the page from one that does not, and is not impossible.
func TestBundledRandomPolicy(t *testing.T) {
	c := start(t)
	s := runOK(t, Config{Client: c, Tasks: bundled(t, c), Concurrency: 3, MaxSteps: 6, Policy: Random(1)})
	t.Logf("random policy: %d/%d success (%.0f%%), %d failure, %d env_error, %d error",
		s.Success, s.Total, 100*s.SuccessRate, s.Failure, s.EnvError, s.Error)
	if s.EnvError+s.Error+s.Canceled != 0 {
		t.Fatalf("random policy: episodes did not end cleanly: %+v %+v", s.EnvErrors, s.Errors)
	}
	if s.Success == 0 || s.SuccessRate > 0.3 {
		t.Fatalf("random policy success rate %.2f (%d of %d): want low and nonzero", s.SuccessRate, s.Success, s.Total)
	}
}

// The scripted policy under injected browser crashes and agent deaths:
// every episode a fault ends is env_error attributed to the browser or
// the sandbox, re-queued, and never counted as the policy's failure.
func TestBundledUnderFaults(t *testing.T) {
	c := start(t)
	all := bundled(t, c)
	var ts []tasks.Task
	for i := 0; i < len(all); i += 3 {
		ts = append(ts, all[i])
	}
	plan, _ := json.Marshal(map[string]any{"faults": map[string]any{"faults": []map[string]any{
		{"kind": "browser_crash", "p": 0.12},
		{"kind": "agent_kill", "p": 0.03},
	}}})
	s := runOK(t, Config{Client: c, Tasks: ts, Concurrency: 3, Policy: Scripted(sites.Script), Sandbox: plan,
		Requeue: Requeue{MaxAttempts: 5, Budget: 60}})
	t.Logf("under faults: %d tasks, %d episodes (%d re-queued): %d success, %d env_error; env_errors %+v",
		s.Total, s.Episodes, s.Requeued, s.Success, s.EnvError, s.EnvErrors)
	if s.Requeued == 0 {
		t.Fatalf("no episode met an injected fault: the plan did not fire")
	}
	want := map[string]string{"browser.crashed": "browser", "sandbox.died": "sandbox", "sandbox.agent_died": "sandbox"}
	for _, tr := range s.Tasks {
		if tr.Outcome == "failure" || tr.Outcome == "error" {
			t.Errorf("task %s ended %s under injected faults: %+v", tr.TaskID, tr.Outcome, tr.Episodes)
		}
		for _, ep := range tr.Episodes {
			switch ep.Outcome {
			case "success":
			case "env_error":
				if ep.Attribution == nil || want[ep.Attribution.Code] != string(ep.Attribution.Source) {
					t.Errorf("task %s attempt %d: env_error attributed %+v, want an injected browser or sandbox fault", tr.TaskID, ep.Attempt, ep.Attribution)
				}
			default:
				t.Errorf("task %s attempt %d ended %s", tr.TaskID, ep.Attempt, ep.Outcome)
			}
		}
	}
	if s.Success < s.Total*3/4 {
		t.Errorf("only %d of %d tasks succeeded within their re-queues", s.Success, s.Total)
	}
}
