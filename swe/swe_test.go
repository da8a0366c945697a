package swe_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/runner"
	"github.com/orchard/orchard/swe"
	"github.com/orchard/orchard/tasks"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// The suite loads as strictly as any task file: at least 12 shell tasks
// in several languages, each with FAIL_TO_PASS tests, a fix and a script.
func TestSuite(t *testing.T) {
	t.Parallel()
	ts, err := swe.Suite()
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) < 12 {
		t.Fatalf("%d tasks", len(ts))
	}
	langs := map[string]bool{}
	for _, task := range ts {
		langs[task.Website] = true
		if task.Setup.Kind() != "shell" || task.Suite != swe.SuiteName || len(task.Eval.FailToPass) == 0 || len(task.Eval.PassToPass) == 0 {
			t.Errorf("task %s: %+v", task.ID, task)
		}
		if s, ok := swe.Script(task.ID); !ok || len(s) != 3 {
			t.Errorf("task %s: no script", task.ID)
		}
	}
	if len(langs) < 4 {
		t.Errorf("languages: %v", langs)
	}
	b, err := swe.SuiteJSONL()
	if err != nil {
		t.Fatal(err)
	}
	if again, err := tasks.Parse(bytes.NewReader(b), "swe.jsonl"); err != nil || len(again) != len(ts) {
		t.Errorf("the suite file does not load back: %d tasks, %v", len(again), err)
	}
}

// Every task in real shell sandboxes: the scripted policy's fix makes it
// succeed with every FAIL_TO_PASS and PASS_TO_PASS test reported pass;
// without the fix (a policy that only submits) it fails, its FAIL_TO_PASS
// tests reported fail and its PASS_TO_PASS tests pass.
func TestSuiteInSandboxes(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	c := client.New(srv.URL, srv.APIKey)
	ts, err := swe.Suite()
	if err != nil {
		t.Fatal(err)
	}
	for i := range ts {
		ts[i].Suite = "" // sent inline: nothing to load first
	}
	submitOnly := runner.Scripted(func(string) ([]json.RawMessage, bool) {
		return []json.RawMessage{json.RawMessage(`{"type":"submit"}`)}, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	for _, tt := range []struct {
		name    string
		policy  runner.Factory
		outcome string
		f2p     string
	}{
		{"fixed", runner.Scripted(swe.Script), runner.OutcomeSuccess, "pass"},
		{"unfixed", submitOnly, runner.OutcomeFailure, "fail"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := runner.Run(ctx, runner.Config{Client: c, Tasks: ts, Policy: tt.policy, Concurrency: 2})
			if err != nil {
				t.Fatal(err)
			}
			for _, tr := range s.Tasks {
				t.Run(tr.TaskID, func(t *testing.T) {
					if tr.Outcome != tt.outcome {
						t.Fatalf("outcome %s, want %s: %+v", tr.Outcome, tt.outcome, tr)
					}
					rec, err := c.GetEpisode(ctx, tr.Episodes[0].EpisodeID)
					if err != nil {
						t.Fatal(err)
					}
					if rec.Evaluation == nil {
						t.Fatalf("no evaluation: %+v", rec)
					}
					d := rec.Evaluation.Details
					for _, list := range []struct {
						key, want string
					}{{"fail_to_pass", tt.f2p}, {"pass_to_pass", "pass"}} {
						verdicts, _ := d[list.key].(map[string]any)
						if len(verdicts) == 0 {
							t.Errorf("%s: none reported: %v", list.key, d)
						}
						for name, v := range verdicts {
							if v != list.want {
								t.Errorf("%s %s: %v, want %s (%v)", list.key, name, v, list.want, d["failed"])
							}
						}
					}
				})
			}
		})
	}
}
