package episodes_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/episodes"
	"github.com/orchard/orchard/evaluate"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/memory"
	"github.com/orchard/orchard/store/redis"
	"github.com/orchard/orchard/tasks"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var prefixes atomic.Int64

// backends are the stores episodes run over: every test runs on each.
func backends(t *testing.T) map[string]func(t *testing.T) store.Store {
	var srv *testenv.RedisServer
	return map[string]func(t *testing.T) store.Store{
		"memory": func(t *testing.T) store.Store { return memory.New() },
		"redis": func(t *testing.T) store.Store {
			if srv == nil {
				srv = testenv.StartRedis(t)
			}
			s, err := redis.New(ctx(t), redis.Config{URL: srv.URL(), Prefix: fmt.Sprintf("episodestest:%d:", prefixes.Add(1)),
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	}
}

// onEach runs f on a fresh episode store of each backend.
func onEach(t *testing.T, f func(t *testing.T, s *episodes.Store)) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s, err := episodes.NewStore(open(t))
			if err != nil {
				t.Fatal(err)
			}
			f(t, s)
		})
	}
}

// noDocs is a store without documents or locks.
type noDocs struct{ store.Store }

func TestNewStoreNeedsDocsAndLocks(t *testing.T) {
	for name, st := range map[string]store.Store{"nil": nil, "no docs": noDocs{}} {
		if _, err := episodes.NewStore(st); !errors.Is(err, episodes.ErrNoStore) {
			t.Errorf("%s: NewStore = %v, want ErrNoStore", name, err)
		}
	}
	if _, err := episodes.NewStore(memory.New()); err != nil {
		t.Errorf("memory: %v", err)
	}
}

var evalAnswer = &tasks.Eval{Type: "answer_match"}

func newEpisode(id string, maxSteps int) *episodes.Episode {
	task := tasks.Task{ID: "t1", StartURL: "http://example.test/", Question: "q?", Eval: evalAnswer}
	return episodes.New(id, task, api.KindBrowser, nil, episodes.Limits{MaxSteps: maxSteps}, time.Now())
}

// step runs one step of actions on ep (locked, loaded and saved as a
// server call does) with the sandbox's answer o.
func step(t *testing.T, s *episodes.Store, id string, o episodes.Outcome, actions ...string) (api.StepResult, error) {
	t.Helper()
	c, ep, lease, unlock, err := s.Acquire(ctx(t), id, true)
	if err != nil {
		return api.StepResult{}, err
	}
	defer unlock()
	if err := ep.CheckRunning(); err != nil {
		return api.StepResult{}, err
	}
	req := api.StepRequest{}
	for _, a := range actions {
		req.Actions = append(req.Actions, json.RawMessage(a))
	}
	st, err := ep.NextStep(req)
	if err != nil {
		return api.StepResult{}, err
	}
	res, _ := ep.Apply(st, o, time.Now())
	return res, s.Save(c, lease, ep)
}

func create(t *testing.T, s *episodes.Store, ep *episodes.Episode) {
	t.Helper()
	c, lease, unlock, err := s.Lock(ctx(t), ep.EpisodeID)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	first := ep.FirstStep()
	if !first.Reset || len(first.Actions) != 1 || first.Action != nil {
		t.Fatalf("first step %+v: want a reset that navigates and no policy action", first)
	}
	res, _ := ep.Apply(first, episodes.Outcome{Observation: api.StepObservation{Browser: &api.BrowserObservation{URL: "http://example.test/"}}}, time.Now())
	if res.Info.Step != 0 || res.Done || ep.Steps != 0 {
		t.Fatalf("step 0: %+v, steps %d", res, ep.Steps)
	}
	if err := s.Save(c, lease, ep); err != nil {
		t.Fatal(err)
	}
}

