package server_test

import (
	"bytes"
	"encoding/json"
	"github.com/orchard/orchard/faults"
	"image/gif"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// shopPage is an offline site a task's setup writes into the sandbox.
const shopPage = `<html><head><title>Shop</title></head><body>
<h1>Shop</h1>
<input id="q" placeholder="search" style="position:absolute;left:20px;top:80px;width:300px;height:30px">
<button id="go" style="position:absolute;left:340px;top:80px;width:100px;height:30px"
  onclick="location.hash='q='+encodeURIComponent(document.getElementById('q').value);document.getElementById('r').textContent='3 results for '+document.getElementById('q').value">Search</button>
<p id="r" style="position:absolute;left:20px;top:140px">no search yet</p>
</body></html>`

const shopTasks = `{"id":"search-lamp","question":"Search the shop for lamp and say how many results there are.","start_url":"file:///workspace/shop/index.html","setup":{"files":[{"path":"/workspace/shop/index.html","content":` + "%q" + `}],"exec":["test -s /workspace/shop/index.html"],"sandbox":{"block_network":true,"browser":{"viewport":{"width":800,"height":600}}}},"eval":{"type":"answer_match","mode":"numeric","references":["3"]}}
{"id":"search-dom","question":"Search for lamp.","start_url":"file:///workspace/shop/index.html","setup":{"files":[{"path":"/workspace/shop/index.html","content":` + "%q" + `}],"sandbox":{"block_network":true}},"eval":{"type":"dom_match","selector":"#r","text":"3 results for lamp"}}
{"id":"search-url","question":"Search for lamp.","start_url":"file:///workspace/shop/index.html","setup":{"files":[{"path":"/workspace/shop/index.html","content":` + "%q" + `}],"sandbox":{"block_network":true}},"eval":{"type":"url_match","mode":"contains","url":"#q=lamp"}}
`

func loadShop(t testing.TB, srv *testserver.Server) {
	t.Helper()
	body := strings.ReplaceAll(shopTasks, "%q", string(mustJSON(shopPage)))
	req, _ := http.NewRequest("POST", srv.URL+"/tasks?suite=shop&name=shop.jsonl", strings.NewReader(body))
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(raw), `"tasks":3`) {
		t.Fatalf("load tasks: %d %s", res.StatusCode, raw)
	}
}

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }

// searchSteps is the scripted policy of the shop tasks.
var searchSteps = []map[string]any{
	{"type": "click", "selector": "#q"},
	{"type": "type", "text": "lamp"},
	{"type": "click", "selector": "#go"},
}

