package episodes_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/episodes"
	"github.com/orchard/orchard/tasks"
)

// A shell episode: no observe settings, no start page, submit ends it
// with the answer so far, and its history keeps how each command ended
// (the output's end, bounded) for a judge.
func TestShellSteps(t *testing.T) {
	t.Parallel()
	task := tasks.Task{ID: "sh", Question: "q", Eval: &tasks.Eval{Type: tasks.EvalJudge}}
	ep := episodes.New("e1", task, api.KindShell, nil, episodes.Limits{}, time.Now())
	if !ep.Shell() || ep.Browser() || ep.Observe != nil {
		t.Fatalf("kind: shell %v browser %v observe %v", ep.Shell(), ep.Browser(), ep.Observe)
	}
	if first := ep.FirstStep(); len(first.Actions) != 0 {
		t.Errorf("step 0 acts: %s", first.Actions)
	}
	step := func(action string, obs api.ShellObservation) api.StepResult {
		t.Helper()
		st, err := ep.NextStep(api.StepRequest{Action: json.RawMessage(action)})
		if err != nil {
			t.Fatal(err)
		}
		out, _ := ep.Apply(st, episodes.Outcome{Observation: api.StepObservation{Shell: &obs}}, time.Now())
		return out
	}
	long := strings.Repeat("é", 300) + "tail"
	if r := step(`{"type":"exec","command":"make"}`, api.ShellObservation{Stdout: long, Stderr: "boom", ExitCode: 2}); r.Done {
		t.Error("exec ended the episode")
	}
	step(`{"type":"answer","text":"fixed"}`, api.ShellObservation{})
	if h := ep.History[0].Output; !strings.HasPrefix(h, "exit 2: …") || !strings.HasSuffix(h, "tail\nboom") || len(h) > 420 || !strings.Contains(h, "é") {
		t.Errorf("history output %q (%d bytes)", h, len(h))
	}
	if ep.History[1].Output != "exit 0" || ep.Answer != "fixed" || ep.Status != api.EpisodeDone {
		t.Errorf("answer step: %+v, answer %q, status %s", ep.History[1], ep.Answer, ep.Status)
	}

	ep2 := episodes.New("e2", task, api.KindShell, nil, episodes.Limits{}, time.Now())
	st, _ := ep2.NextStep(api.StepRequest{Actions: []json.RawMessage{json.RawMessage(`{"type":"answer","text":"x"}`), json.RawMessage(`{"type":"submit"}`)}})
	ep2.Apply(st, episodes.Outcome{}, time.Now())
	if ep2.Answer != "x" || ep2.Status != api.EpisodeDone {
		t.Errorf("answer then submit: answer %q, status %s", ep2.Answer, ep2.Status)
	}
}
