package tasks

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/orchard/orchard/faults"
)

func TestLoadFile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file  string
		n     int
		check func(t *testing.T, ts []Task)
	}{
		{"webvoyager.jsonl", 3, func(t *testing.T, ts []Task) {
			want := Task{ID: "Allrecipes--0", Source: SourceWebVoyager, StartURL: "https://www.allrecipes.com/",
				Question: "Provide a recipe for vegetarian lasagna with more than 100 reviews.", Website: "Allrecipes"}
			if fmt.Sprint(ts[0]) != fmt.Sprint(want) {
				t.Errorf("task 0 = %+v, want %+v", ts[0], want)
			}
			if ts[2].ID != "Google Map--3" || ts[2].Website != "Google Map" {
				t.Errorf("task 2 = %+v", ts[2])
			}
		}},
		{"mind2web.json", 2, func(t *testing.T, ts []Task) {
			a, b := ts[0], ts[1]
			if a.ID != "fb7b4f784cfde003e2548fdf4e8d6b4f" || a.Source != SourceMind2Web || a.StartURL != "https://www.discogs.com/" ||
				a.Website != "https://www.discogs.com/" || a.Level != "easy" || a.ReferenceLength != 3 || !strings.HasPrefix(a.Question, "Open the page") {
				t.Errorf("task 0 = %+v", a)
			}
			if b.Question != "Find the cheapest flight from NYC to LA next Friday." || b.Level != "hard" {
				t.Errorf("task_description not read: %+v", b)
			}
		}},
		{"orchard.jsonl", 5, func(t *testing.T, ts []Task) {
			if e := ts[0].Eval; e == nil || e.Type != EvalAnswerMatch || e.Mode != ModeExact || e.References[0] != "Hello" || ts[0].MaxSteps != 10 {
				t.Errorf("task 0 = %+v", ts[0])
			}
			s := ts[1].Setup
			if ts[1].StartURL != "" || s == nil || len(s.Files) != 2 || s.Files[1].Base64 == "" || len(s.Exec) != 1 ||
				!strings.Contains(string(s.Sandbox), `"kind"`) {
				t.Errorf("task 1 setup = %+v", s)
			}
			if e := ts[1].Eval; e.Count == nil || *e.Count != 1 || e.Selector != "#done" {
				t.Errorf("task 1 eval = %+v", e)
			}
			if ts[2].Eval.MatchMode() != ModePrefix || ts[0].Source != SourceOrchard {
				t.Errorf("url_match default mode = %q", ts[2].Eval.MatchMode())
			}
			if ts[4].Eval.Type != EvalJudge || ts[4].Eval.Criteria == "" {
				t.Errorf("task 4 eval = %+v", ts[4].Eval)
			}
		}},
		{"suite.yaml", 2, func(t *testing.T, ts []Task) {
			if e := ts[0].Eval; ts[0].Suite != "smoke" || e.Mode != ModeNumeric || e.Tolerance != 0.5 || e.References[0] != "42" {
				t.Errorf("task 0 = %+v eval %+v", ts[0], e)
			}
			if ts[1].Source != SourceWebVoyager || ts[1].Suite != "smoke" {
				t.Errorf("task 1 = %+v", ts[1])
			}
		}},
		{"list.yml", 1, func(t *testing.T, ts []Task) {
			if ts[0].ID != "l-1" || ts[0].Suite != "" {
				t.Errorf("task 0 = %+v", ts[0])
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			ts, err := LoadFile("testdata/" + tt.file)
			if err != nil {
				t.Fatal(err)
			}
			if len(ts) != tt.n {
				t.Fatalf("got %d tasks, want %d", len(ts), tt.n)
			}
			tt.check(t, ts)
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	const ok = `{"id":"a","start_url":"https://example.com","question":"q"}`
	tests := []struct {
		name, file, body string
		want             []string
	}{
		{"unknown eval type", "x.jsonl", "", []string{"bad_line3.jsonl", "line 3", `unknown type "vibes"`}},
		{"syntax", "t.jsonl", ok + "\n\n{\"id\": \"b\",\n", []string{"t.jsonl", "line 3"}},
		{"missing question", "t.jsonl", ok + "\n" + `{"id":"b","start_url":"https://example.com"}`, []string{"line 2", "missing question"}},
		{"missing id", "t.jsonl", `{"start_url":"https://example.com","question":"q"}`, []string{"line 1", "missing id"}},
		{"relative url", "t.jsonl", `{"id":"a","start_url":"/x","question":"q"}`, []string{"line 1", "start_url"}},
		{"ftp url", "t.jsonl", `{"id":"a","start_url":"ftp://h/x","question":"q"}`, []string{"line 1", "start_url"}},
		{"no url no setup", "t.jsonl", `{"id":"a","question":"q"}`, []string{"line 1", "start_url"}},
		{"unknown field", "t.jsonl", `{"id":"a","start_url":"https://e.com","question":"q","eval":{"type":"js","scrpt":"1"}}`, []string{"line 1", "scrpt"}},
		{"duplicate", "t.jsonl", ok + "\n" + ok, []string{"line 2", "duplicate id"}},
		{"bad regex", "t.jsonl", `{"id":"a","start_url":"https://e.com","question":"q","eval":{"type":"answer_match","mode":"regex","references":["("]}}`, []string{"line 1", "reference"}},
		{"no references", "t.jsonl", `{"id":"a","start_url":"https://e.com","question":"q","eval":{"type":"answer_match"}}`, []string{"line 1", "references"}},
		{"bad base64", "t.jsonl", `{"id":"a","question":"q","setup":{"files":[{"path":"/f","base64":"!!"}]}}`, []string{"line 1", "base64"}},
		{"mind2web no website", "m.json", `[{"task_id":"x","confirmed_task":"q","website":"https://e.com"},{"task_id":"y","confirmed_task":"q"}]`, []string{"m.json", "index 1", "website"}},
		{"array syntax", "m.json", "[\n{\"task_id\": \"x\"},\n{oops}\n]", []string{"m.json", "line 3"}},
		{"yaml bad eval", "s.yaml", "suite: s\ntasks:\n  - id: a\n    start_url: https://e.com\n    question: q\n    eval: {type: nope}\n", []string{"s.yaml", "index 0", "unknown type"}},
		{"yaml bad shape", "s.yaml", "suites: s\n", []string{"s.yaml"}},
		{"empty", "t.jsonl", "\n// nothing\n", []string{"no tasks"}},
		{"exec no command", "t.jsonl", `{"id":"a","start_url":"https://e.com","question":"q","eval":{"type":"exec","text":"x"}}`, []string{"line 1", "exec needs command"}},
		{"vnc sandbox", "t.jsonl", `{"id":"a","question":"q","setup":{"sandbox":{"kind":"vnc"}}}`, []string{"line 1", `setup.sandbox.kind "vnc"`}},
		{"url_match in a shell", "t.jsonl", `{"id":"a","question":"q","setup":{"sandbox":{"kind":"shell"}},"eval":{"type":"url_match","url":"https://e.com"}}`, []string{"line 1", "shell episode has none"}},
		{"repo unknown field", "t.jsonl", `{"id":"a","question":"q","setup":{"repo":{"path":"/r","comit":"abc"}}}`, []string{"line 1", "comit"}},
		{"repo path and tarball", "t.jsonl", `{"id":"a","question":"q","setup":{"repo":{"path":"/r","tarball":"/r.tar"}}}`, []string{"line 1", "one of path and tarball"}},
		{"repo neither", "t.jsonl", `{"id":"a","question":"q","setup":{"repo":{"commit":"abc"}}}`, []string{"line 1", "one of path and tarball"}},
		{"repo commit option", "t.jsonl", `{"id":"a","question":"q","setup":{"repo":{"path":"/r","commit":"--upload-pack=x"}}}`, []string{"line 1", "setup.repo.commit"}},
		{"repo commit too long", "t.jsonl", `{"id":"a","question":"q","setup":{"repo":{"path":"/r","commit":"` + strings.Repeat("a", 201) + `"}}}`, []string{"line 1", "setup.repo.commit"}},
		{"repo not a tarball", "t.jsonl", `{"id":"a","question":"q","setup":{"repo":{"tarball":"/r.zip"}}}`, []string{"line 1", ".tgz"}},
		{"repo relative dir", "t.jsonl", `{"id":"a","question":"q","setup":{"repo":{"path":"/r","dir":"src"}}}`, []string{"line 1", "setup.repo.dir"}},
		{"tests without placeholder", "t.jsonl", `{"id":"a","question":"q","setup":{"sandbox":{"kind":"shell"}},"eval":{"type":"exec","command":"pytest","fail_to_pass":["t1"]}}`, []string{"line 1", "{test}"}},
		{"placeholder without tests", "t.jsonl", `{"id":"a","question":"q","setup":{"sandbox":{"kind":"shell"}},"eval":{"type":"exec","command":"pytest {test}"}}`, []string{"line 1", "{test}"}},
		{"empty test name", "t.jsonl", `{"id":"a","question":"q","setup":{"sandbox":{"kind":"shell"}},"eval":{"type":"exec","command":"pytest {test}","pass_to_pass":[" "]}}`, []string{"line 1", "empty test name"}},
		{"tests on answer_match", "t.jsonl", `{"id":"a","question":"q","setup":{"sandbox":{"kind":"shell"}},"eval":{"type":"answer_match","references":["x"],"fail_to_pass":["t"]}}`, []string{"line 1", "belong to an exec eval"}},
		{"misspelt fail_to_pass", "t.jsonl", `{"id":"a","question":"q","setup":{"sandbox":{"kind":"shell"}},"eval":{"type":"exec","command":"t {test}","fail_to_pas":["t"]}}`, []string{"line 1", "fail_to_pas"}},
		{"dom_match on a desktop", "t.jsonl", `{"id":"a","question":"q","setup":{"sandbox":{"kind":"desktop"}},"eval":{"type":"dom_match","selector":"#r"}}`, []string{"line 1", "dom_match reads the final page"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var err error
			if tt.body == "" {
				_, err = LoadFile("testdata/bad_line3.jsonl")
			} else {
				_, err = Parse(strings.NewReader(tt.body), tt.file)
			}
			if err == nil {
				t.Fatal("no error")
			}
			if !faults.Is(err, faults.CodeTaskInvalid) || faults.Of(err).Source != faults.Task {
				t.Errorf("class = %+v, want task.invalid", faults.Of(err).Info())
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestWithReferences(t *testing.T) {
	t.Parallel()
	ts, err := LoadFile("testdata/webvoyager.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	keep := &Eval{Type: EvalJudge}
	ts[1].Eval = keep
	f, err := os.Open("testdata/reference_answer.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := WithReferences(ts, f); err != nil {
		t.Fatal(err)
	}
	if e := ts[0].Eval; e == nil || e.Type != EvalAnswerMatch || e.MatchMode() != ModeContains ||
		strings.Join(e.References, "|") != "Spinach Lasagna|Easy Vegetarian Lasagna" {
		t.Errorf("task 0 eval = %+v", e)
	}
	if ts[1].Eval != keep {
		t.Errorf("existing eval replaced: %+v", ts[1].Eval)
	}
	if ts[2].Eval != nil {
		t.Errorf("task without answers got eval %+v", ts[2].Eval)
	}
	if err := WithReferences(ts, strings.NewReader("{not json")); !faults.Is(err, faults.CodeTaskInvalid) {
		t.Errorf("malformed references: %v", err)
	}
}

func TestRegistry(t *testing.T) {
	t.Parallel()
	var r Registry // the zero value is ready
	wv, err := LoadFile("testdata/webvoyager.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	m2w, err := LoadFile("testdata/mind2web.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Add("webvoyager", wv); err != nil {
		t.Fatal(err)
	}
	if err := r.Add("mind2web", m2w); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(r.List()); got != "[{mind2web 2} {webvoyager 3}]" {
		t.Errorf("List = %s", got)
	}
	got, err := r.Get("Allrecipes--1")
	if err != nil || got.Suite != "webvoyager" || got.Question != wv[1].Question {
		t.Errorf("Get = %+v, %v", got, err)
	}
	if got, err := r.Get("mind2web/fb7b4f784cfde003e2548fdf4e8d6b4f"); err != nil || got.Level != "easy" {
		t.Errorf("Get suite/id = %+v, %v", got, err)
	}
	if _, err := r.Get("nope"); !faults.Is(err, faults.CodeTaskNotFound) {
		t.Errorf("Get unknown: %v", err)
	}
	if ts := r.Tasks("mind2web"); len(ts) != 2 || ts[0].Suite != "mind2web" {
		t.Errorf("Tasks = %+v", ts)
	}
	if r.Tasks("none") != nil {
		t.Error("Tasks of unknown suite not nil")
	}

	// Duplicates within a suite are refused; across suites, a plain id is ambiguous.
	dup := []Task{wv[0], wv[0]}
	if err := r.Add("dup", dup); !faults.Is(err, faults.CodeTaskInvalid) || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("Add duplicates: %v", err)
	}
	if err := r.Add("other", wv[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get("Allrecipes--0"); !faults.Is(err, faults.CodeTaskInvalid) {
		t.Errorf("ambiguous Get: %v", err)
	}
	if got, err := r.Get("other/Allrecipes--0"); err != nil || got.Suite != "other" {
		t.Errorf("Get other/ = %+v, %v", got, err)
	}
	if err := r.Add("", wv); err == nil {
		t.Error("empty suite name accepted")
	}
	if err := r.Add("bad", []Task{{ID: "x"}}); !faults.Is(err, faults.CodeTaskInvalid) {
		t.Errorf("invalid task accepted: %v", err)
	}

	// Returned tasks are copies.
	orch, err := LoadFile("testdata/orchard.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Add("orchard", orch); err != nil {
		t.Fatal(err)
	}
	a, _ := r.Get("local-1")
	a.Eval.References[0] = "changed"
	if b, _ := r.Get("local-1"); b.Eval.References[0] != "Hello" {
		t.Error("registry shares state with callers")
	}
}

func TestRegistryConcurrent(t *testing.T) {
	t.Parallel()
	r := NewRegistry()
	ts := []Task{{ID: "a", StartURL: "https://example.com", Question: "q"}}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			suite := fmt.Sprintf("s%d", i%2)
			for range 50 {
				if err := r.Add(suite, ts); err != nil {
					t.Error(err)
				}
				r.List()
				r.Tasks(suite)
				if _, err := r.Get(suite + "/a"); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := len(r.List()); n != 2 {
		t.Errorf("%d suites, want 2", n)
	}
}

// A desktop task with an exec check loads; its setup names its kind.
func TestDesktopTask(t *testing.T) {
	t.Parallel()
	ts, err := Parse(strings.NewReader(`{"id":"d","question":"Write hello to /tmp/out.txt.","setup":{"sandbox":{"kind":"desktop","desktop":{"apps":["xterm"]}}},"eval":{"type":"exec","command":"cat /tmp/out.txt","text":"hello"}}`), "d.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if k := ts[0].Setup.Kind(); k != "desktop" {
		t.Errorf("kind %q", k)
	}
	if e := ts[0].Eval; e.Type != EvalExec || e.Command != "cat /tmp/out.txt" || e.NeedsPage() {
		t.Errorf("eval = %+v", e)
	}
	if err := ts[0].CheckKind("desktop"); err != nil {
		t.Errorf("exec on a desktop: %v", err)
	}
	page := Task{Eval: &Eval{Type: EvalURLMatch, URL: "https://e.com"}}
	if page.CheckKind("desktop") == nil || page.CheckKind("browser") != nil || page.CheckKind("") != nil {
		t.Error("url_match: CheckKind does not tell a desktop from a browser")
	}
	if (*Setup)(nil).Kind() != "" {
		t.Error("nil setup has a kind")
	}
}

func TestShellTask(t *testing.T) {
	t.Parallel()
	ts, err := Parse(strings.NewReader(`{"id":"s","question":"Fix add.","setup":{"sandbox":{"kind":"shell"},"repo":{"tarball":"/srv/r.tar.gz","commit":"v1.2","dir":"/workspace/r"},"files":[{"path":"/workspace/a.py","content":"x"}]},`+
		`"eval":{"type":"exec","command":"python3 -m unittest {test}","fail_to_pass":["t.T.test_add"],"pass_to_pass":["t.T.test_sub"]}}`), "s.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	task := ts[0]
	if task.Setup.Kind() != "shell" || task.Setup.Repo.Commit != "v1.2" || task.Setup.Repo.Dir != "/workspace/r" {
		t.Errorf("setup = %+v", task.Setup)
	}
	if e := task.Eval; len(e.FailToPass) != 1 || len(e.PassToPass) != 1 || e.NeedsPage() {
		t.Errorf("eval = %+v", e)
	}
	c := task.clone()
	c.Setup.Repo.Commit, c.Eval.FailToPass[0] = "x", "y"
	if task.Setup.Repo.Commit != "v1.2" || task.Eval.FailToPass[0] != "t.T.test_add" {
		t.Error("clone shares the repo or the test lists")
	}
}
