package server_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/sites"
	"github.com/orchard/orchard/tasks"
)

var (
	fidelityTasks = flag.Int("fidelity.tasks", 0, "BenchmarkEpisodeForkFidelity: the first N bundled tasks (0: all)")
	fidelityMatch = flag.String("fidelity.match", "", "BenchmarkEpisodeForkFidelity: only the bundled tasks whose id matches this regexp")
	fidelityRuns  = flag.Int("fidelity.ready", 5, "BenchmarkEpisodeForkFidelity: rounds of the fork-into-8 and cold create timings")
	// The benchmark's log is cut to its first lines unless -test.v; the
	// whole list of what was lost goes here.
	fidelityReport = flag.String("fidelity.report", "", "BenchmarkEpisodeForkFidelity: write every finding to this file")
)

// fidelityConcurrency is how many tasks are swept at once: each holds a
// parent and two branches, three Chromiums, and two tasks keep two cores
// busy without thrashing.
const fidelityConcurrency = 2

// stateProbe is what a branch is compared with its parent on right after
// the fork: the page, its storage and cookies, scroll and form values,
// and the start of its visible text (which shows live page state that
// none of those hold: a popup open, a message the page's script added).
const stateProbe = `JSON.stringify({url: location.href, title: document.title,
  localStorage: Object.fromEntries(Object.entries(localStorage)),
  sessionStorage: Object.fromEntries(Object.entries(sessionStorage)),
  cookie: document.cookie, scroll: [Math.round(scrollX), Math.round(scrollY)],
  forms: Array.from(document.querySelectorAll('input,select,textarea')).map(function (e) {
    return (e.id || e.name || e.tagName) + '=' + (e.type === 'checkbox' || e.type === 'radio' ? e.checked : e.value); }),
  history: history.length,
  visibleText: (document.body ? document.body.innerText : '').replace(/\s+/g, ' ').slice(0, 20000)})`

// pairResult is what came of forking one task's script at step k.
type pairResult struct {
	task     string
	k        int
	ok       bool
	outcomes []string
	lost     []string // what differed from the parent, and why a branch failed
}

