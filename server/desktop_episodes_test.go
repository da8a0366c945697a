package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// deskTask is a computer-use task in the OSWorld manner: a desktop with
// an xterm. Its verbs are the task's id and its eval.
const deskTask = `{"id":"%s","question":"In the terminal, write hello to /tmp/out.txt.","setup":{"sandbox":{"kind":"desktop","block_network":true,"desktop":{"width":800,"height":600,"apps":["xterm"]}}},"eval":%s}`

// outCheck is an exec eval of the file the policy was to write, looking
// for text. It gives the xterm's shell a moment to have run the command
// typed last.
func outCheck(text string) string {
	return string(mustJSON(map[string]any{"type": "exec", "text": text,
		"command": "for i in $(seq 50); do [ -s /tmp/out.txt ] && break; sleep 0.1; done; cat /tmp/out.txt"}))
}

// xtermCenter waits for the xterm window of desktop sandbox id to show
// and stay put, and for the shell in it to wait at its prompt, and returns
// the window's middle in screen pixels. Staying put matters: the window
// manager, when it starts after the xterm, reparents and moves it, and a
// click at the old place misses. So does the shell: keys typed while it
// starts can be lost as it sets up the terminal.
func xtermCenter(t *testing.T, srv *testserver.Server, id string) (int, int) {
	t.Helper()
	// The window counts once the window manager has mapped it at its size:
	// before that xterm's window can sit at 1x1+0+0 for a while on a
	// loaded machine, and a click at its "centre" hits the root window.
	j := execWait(t, srv, id, map[string]any{"command": `w() { xwininfo -root -tree | grep '("xterm"' | while read -r wid rest; do
  xwininfo -id "$wid" | grep -q IsViewable || continue
  echo "$wid $rest" | grep -Eq ' [0-9]{2,}x[0-9]{2,}\+' && { echo "$wid $rest"; break; }; done; }
prev=; for i in $(seq 100); do cur=$(w); [ -n "$cur" ] && [ "$cur" = "$prev" ] && break; prev=$cur; sleep 0.2; done
for i in $(seq 100); do sh=$(pgrep -P "$(pgrep -xo xterm)" | head -1)
  [ -n "$sh" ] && [ "$(cut -d' ' -f3 /proc/$sh/stat)" = S ] && grep -Eq 'tty|poll|select|wait_woken' /proc/$sh/wchan 2>/dev/null && break; sleep 0.1; done
echo "$cur"`})
	m := regexp.MustCompile(`(\d+)x(\d+)\+-?\d+\+-?\d+\s+\+(-?\d+)\+(-?\d+)`).FindStringSubmatch(j.Stdout)
	if m == nil {
		t.Fatalf("no xterm window: %q", j.Stdout)
	}
	num := func(s string) int { n, _ := strconv.Atoi(s); return n }
	return num(m[3]) + num(m[1])/2, num(m[4]) + num(m[2])/2
}