func TestStepsToAnAnswerAndFinish(t *testing.T) {
	onEach(t, func(t *testing.T, s *episodes.Store) {
		create(t, s, newEpisode("e1", 0))
		shot := func(n int) api.StepObservation {
			return api.StepObservation{Browser: &api.BrowserObservation{URL: fmt.Sprintf("http://example.test/%d", n),
				Screenshot: &api.Screenshot{Format: "jpeg", Data: []byte{byte(n)}}}}
		}
		for n := 1; n <= 4; n++ {
			res, err := step(t, s, "e1", episodes.Outcome{Observation: shot(n)}, `{"type":"click","x":1,"y":2}`)
			if err != nil || res.Done || res.Info.Step != n {
				t.Fatalf("step %d: %+v, %v", n, res, err)
			}
		}
		res, err := step(t, s, "e1", episodes.Outcome{}, `{"type":"answer","text":"42"}`)
		if err != nil || !res.Done || res.Info.Step != 5 {
			t.Fatalf("answer: %+v, %v", res, err)
		}
		if _, err := step(t, s, "e1", episodes.Outcome{}, `{"type":"click"}`); faults.Of(err).Code != faults.CodeEpisodeDone {
			t.Fatalf("step after the answer: %v, want %s", err, faults.CodeEpisodeDone)
		}
		ep, err := s.Load(ctx(t), "e1", true)
		if err != nil {
			t.Fatal(err)
		}
		if ep.Status != api.EpisodeDone || ep.Answer != "42" || ep.LastURL != "http://example.test/4" || len(ep.History) != 5 {
			t.Fatalf("stored: status %s answer %q last url %s history %d", ep.Status, ep.Answer, ep.LastURL, len(ep.History))
		}
		if got := ep.Screens(); len(got) != 3 || got[0][0] != 2 || got[2][0] != 4 {
			t.Fatalf("screens %v: want the last three", got)
		}
		if string(ep.History[0].Action) != `{"type":"click","x":1,"y":2}` {
			t.Fatalf("history action %s", ep.History[0].Action)
		}

		c, ep, lease, unlock, err := s.Acquire(ctx(t), "e1", true)
		if err != nil {
			t.Fatal(err)
		}
		defer unlock()
		var scored evaluate.Trajectory
		err = ep.Finish(nil, func(tr evaluate.Trajectory) (evaluate.Result, error) {
			scored = tr
			return evaluate.Result{Success: true, Reward: 1, Type: "answer_match"}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if scored.Answer != "42" || len(scored.Screenshots) != 3 || len(scored.Steps) != 5 {
			t.Fatalf("trajectory %+v", scored)
		}
		if err := s.Save(c, lease, ep); err != nil {
			t.Fatal(err)
		}
		got, err := s.Load(ctx(t), "e1", false)
		if err != nil {
			t.Fatal(err)
		}
		r := got.Result()
		if r.Outcome != api.OutcomeSuccess || r.Reward == nil || *r.Reward != 1 || r.Steps != 5 || r.Answer != "42" || !got.Ended() {
			t.Fatalf("result %+v", r)
		}
		if r.Evaluation == nil || !r.Evaluation.Success {
			t.Fatalf("evaluation %+v", r.Evaluation)
		}
	})
}

func TestEnvironmentFaultEndsTheEpisode(t *testing.T) {
	onEach(t, func(t *testing.T, s *episodes.Store) {
		create(t, s, newEpisode("e2", 0))
		if _, err := step(t, s, "e2", episodes.Outcome{Error: &faults.Info{Category: faults.ActionFailed, Source: faults.Policy,
			Code: faults.CodeActionNoSuchElement}}, `{"type":"click","element":9}`); err != nil {
			t.Fatal(err)
		}
		crash := faults.New(faults.CodeBrowserCrashed, faults.Unavailable, faults.Browser, "gone").Info()
		res, err := step(t, s, "e2", episodes.Outcome{Error: &crash}, `{"type":"click","element":1}`)
		if err != nil || !res.Done || res.Info.Error == nil || res.Info.Error.Code != faults.CodeBrowserCrashed {
			t.Fatalf("crash step: %+v, %v", res, err)
		}
		c, ep, lease, unlock, err := s.Acquire(ctx(t), "e2", true)
		if err != nil {
			t.Fatal(err)
		}
		defer unlock()
		if ep.Outcome != api.OutcomeEnvError || ep.Attribution == nil || ep.Attribution.Step != 2 || ep.Attribution.Code != faults.CodeBrowserCrashed {
			t.Fatalf("outcome %s attribution %+v", ep.Outcome, ep.Attribution)
		}
		// The evaluator is not asked: the environment's fault decided.
		if err := ep.Finish(nil, func(evaluate.Trajectory) (evaluate.Result, error) {
			t.Error("evaluated an env_error episode")
			return evaluate.Result{}, nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(c, lease, ep); err != nil {
			t.Fatal(err)
		}
		if r := ep.Result(); r.Outcome != api.OutcomeEnvError || r.Reward == nil || *r.Reward != 0 || r.Evaluation != nil {
			t.Fatalf("result %+v", r)
		}
	})
}

func TestStepBudgetAndEvalErrors(t *testing.T) {
	onEach(t, func(t *testing.T, s *episodes.Store) {
		create(t, s, newEpisode("e3", 2))
		for n := 1; n <= 2; n++ {
			res, err := step(t, s, "e3", episodes.Outcome{}, `{"type":"scroll"}`)
			if err != nil || res.Done != (n == 2) {
				t.Fatalf("step %d of 2: %+v, %v", n, res, err)
			}
		}
		c, ep, lease, unlock, err := s.Acquire(ctx(t), "e3", true)
		if err != nil {
			t.Fatal(err)
		}
		defer unlock()
		// The client's error leaves the episode to finish again.
		bad := faults.New(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Client, "bad eval")
		answer := "late"
		if err := ep.Finish(&answer, func(evaluate.Trajectory) (evaluate.Result, error) { return evaluate.Result{}, bad }); !errors.Is(err, bad) {
			t.Fatalf("finish with a client error: %v", err)
		}
		if ep.Ended() || ep.Outcome != "" {
			t.Fatalf("after a client error: status %s outcome %s", ep.Status, ep.Outcome)
		}
		// The platform's error ends it env_error.
		judge := faults.New(faults.CodeJudgeFailed, faults.Unavailable, faults.Platform, "no judge")
		if err := ep.Finish(nil, func(evaluate.Trajectory) (evaluate.Result, error) { return evaluate.Result{}, judge }); err != nil {
			t.Fatal(err)
		}
		if ep.Outcome != api.OutcomeEnvError || ep.Attribution.Code != faults.CodeJudgeFailed || ep.Attribution.Step != 2 || ep.Answer != "late" {
			t.Fatalf("outcome %s attribution %+v answer %q", ep.Outcome, ep.Attribution, ep.Answer)
		}
		if err := s.Save(c, lease, ep); err != nil {
			t.Fatal(err)
		}
	})
}

func TestAbortListAndNotFound(t *testing.T) {
	onEach(t, func(t *testing.T, s *episodes.Store) {
		create(t, s, newEpisode("old", 0))
		time.Sleep(2 * time.Millisecond)
		create(t, s, newEpisode("new", 0))
		c, ep, lease, unlock, err := s.Acquire(ctx(t), "old", false)
		if err != nil {
			t.Fatal(err)
		}
		if !ep.Abort() || ep.Abort() {
			t.Fatal("Abort: want true once, then false")
		}
		if err := s.Save(c, lease, ep); err != nil {
			t.Fatal(err)
		}
		unlock()
		list, err := s.List(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 || list[0].EpisodeID != "new" || list[1].Status != api.EpisodeAborted {
			t.Fatalf("list %+v", list)
		}
		if _, err := s.Load(ctx(t), "none", false); faults.Of(err).Code != faults.CodeEpisodeNotFound {
			t.Fatalf("load of an unknown episode: %v", err)
		}
		if _, err := step(t, s, "old", episodes.Outcome{}, `{"type":"click"}`); faults.Of(err).Code != faults.CodeEpisodeDone {
			t.Fatalf("step on an aborted episode: %v", err)
		}
	})
}

// A replica that lost the episode's lock cannot overwrite its successor's
// state.
func TestLostLeaseCannotSave(t *testing.T) {
	onEach(t, func(t *testing.T, s *episodes.Store) {
		create(t, s, newEpisode("e4", 0))
		c, ep, lease, unlock, err := s.Acquire(ctx(t), "e4", false)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Unlock(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if _, err := step(t, s, "e4", episodes.Outcome{}, `{"type":"click"}`); err != nil {
			t.Fatal(err)
		}
		ep.Steps = 99
		if err := s.Save(context.WithoutCancel(c), lease, ep); faults.Of(err).Code != faults.CodeLockLost {
			t.Fatalf("save under a lost lease: %v, want %s", err, faults.CodeLockLost)
		}
		unlock()
		got, err := s.Load(ctx(t), "e4", false)
		if err != nil || got.Steps != 1 {
			t.Fatalf("stored steps %d (%v), want the successor's 1", got.Steps, err)
		}
	})
}

func TestStepRequests(t *testing.T) {
	ep := newEpisode("e5", 0)
	if _, err := ep.NextStep(api.StepRequest{}); err == nil {
		t.Fatal("a step without an action was taken")
	} else if items, ok := faults.Of(err).FieldErrors(); !ok || len(items) != 1 || items[0].Type != "missing" {
		t.Fatalf("refusal %v: want one missing field", err)
	}
	st, err := ep.NextStep(api.StepRequest{Actions: []json.RawMessage{json.RawMessage(`{"type": "click", "x": 1}`)},
		Action: json.RawMessage(`{"type":"answer","text":"done"}`), Observe: &api.Observe{Text: true}})
	if err != nil {
		t.Fatal(err)
	}
	if string(st.Action) != `[{"type":"click","x":1},{"type":"answer","text":"done"}]` || st.Observe == nil || !st.Observe.Text {
		t.Fatalf("step %+v", st)
	}
	path, body := st.Request(false)
	if path != "/browser/actions" || len(body.Actions) != 2 {
		t.Fatalf("browser request %s %+v: want both actions", path, body)
	}
	path, body = st.Request(true)
	if path != "/desktop/actions" || len(body.Actions) != 1 || string(body.Actions[0]) != `{"type":"click","x":1}` {
		t.Fatalf("desktop request %s %+v: want the click alone", path, body)
	}
	only, _ := ep.NextStep(api.StepRequest{Action: json.RawMessage(`{"type":"answer","text":"x"}`)})
	if _, body := only.Request(true); len(body.Actions) != 1 || string(body.Actions[0]) != `{"type":"wait","ms":0}` {
		t.Fatalf("desktop request for an answer alone: %+v", body)
	}
}