// BenchmarkEpisodeForkFidelity: for every bundled task and every step k
// of its scripted solution, play the script to step k, fork the episode
// into 2, play the rest of the script in each branch and evaluate it: the
// fraction of (task, k) pairs whose branches both reach the outcome of
// the unbranched script, and for the others what state was lost (each
// branch's page, storage, cookies, scroll and form values compared with
// its parent's right after the fork). Then, in the same run, a fork of a
// browser episode into 8 ready for their next step against a cold
// episode create, and 8 cold creates at once.
//
//	go test -run '^$' -bench EpisodeForkFidelity -benchtime 1x ./server
//	    [-args -fidelity.tasks=10 -fidelity.match=travel -fidelity.ready=5 -fidelity.report=/tmp/fidelity.txt]
func BenchmarkEpisodeForkFidelity(b *testing.B) {
	testenv.RequireChromium(b)
	srv := testserver.Start(b, testserver.Options{})
	loadBundledTB(b, srv)
	suite, err := sites.Suite()
	if err != nil {
		b.Fatal(err)
	}
	if *fidelityMatch != "" {
		re := regexp.MustCompile(*fidelityMatch)
		suite = slices.DeleteFunc(suite, func(t tasks.Task) bool { return !re.MatchString(t.ID) })
	}
	if n := *fidelityTasks; n > 0 && n < len(suite) {
		suite = suite[:n]
	}
	for b.Loop() {
		var (
			mu      sync.Mutex
			results []pairResult
			refs    = map[string]string{}
			wg      sync.WaitGroup
			sem     = make(chan struct{}, fidelityConcurrency)
		)
		for _, task := range suite {
			script, ok := sites.Script(task.ID)
			if !ok {
				b.Fatalf("task %s has no script", task.ID)
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				ref := runScripted(srv, task.ID, script)
				rs := sweepTask(srv, task.ID, script, ref.outcome)
				mu.Lock()
				refs[task.ID] = ref.outcome
				results = append(results, rs...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		sort.Slice(results, func(i, j int) bool {
			if results[i].task != results[j].task {
				return results[i].task < results[j].task
			}
			return results[i].k < results[j].k
		})
		same, differed := 0, 0
		var report []string
		logf := func(format string, a ...any) {
			b.Logf(format, a...)
			report = append(report, fmt.Sprintf(format, a...))
		}
		for _, r := range results {
			if r.ok {
				same++
				if len(r.lost) > 0 {
					differed++
					logf("same outcome, state differed: %s k=%d: %s", r.task, r.k, strings.Join(r.lost, "; "))
				}
				continue
			}
			logf("LOST %s k=%d: unbranched %s, branches %v; %s", r.task, r.k, refs[r.task], r.outcomes, strings.Join(r.lost, "; "))
		}
		defer func() {
			if *fidelityReport != "" {
				if err := os.WriteFile(*fidelityReport, []byte(strings.Join(report, "\n")+"\n"), 0o644); err != nil {
					b.Error(err)
				}
			}
		}()
		frac := float64(same) / float64(max(len(results), 1))
		logf("fork fidelity: %d/%d (task, k) pairs reach the unbranched outcome in both branches (%.1f%%) over %d tasks",
			same, len(results), 100*frac, len(suite))
		logf("%d pairs reached the outcome with some state differing from the parent's", differed)
		b.ReportMetric(100*frac, "fidelity-%")
		b.ReportMetric(float64(len(results)), "pairs")

		fork, cold, cold8 := forkReadyTimes(b, srv, *fidelityRuns)
		p50 := func(d []time.Duration) float64 { return ms(percentile(d, 0.5)) }
		b.ReportMetric(p50(fork), "fork8-ready-p50-ms")
		b.ReportMetric(p50(cold), "cold1-create-p50-ms")
		b.ReportMetric(p50(cold8), "cold8-create-p50-ms")
		b.ReportMetric(p50(fork)/p50(cold8), "fork8/cold8")
	}
}

// loadBundledTB is loadBundled for a benchmark.
func loadBundledTB(b testing.TB, srv *testserver.Server) {
	b.Helper()
	req, _ := http.NewRequest("POST", srv.URL+"/tasks?suite="+sites.SuiteName+"&name=suite.jsonl", strings.NewReader(string(sites.SuiteJSONL())))
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		b.Fatalf("load bundled suite: %d", res.StatusCode)
	}
}

// sweepTask plays script as one parent episode, forking it into 2 before
// each of its steps and playing the rest of the script in each branch.
func sweepTask(srv *testserver.Server, task string, script []json.RawMessage, ref string) []pairResult {
	var out []pairResult
	st, _, body, err := chaosCall(srv, "POST", "/episodes", map[string]any{
		"task_id": sites.SuiteName + "/" + task, "observe": sitesObserve, "record": false})
	if err != nil || st != 200 {
		return []pairResult{{task: task, lost: []string{fmt.Sprintf("create parent: %d %v %v", st, body, err)}}}
	}
	parent, _ := body["episode_id"].(string)
	parentSB, _ := body["sandbox_id"].(string)
	defer chaosCall(srv, "DELETE", "/episodes/"+parent, nil) //nolint:errcheck
	for k := range script {
		r := pairResult{task: task, k: k}
		st, _, f, err := chaosCall(srv, "POST", "/episodes/"+parent+"/fork", map[string]any{"count": 2})
		if err != nil || st != 200 {
			r.lost = append(r.lost, fmt.Sprintf("fork: %d %v %v", st, f, err))
			out = append(out, r)
			break
		}
		want := probeState(srv, parentSB)
		branches, _ := f["branches"].([]any)
		var wg sync.WaitGroup
		outcomes := make([]string, len(branches))
		lost := make([][]string, len(branches))
		for i, bb := range branches {
			bm, _ := bb.(map[string]any)
			id, _ := bm["episode_id"].(string)
			sb, _ := bm["sandbox_id"].(string)
			wg.Go(func() {
				got := probeState(srv, sb)
				for _, d := range stateDiff(want, got) {
					lost[i] = append(lost[i], fmt.Sprintf("branch %d: %s", i, d))
				}
				run := playFrom(srv, id, script[k:])
				outcomes[i] = run.outcome
				if run.err != nil {
					lost[i] = append(lost[i], fmt.Sprintf("branch %d: %v", i, run.err))
				}
				if run.outcome != ref {
					lost[i] = append(lost[i], fmt.Sprintf("branch %d: step errors %v, evaluation %s", i, run.errs, mustJSON(run.finish["evaluation"])))
				}
			})
		}
		wg.Wait()
		r.outcomes = outcomes
		r.ok = len(branches) == 2
		for i := range outcomes {
			if outcomes[i] != ref {
				r.ok = false
			}
			r.lost = append(r.lost, lost[i]...)
		}
		out = append(out, r)
		st, _, sbody, err := chaosCall(srv, "POST", "/episodes/"+parent+"/step", map[string]any{"action": script[k]})
		if err != nil || st != 200 || sbody["done"] == true {
			break
		}
	}
	return out
}

// playFrom plays actions in episode id from where it is and finishes it.
func playFrom(srv *testserver.Server, id string, actions []json.RawMessage) (r episodeRun) {
	r.task = id
	for _, a := range actions {
		st, _, body, err := chaosCall(srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": a})
		if err != nil || st != 200 {
			r.err = fmt.Errorf("step %s: %d %v %v", a, st, body, err)
			_, _, _, _ = chaosCall(srv, "DELETE", "/episodes/"+id, nil)
			return r
		}
		r.steps++
		if info, _ := body["info"].(map[string]any); info != nil && info["error"] != nil {
			e, _ := info["error"].(map[string]any)
			r.errs = append(r.errs, fmt.Sprintf("%s: %v", a, e["code"]))
		}
		if body["done"] == true {
			break
		}
	}
	st, _, body, err := chaosCall(srv, "POST", "/episodes/"+id+"/finish", map[string]any{})
	if err != nil || st != 200 {
		r.err = fmt.Errorf("finish: %d %v %v", st, body, err)
		return r
	}
	r.finish = body
	r.outcome, _ = body["outcome"].(string)
	return r
}

// probeState reads stateProbe in a browser sandbox's active tab, with
// its tab count.
func probeState(srv *testserver.Server, sandboxID string) map[string]any {
	st, _, body, err := chaosCall(srv, "POST", "/sandboxes/"+sandboxID+"/browser/evaluate", map[string]any{"expression": stateProbe})
	if err != nil || st != 200 {
		return map[string]any{"probe": fmt.Sprintf("failed: %d %v %v", st, body, err)}
	}
	var m map[string]any
	s, _ := body["value"].(string)
	_ = json.Unmarshal([]byte(s), &m)
	if _, _, tabs, err := chaosCall(srv, "GET", "/sandboxes/"+sandboxID+"/browser/tabs", nil); err == nil {
		if l, ok := tabs["tabs"].([]any); ok {
			m["tabs"] = len(l)
		}
	}
	return m
}

// stateDiff names the parts of a branch's state that differ from its
// parent's.
func stateDiff(want, got map[string]any) []string {
	var d []string
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if ws, ok := want[k].(string); ok && k == "visibleText" {
			if gs, _ := got[k].(string); gs != ws {
				// Where the text parts: what the branch's page shows
				// differently.
				i := 0
				for i < min(len(ws), len(gs)) && ws[i] == gs[i] {
					i++
				}
				i = max(i-20, 0)
				d = append(d, fmt.Sprintf("visible text from %q (%d chars) -> %q (%d chars)", ws[i:min(i+120, len(ws))], len(ws), gs[i:min(i+120, len(gs))], len(gs)))
			}
			continue
		}
		w, g := string(mustJSON(want[k])), string(mustJSON(got[k]))
		if w != g {
			d = append(d, fmt.Sprintf("%s %.200s -> %.200s", k, w, g))
		}
	}
	return d
}

// forkReadyTimes times, rounds times on the same bundled task with the
// default observation: a fork of an episode at step 2 into 8 branches,
// from the request to all 8 holding their observation (ready for their
// next step), one cold episode create to its first observation, and 8
// cold creates at once.
func forkReadyTimes(b *testing.B, srv *testserver.Server, rounds int) (fork, cold, cold8 []time.Duration) {
	const task = "shop-add-two-bottles"
	script, _ := sites.Script(task)
	create := func() (string, time.Duration) {
		t0 := time.Now()
		st, _, body, err := chaosCall(srv, "POST", "/episodes", map[string]any{"task_id": sites.SuiteName + "/" + task, "record": false})
		if err != nil || st != 200 {
			b.Fatalf("create: %d %v %v", st, body, err)
		}
		return body["episode_id"].(string), time.Since(t0)
	}
	drop := func(ids ...string) {
		for _, id := range ids {
			_, _, _, _ = chaosCall(srv, "DELETE", "/episodes/"+id, nil)
		}
	}
	for range rounds {
		id, d := create()
		cold = append(cold, d)
		for _, a := range script[:2] {
			if st, _, body, err := chaosCall(srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": a}); err != nil || st != 200 {
				b.Fatalf("step: %d %v %v", st, body, err)
			}
		}
		t0 := time.Now()
		st, _, f, err := chaosCall(srv, "POST", "/episodes/"+id+"/fork", map[string]any{"count": 8})
		if err != nil || st != 200 {
			b.Fatalf("fork into 8: %d %v %v", st, f, err)
		}
		fork = append(fork, time.Since(t0))
		ids := []string{id}
		for _, bb := range f["branches"].([]any) {
			ids = append(ids, bb.(map[string]any)["episode_id"].(string))
		}
		drop(ids...)

		var wg sync.WaitGroup
		var mu sync.Mutex
		ids = ids[:0]
		t0 = time.Now()
		for range 8 {
			wg.Go(func() {
				id, _ := create()
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			})
		}
		wg.Wait()
		cold8 = append(cold8, time.Since(t0))
		drop(ids...)
	}
	return fork, cold, cold8
}