// Episodes in desktop sandboxes end to end: a task suite whose setup asks
// for a desktop with an xterm, a scripted policy that clicks into the
// xterm and types a command, an answer action that ends the episode, an
// exec check at finish (success with the right text, failure with a wrong
// one), and the recording with a screenshot for every step. An eval that
// reads a page cannot run on a desktop: a task error, never an episode.
func TestDesktopEpisodes(t *testing.T) {
	requireXvfb(t)
	srv := testserver.Start(t, testserver.Options{})
	suite := fmt.Sprintf(deskTask, "xterm-hello", outCheck("hello")) + "\n" + fmt.Sprintf(deskTask, "xterm-wrong", outCheck("goodbye")) + "\n"
	r := call(t, srv, "POST", "/tasks?suite=desk&name=desk.jsonl", suite)
	want(t, r, 200)

	run := func(task string) (map[string]any, string) {
		t.Helper()
		e := call(t, srv, "POST", "/episodes", map[string]any{"task_id": task, "max_steps": 10})
		want(t, e, 200)
		id, sb := e.body["episode_id"].(string), e.body["sandbox_id"].(string)
		obs, _ := e.body["observation"].(map[string]any)
		shot, _ := obs["screenshot"].(map[string]any)
		if shot == nil || shot["format"] != "jpeg" || shot["width"] != 800.0 || shot["data"] == "" {
			t.Fatalf("first observation has no screenshot: %.300s", e.raw)
		}
		if g := call(t, srv, "GET", "/episodes/"+id, nil); g.body["kind"] != "desktop" {
			t.Errorf("episode kind: %s", g.raw)
		}
		x, y := xtermCenter(t, srv, sb)
		steps := []map[string]any{
			{"type": "click", "x": x, "y": y},
			{"type": "type", "text": "echo hello > /tmp/out.txt"},
			{"type": "key", "keys": "Return"},
			{"type": "wait", "ms": 500},
			{"type": "answer", "text": "done"},
		}
		for i, a := range steps {
			s := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": a})
			want(t, s, 200)
			info, _ := s.body["info"].(map[string]any)
			if info["error"] != nil || info["step"] != float64(i+1) {
				t.Fatalf("step %d (%v): %.300s", i+1, a["type"], s.raw)
			}
			if o, _ := s.body["observation"].(map[string]any); o == nil || o["screenshot"] == nil {
				t.Errorf("step %d: no screenshot", i+1)
			}
			if done := s.body["done"] == true; done != (a["type"] == "answer") {
				t.Fatalf("step %d (%v): done %v", i+1, a["type"], done)
			}
		}
		f := call(t, srv, "POST", "/episodes/"+id+"/finish", nil)
		want(t, f, 200)
		return f.body, id
	}

	res, id := run("xterm-hello")
	ev, _ := res["evaluation"].(map[string]any)
	if res["outcome"] != "success" || res["reward"] != 1.0 || res["answer"] != "done" || ev["type"] != "exec" {
		t.Fatalf("xterm-hello: %v", res)
	}
	if d, _ := ev["details"].(map[string]any); d["exit_code"] != 0.0 || strings.TrimSpace(fmt.Sprint(d["stdout"])) != "hello" {
		t.Errorf("exec details: %v", d)
	}
	// The recording: step 0 and five steps, each with its action, frame
	// and screenshot.
	rec := call(t, srv, "GET", "/recordings/"+id, nil)
	want(t, rec, 200)
	if m := rec.body["manifest"].(map[string]any); m["kind"] != "desktop" || m["outcome"] != "success" {
		t.Errorf("manifest: %v", m)
	}
	steps := rec.body["steps"].([]any)
	if len(steps) != 6 {
		t.Fatalf("%d recorded steps, want 6: %s", len(steps), rec.raw)
	}
	for n, s := range steps {
		st := s.(map[string]any)
		if st["frame"] == nil || st["frame"].(float64) <= 0 || st["scale"] != 1.0 || st["width"] != 800.0 {
			t.Errorf("step %d: frame %v scale %v width %v", n, st["frame"], st["scale"], st["width"])
		}
		if n > 0 && !strings.Contains(fmt.Sprint(st["action"]), []string{"click", "type", "key", "wait", "answer"}[n-1]) {
			t.Errorf("step %d: action %v", n, st["action"])
		}
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/recordings/%s/steps/%d/screenshot", srv.URL, id, n), nil)
		req.Header.Set("X-API-Key", srv.APIKey)
		img, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(img.Body)
		img.Body.Close()
		if img.StatusCode != 200 || img.Header.Get("Content-Type") != "image/jpeg" || len(data) == 0 {
			t.Errorf("step %d screenshot: %d %s", n, img.StatusCode, img.Header.Get("Content-Type"))
		}
	}

	// The same work checked against a text it does not hold: failure.
	res, _ = run("xterm-wrong")
	if res["outcome"] != "failure" || res["reward"] != 0.0 {
		t.Errorf("xterm-wrong: %v", res)
	}

	// An eval that reads a page on a desktop task: refused when the suite
	// loads, and when the task comes inline; the request may not make a
	// browser task's episode a desktop one either. A task error, never an
	// episode that ends env_error.
	dom := fmt.Sprintf(deskTask, "xterm-dom", `{"type":"dom_match","selector":"#r","text":"hello"}`)
	if r := call(t, srv, "POST", "/tasks?suite=dom&name=dom.jsonl", dom); r.status != 400 || !strings.Contains(string(r.raw), `"task.invalid"`) {
		t.Errorf("load a dom_match desktop task: %d %s", r.status, r.raw)
	}
	var inline map[string]any
	if err := json.Unmarshal([]byte(dom), &inline); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]map[string]any{
		"inline task": {"task": inline},
		"request kind": {"task": map[string]any{"id": "url", "question": "q", "start_url": "file:///tmp/x.html",
			"eval": map[string]any{"type": "url_match", "url": "file:///tmp/x.html"}}, "sandbox": map[string]any{"kind": "desktop"}},
	} {
		r := call(t, srv, "POST", "/episodes", body)
		e, _ := r.body["error"].(map[string]any)
		if r.status != 400 || e["code"] != "task.invalid" || e["source"] != "task" {
			t.Errorf("%s: %d %s", name, r.status, r.raw)
		}
	}
	// Episodes run in browser, desktop or shell sandboxes only.
	if r := call(t, srv, "POST", "/episodes", map[string]any{"task_id": "xterm-hello", "sandbox": map[string]any{"kind": "vnc"}}); r.status != 422 || !strings.Contains(string(r.raw), "kind") {
		t.Errorf("vnc episode: %d %s", r.status, r.raw)
	}
	if list := call(t, srv, "GET", "/episodes", nil); strings.Count(string(list.raw), `"kind":"desktop"`) != 2 {
		t.Errorf("episodes: %s", list.raw)
	}
}

// An exec eval in a browser episode runs in the browser's sandbox: the
// file the task's setup wrote is there.
func TestBrowserEpisodeExecEval(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	for _, c := range []struct{ text, outcome string }{{"3 results", "success"}, {"no such text", "failure"}} {
		task := map[string]any{"id": "exec-" + c.outcome, "question": "Look at the page.", "start_url": "file:///workspace/page.html",
			"setup": map[string]any{"files": []map[string]any{{"path": "/workspace/page.html", "content": "<title>Page</title><p>3 results</p>"}},
				"sandbox": map[string]any{"block_network": true}},
			"eval": map[string]any{"type": "exec", "command": "cat /workspace/page.html", "text": c.text}}
		e := call(t, srv, "POST", "/episodes", map[string]any{"task": task})
		want(t, e, 200)
		if obs, _ := e.body["observation"].(map[string]any); obs["title"] != "Page" {
			t.Fatalf("first observation: %.300s", e.raw)
		}
		f := call(t, srv, "POST", "/episodes/"+e.body["episode_id"].(string)+"/finish", nil)
		want(t, f, 200)
		if f.body["outcome"] != c.outcome {
			t.Errorf("text %q: %s", c.text, f.raw)
		}
	}
}
