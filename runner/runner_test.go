package runner

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/tasks"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// shopPage is an offline site each task's setup writes into the sandbox.
const shopPage = `<html><head><title>Shop</title></head><body>
<h1>Shop</h1>
<input id="q" placeholder="search" style="position:absolute;left:20px;top:80px;width:300px;height:30px">
<button id="go" style="position:absolute;left:340px;top:80px;width:100px;height:30px"
  onclick="document.getElementById('r').textContent='3 results for '+document.getElementById('q').value">Search</button>
<a href="#more" style="position:absolute;left:20px;top:200px">more</a>
<p id="r" style="position:absolute;left:20px;top:140px">no search yet</p>
</body></html>`

// shopTask is a task on shopPage: answer how many results a search finds
// (answer_match), or make the page show them (dom_match).
func shopTask(id string, eval tasks.Eval) tasks.Task {
	return tasks.Task{
		ID: id, Question: "Search the shop for lamp and say how many results there are.",
		StartURL: "file:///workspace/shop/index.html",
		Setup: &tasks.Setup{
			Files:   []tasks.File{{Path: "/workspace/shop/index.html", Content: shopPage}},
			Sandbox: json.RawMessage(`{"block_network":true,"browser":{"viewport":{"width":800,"height":600}}}`),
		},
		Eval: &eval,
	}
}

var (
	answerThree = tasks.Eval{Type: tasks.EvalAnswerMatch, Mode: tasks.ModeNumeric, References: []string{"3"}}
	showResults = tasks.Eval{Type: tasks.EvalDOMMatch, Selector: "#r", Text: "3 results for lamp"}
)

// shopScript solves both kinds of shop task.
var shopScript = []json.RawMessage{
	json.RawMessage(`{"type":"click","selector":"#q"}`),
	json.RawMessage(`{"type":"type","text":"lamp"}`),
	json.RawMessage(`{"type":"click","selector":"#go"}`),
	json.RawMessage(`{"type":"answer","text":"3 results"}`),
}

func shopScripts(id string) ([]json.RawMessage, bool) {
	if id == "no-script" {
		return nil, false
	}
	return shopScript, true
}

// runTimeout bounds one run of the tests.
const runTimeout = 4 * time.Minute

func start(t testing.TB) *client.Client {
	t.Helper()
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	return client.New(srv.URL, srv.APIKey)
}

func runOK(t *testing.T, cfg Config) Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	s, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return s
}

// The scripted policy solves both kinds of task, two at a time, with the
// recordings kept; a task it has no script for ends error, reported, and
// the run goes on.
func TestRunScripted(t *testing.T) {
	c := start(t)
	var mu sync.Mutex // guards events
	events := map[string]int{}
	s := runOK(t, Config{
		Client: c, Concurrency: 2, Record: true, Policy: Scripted(shopScripts),
		Tasks: []tasks.Task{shopTask("answer", answerThree), shopTask("dom", showResults), shopTask("no-script", answerThree)},
		OnEvent: func(e Event) {
			mu.Lock()
			events[e.Type]++
			mu.Unlock()
		},
	})
	if s.Success != 2 || s.Error != 1 || s.Failure != 0 || s.EnvError != 0 || s.Episodes != 3 || s.Steps != 8 {
		t.Errorf("summary: %s", mustJSON(t, s))
	}
	for _, tr := range s.Tasks[:2] {
		if tr.Outcome != OutcomeSuccess || tr.Reward == nil || *tr.Reward != 1 || tr.RecordingID == "" || tr.Attempts != 1 {
			t.Errorf("task %s: %s", tr.TaskID, mustJSON(t, tr))
		}
	}
	if a := s.Tasks[2].Attribution; a == nil || a.Code != faults.CodePolicyNoScript || a.Source != faults.Policy {
		t.Errorf("task without a script: %s", mustJSON(t, s.Tasks[2]))
	}
	if s.StepLatency.P50 <= 0 || s.StepLatency.P99 < s.StepLatency.P50 || s.EpisodesPerMinute <= 0 {
		t.Errorf("latency and rate: %s", mustJSON(t, s))
	}
	if events[EventStarted] != 2 || events[EventEnded] != 3 || events[EventStep] != 8 || events[EventTaskDone] != 3 {
		t.Errorf("events: %v", events)
	}
}

// The random policy runs every episode to an outcome within its steps.
func TestRunRandom(t *testing.T) {
	c := start(t)
	s := runOK(t, Config{
		Client: c, Concurrency: 2, MaxSteps: 4, Policy: Random(7),
		Tasks: []tasks.Task{shopTask("a", answerThree), shopTask("b", showResults)},
	})
	if s.Total != 2 || s.Success+s.Failure != 2 || s.Episodes != 2 || s.Steps < 2 || s.Steps > 8 {
		t.Fatalf("summary: %s", mustJSON(t, s))
	}
	for _, tr := range s.Tasks {
		if tr.Steps < 1 || tr.Steps > 4 {
			t.Errorf("task %s took %d steps with a budget of 4", tr.TaskID, tr.Steps)
		}
	}
}