// Episodes end to end on a real browser: a task suite loaded over HTTP,
// its setup writing an offline site into the sandbox, steps by a scripted
// policy, evaluation of each kind, the recording and its exports; a wrong
// answer is a failure; an injected browser crash ends env_error with its
// attribution, never failure.
func TestEpisodes(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	loadShop(t, srv)
	r := call(t, srv, "GET", "/tasks", nil)
	want(t, r, 200)

	run := func(task string, answer string, steps []map[string]any, sandbox map[string]any) map[string]any {
		t.Helper()
		body := map[string]any{"task_id": task, "max_steps": 10}
		if sandbox != nil {
			body["sandbox"] = sandbox
		}
		e := call(t, srv, "POST", "/episodes", body)
		want(t, e, 200)
		id := e.body["episode_id"].(string)
		if obs, _ := e.body["observation"].(map[string]any); obs == nil || obs["title"] != "Shop" {
			t.Fatalf("first observation: %s", e.raw)
		}
		for _, a := range steps {
			s := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": a})
			want(t, s, 200)
			if s.body["done"] == true {
				break
			}
		}
		f := call(t, srv, "POST", "/episodes/"+id+"/finish", map[string]any{"answer": answer})
		want(t, f, 200)
		return f.body
	}
	cases := []struct {
		task, answer, outcome string
	}{
		{"search-lamp", "There are 3 results.", "success"},
		{"search-lamp", "There are 5 results.", "failure"},
		{"search-dom", "", "success"},
		{"search-url", "", "success"},
	}
	var recID string
	for _, c := range cases {
		res := run(c.task, c.answer, searchSteps, nil)
		if res["outcome"] != c.outcome {
			t.Errorf("%s %q: outcome %v (%v), want %s", c.task, c.answer, res["outcome"], res, c.outcome)
		}
		if c.outcome == "success" && res["reward"] != 1.0 {
			t.Errorf("%s: reward %v", c.task, res["reward"])
		}
		recID, _ = res["recording_id"].(string)
	}

	// An injected crash at the second browser request (the first loads
	// the start page; the setup's exec does not count): env_error,
	// attributed to the step, never failure.
	res := run("search-lamp", "3", searchSteps, map[string]any{"faults": map[string]any{
		"faults": []map[string]any{{"kind": "browser_crash", "p": 1, "after_steps": 2, "times": 1}}}})
	att, _ := res["attribution"].(map[string]any)
	if res["outcome"] != "env_error" || att == nil || att["code"] != "browser.crashed" || att["source"] != "browser" || att["step"] != 1.0 {
		t.Errorf("crashed episode: %v", res)
	}

	// The last clean episode's recording: manifest, steps, exports.
	rec := call(t, srv, "GET", "/recordings/"+recID, nil)
	want(t, rec, 200)
	m := rec.body["manifest"].(map[string]any)
	if m["outcome"] != "success" || m["task_id"] != "search-url" || len(rec.body["steps"].([]any)) != 4 {
		t.Errorf("recording: %s", rec.raw)
	}
	if img, ct := getBody(t, srv, "/recordings/"+recID+"/steps/0/screenshot"); len(img) == 0 || !strings.HasPrefix(ct, "image/") {
		t.Errorf("step screenshot: %s", ct)
	}
	if html, _ := getBody(t, srv, "/recordings/"+recID+"/export?format=html"); !bytes.Contains(html, []byte("data:image/")) {
		t.Error("html replay has no screenshots")
	}
	g, _ := getBody(t, srv, "/recordings/"+recID+"/export?format=gif")
	if anim, err := gif.DecodeAll(bytes.NewReader(g)); err != nil || len(anim.Image) != 4 {
		t.Errorf("gif: %v", err)
	}
	if pq, _ := getBody(t, srv, "/recordings/"+recID+"/export?format=parquet"); !bytes.HasPrefix(pq, []byte("PAR1")) {
		t.Error("parquet export is not a Parquet file")
	}
	list := call(t, srv, "GET", "/recordings", nil)
	if n := len(list.body["recordings"].([]any)); n != 5 {
		t.Errorf("%d recordings, want 5", n)
	}
	// A finished episode takes no more steps; an unknown one is 404.
	if r := call(t, srv, "POST", "/episodes/nope/step", map[string]any{"action": map[string]any{"type": "wait", "ms": 1}}); r.status != 404 {
		t.Errorf("unknown episode: %d", r.status)
	}
	if r := call(t, srv, "POST", "/episodes", map[string]any{"task_id": "no-such-task"}); r.status != 404 {
		t.Errorf("unknown task: %d %s", r.status, r.raw)
	}
}

// An inline task that cannot be scored as written is refused before any
// sandbox starts: an unknown field anywhere in it (a typo), an evaluator
// without what it needs, a sandbox fragment with a typo.
func TestInlineTaskStrict(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	base := func(eval map[string]any) map[string]any {
		return map[string]any{"question": "q?", "start_url": "data:text/html,x", "eval": eval}
	}
	with := func(m map[string]any, k string, v any) map[string]any { m[k] = v; return m }
	for _, c := range []struct {
		name string
		task map[string]any
		want string
	}{
		{"answer instead of references", base(map[string]any{"type": "answer_match", "answer": "42"}), "answer"},
		{"answer_match without references", base(map[string]any{"type": "answer_match"}), "references"},
		{"url_match without url", base(map[string]any{"type": "url_match"}), "url"},
		{"dom_match without selector", base(map[string]any{"type": "dom_match", "text": "x"}), "selector"},
		{"js without script", base(map[string]any{"type": "js"}), "script"},
		{"exec without command", base(map[string]any{"type": "exec"}), "command"},
		{"typo at the top", with(base(map[string]any{"type": "judge"}), "questoin", "x"), "questoin"},
		{"typo in setup", with(base(map[string]any{"type": "judge"}), "setup", map[string]any{"exec": []string{"true"}, "flies": []any{}}), "flies"},
		{"typo in the sandbox", with(base(map[string]any{"type": "judge"}), "setup", map[string]any{"sandbox": map[string]any{"memroy": "1Gi"}}), "memroy"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := call(t, srv, "POST", "/episodes", map[string]any{"task": c.task})
			wantCode(t, r, 400, faults.CodeTaskInvalid)
			if !strings.Contains(string(r.raw), c.want) {
				t.Errorf("the error does not name %q: %s", c.want, r.raw)
			}
		})
	}
	if n := sandboxCount(t, srv); n != 0 {
		t.Errorf("refused tasks left %d sandboxes", n)
	}
}
