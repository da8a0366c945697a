package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/sites"
)

// sitesObserve keeps the suite's steps cheap: the scripted policy reads
// nothing back, and screenshots and marks dominate a step's time.
var sitesObserve = map[string]any{"screenshot": "none", "som": false, "axtree": false}

// suiteConcurrency is how many episodes run at once: each has its own
// sandbox and Chromium, and three keep two cores busy without thrashing.
const suiteConcurrency = 3

// loadBundled loads the bundled suite over HTTP, as a user would.
func loadBundled(t *testing.T, srv *testserver.Server) {
	t.Helper()
	req, _ := http.NewRequest("POST", srv.URL+"/tasks?suite="+sites.SuiteName+"&name=suite.jsonl", strings.NewReader(string(sites.SuiteJSONL())))
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	_ = json.NewDecoder(res.Body).Decode(&body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("load bundled suite: %d %v", res.StatusCode, body)
	}
}

// episodeRun is what one scripted episode did.
type episodeRun struct {
	task     string
	outcome  string
	steps    int
	errs     []string // step errors, "step N: code"
	urls     []string // the page after each step
	finish   map[string]any
	err      error // the run could not complete (an HTTP failure)
	duration time.Duration
}

func (r episodeRun) String() string {
	if r.err != nil {
		return fmt.Sprintf("%s: %v", r.task, r.err)
	}
	ev, _ := json.Marshal(r.finish["evaluation"])
	att, _ := json.Marshal(r.finish["attribution"])
	return fmt.Sprintf("%s: %s after %d steps in %s; step errors %v; pages %v; evaluation %s; attribution %s",
		r.task, r.outcome, r.steps, r.duration.Round(time.Millisecond), r.errs, r.urls, ev, att)
}

// runScripted plays actions as one episode of a bundled task and finishes it.
func runScripted(srv *testserver.Server, taskID string, actions []json.RawMessage) (r episodeRun) {
	start := time.Now()
	r.task = taskID
	defer func() { r.duration = time.Since(start) }()
	st, _, body, err := chaosCall(srv, "POST", "/episodes", map[string]any{
		"task_id": sites.SuiteName + "/" + taskID, "observe": sitesObserve, "record": false})
	if err != nil || st != 200 {
		r.err = fmt.Errorf("create episode: %d %v %v", st, body, err)
		return r
	}
	id, _ := body["episode_id"].(string)
	for _, a := range actions {
		st, _, body, err := chaosCall(srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": a})
		if err != nil || st != 200 {
			r.err = fmt.Errorf("step %d %s: %d %v %v", r.steps+1, a, st, body, err)
			_, _, _, _ = chaosCall(srv, "DELETE", "/episodes/"+id, nil)
			return r
		}
		r.steps++
		if obs, _ := body["observation"].(map[string]any); obs != nil {
			u, _ := obs["url"].(string)
			r.urls = append(r.urls, strings.TrimPrefix(u, "http://127.0.0.1:8100"))
		}
		if info, _ := body["info"].(map[string]any); info != nil && info["error"] != nil {
			e, _ := info["error"].(map[string]any)
			r.errs = append(r.errs, fmt.Sprintf("step %d %s: %v %v", r.steps, a, e["code"], e["message"]))
		}
		if body["done"] == true {
			break
		}
	}
	st, _, body, err = chaosCall(srv, "POST", "/episodes/"+id+"/finish", map[string]any{})
	if err != nil || st != 200 {
		r.err = fmt.Errorf("finish: %d %v %v", st, body, err)
		return r
	}
	r.finish = body
	r.outcome, _ = body["outcome"].(string)
	return r
}

// runAll runs each job (a task and its actions) with suiteConcurrency
// episodes at a time and returns the runs in job order.
func runAll(srv *testserver.Server, jobs []sitesJob) []episodeRun {
	out := make([]episodeRun, len(jobs))
	sem := make(chan struct{}, suiteConcurrency)
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = runScripted(srv, j.task, j.actions)
		}()
	}
	wg.Wait()
	return out
}

type sitesJob struct {
	task    string
	actions []json.RawMessage
}

// Every bundled task, played by its scripted reference policy through the
// REST API in a sandbox with the network blocked, the sites served by the
// agent inside it: at least 95% must succeed.
func TestBundledSuite(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	loadBundled(t, srv)
	suite, err := sites.Suite()
	if err != nil {
		t.Fatal(err)
	}
	jobs := make([]sitesJob, 0, len(suite))
	for _, task := range suite {
		s, ok := sites.Script(task.ID)
		if !ok {
			t.Fatalf("task %s has no script", task.ID)
		}
		jobs = append(jobs, sitesJob{task.ID, s})
	}
	start := time.Now()
	runs := runAll(srv, jobs)
	ok := 0
	for _, r := range runs {
		if r.err == nil && r.outcome == "success" {
			ok++
			t.Logf("ok   %s (%d steps, %s)", r.task, r.steps, r.duration.Round(time.Millisecond))
			continue
		}
		t.Logf("FAIL %s", r)
	}
	rate := float64(ok) / float64(len(runs))
	t.Logf("bundled suite: %d/%d succeeded (%.0f%%) in %s", ok, len(runs), 100*rate, time.Since(start).Round(time.Millisecond))
	if rate < 0.95 {
		t.Errorf("success rate %.0f%%, want at least 95%%", 100*rate)
	}
}

// Policies that do the wrong thing fail: a wrong answer given at once, a
// policy that stops before the page is in the asked-for state, one that
// does nothing — for each kind of evaluator.
func TestBundledSuiteWrongPolicies(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	loadBundled(t, srv)
	prefix := func(task string, n int) []json.RawMessage {
		s, ok := sites.Script(task)
		if !ok || len(s) < n {
			t.Fatalf("script of %s: %d steps, want at least %d", task, len(s), n)
		}
		return s[:n]
	}
	answer := func(text string) []json.RawMessage {
		b, _ := json.Marshal(map[string]string{"type": "answer", "text": text})
		return []json.RawMessage{b}
	}
	jobs := []sitesJob{
		{"shop-lamp-price", answer("It costs $49.99.")},             // answer_match numeric
		{"wiki-capital", answer("Brackenhold")},                     // answer_match contains
		{"travel-booking-ref", answer("ABC123")},                    // answer_match exact
		{"shop-add-two-bottles", prefix("shop-add-two-bottles", 3)}, // js: on the product page, nothing added
		{"wiki-river-article", prefix("wiki-river-article", 3)},     // url_match: on Port Alder, not the river
		{"recipes-risotto-two", nil},                                // dom_match: on the start page
	}
	for _, r := range runAll(srv, jobs) {
		if r.err != nil || r.outcome != "failure" {
			t.Errorf("wrong policy on %s: want failure, got %s", r.task, r)
		}
	}
}