// A policy served over HTTP drives episodes; when its endpoint fails for
// one task, that episode ends error (policy.endpoint_failed, after the
// retries) and the others go on.
func TestRunHTTPPolicy(t *testing.T) {
	c := start(t)
	var failing atomic.Int32
	pol := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Task        tasks.Task      `json:"task"`
			Step        int             `json:"step"`
			Observation json.RawMessage `json:"observation"`
			History     []Turn          `json:"history"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || len(in.Observation) == 0 || len(in.History) != in.Step-1 {
			http.Error(w, "bad request", 400)
			return
		}
		if in.Task.ID == "down" {
			failing.Add(1)
			http.Error(w, "model server overloaded", 503)
			return
		}
		if in.Step > len(shopScript) {
			_, _ = w.Write([]byte(`{"stop":true}`))
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]json.RawMessage{"action": shopScript[in.Step-1]})
	}))
	defer pol.Close()
	s := runOK(t, Config{
		Client: c, Concurrency: 2, Policy: HTTP(pol.URL, HTTPOptions{Backoff: 10 * time.Millisecond}),
		Tasks:   []tasks.Task{shopTask("up", answerThree), shopTask("down", answerThree)},
		Requeue: Requeue{MaxAttempts: 3, Budget: 5},
	})
	if s.Success != 1 || s.Error != 1 || s.EnvError != 0 || s.Episodes != 2 || s.Requeued != 0 {
		t.Errorf("summary: %s", mustJSON(t, s))
	}
	down := s.Tasks[1]
	if a := down.Attribution; down.Outcome != OutcomeError || a == nil || a.Code != faults.CodePolicyEndpointFailed || a.Source != faults.Policy || a.Step != 0 {
		t.Errorf("task with the endpoint down: %s", mustJSON(t, down))
	}
	if n := failing.Load(); n != defaultPolicyAttempts {
		t.Errorf("%d requests for the failing task, want %d", n, defaultPolicyAttempts)
	}
	if len(s.Errors) != 1 || s.Errors[0] != (FaultCount{"policy", faults.CodePolicyEndpointFailed, 1}) {
		t.Errorf("errors by cause: %v", s.Errors)
	}
}

// Episodes whose browser crashes (injected by a fault plan) end env_error,
// attributed to the crash; their tasks are re-queued up to the attempts of
// a task and the budget of the run, and never count as failures.
func TestRunRequeuesEnvErrors(t *testing.T) {
	c := start(t)
	// With after_steps 2 the crash lands on step 1, the first action
	// after the start page (as in the server's TestEpisodes). Every new
	// episode gets a fresh sandbox and plan.
	plan := json.RawMessage(`{"faults":{"faults":[{"kind":"browser_crash","p":1,"after_steps":2}]}}`)
	s := runOK(t, Config{
		Client: c, Concurrency: 2, Policy: Scripted(shopScripts), Sandbox: plan,
		Tasks:   []tasks.Task{shopTask("crash-a", answerThree), shopTask("crash-b", answerThree)},
		Requeue: Requeue{MaxAttempts: 3, Budget: 3},
	})
	// 2 tasks × 3 attempts would be 6 episodes; the budget allows 3
	// re-queues, so 5.
	if s.EnvError != 2 || s.Failure != 0 || s.Success != 0 || s.Episodes != 5 || s.Requeued != 3 || s.SuccessRate != 0 {
		t.Errorf("summary: %s", mustJSON(t, s))
	}
	if len(s.EnvErrors) != 1 || s.EnvErrors[0] != (FaultCount{"browser", faults.CodeBrowserCrashed, 5}) {
		t.Errorf("env_errors by cause: %v", s.EnvErrors)
	}
	attempts := 0
	for _, tr := range s.Tasks {
		attempts += tr.Attempts
		if a := tr.Attribution; a == nil || a.Code != faults.CodeBrowserCrashed || a.Step != 1 || tr.Attempts > 3 || len(tr.Episodes) != tr.Attempts {
			t.Errorf("task %s: %s", tr.TaskID, mustJSON(t, tr))
		}
		for _, e := range tr.Episodes {
			if e.Outcome != OutcomeEnvError {
				t.Errorf("task %s episode %d: %s", tr.TaskID, e.Attempt, e.Outcome)
			}
		}
	}
	if attempts != 5 {
		t.Errorf("%d attempts in all, want 5", attempts)
	}
}

// Canceling the run aborts the episodes in flight on the server and
// reports them canceled.
func TestRunCancelAbortsEpisodes(t *testing.T) {
	c := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	var episode atomic.Value
	blocking := func(tasks.Task, int) (Policy, error) {
		return PolicyFunc(func(ctx context.Context, _ Input) (json.RawMessage, error) {
			cancel() // the run is canceled while the policy thinks
			<-ctx.Done()
			return nil, ctx.Err()
		}), nil
	}
	s, err := Run(ctx, Config{Client: c, Policy: blocking, Tasks: []tasks.Task{shopTask("a", answerThree), shopTask("b", answerThree)},
		OnEvent: func(e Event) {
			if e.Type == EventStarted {
				episode.Store(e.EpisodeID)
			}
		}})
	if err == nil {
		t.Fatal("canceled run returned no error")
	}
	if s.Canceled != 2 || s.Episodes != 1 || s.Tasks[0].Outcome != OutcomeCanceled || s.Tasks[1].Attempts != 0 {
		t.Errorf("summary: %s", mustJSON(t, s))
	}
	id, _ := episode.Load().(string)
	st, err := c.GetEpisode(context.Background(), id)
	if err != nil || st.Status != "aborted" {
		t.Errorf("episode %q after cancel: %+v %v", id, st, err)
	}
}

// startShell starts a server for shell episodes, which need no browser.
func startShell(t testing.TB) *client.Client {
	t.Helper()
	srv := testserver.Start(t, testserver.Options{})
	return client.New(srv.URL, srv.APIKey)
}
