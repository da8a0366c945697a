package server_test

import (
	"bytes"
	"encoding/base64"
	"image/png"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testenv"
	"github.com/orchard/orchard/internal/testserver"
)

const testPage = `<!doctype html><html><head><title>Orchard test</title></head>
<body style="margin:0">
<button id="b" style="position:absolute;left:100px;top:100px;width:200px;height:80px"
  onclick="document.getElementById('out').textContent='clicked'">Press</button>
<input id="q" style="position:absolute;left:100px;top:300px;width:300px">
<p id="out" style="position:absolute;left:100px;top:400px">idle</p>
</body></html>`

func TestBrowserSandbox(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "kind": "browser",
		"browser": map[string]any{"viewport": map[string]int{"width": 800, "height": 600}}})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=120", nil)
	if w.body["status"] != "ready" {
		t.Fatalf("browser sandbox: %s", w.raw)
	}
	up := call(t, srv, "POST", "/sandboxes/"+id+"/files", map[string]any{"path": "/workspace/page.html",
		"content": base64.StdEncoding.EncodeToString([]byte(testPage))})
	want(t, up, 200)

	// One round trip: navigate, then observe at half size.
	a := call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{
		"actions": []map[string]any{{"type": "navigate", "url": "file:///workspace/page.html"}},
		"observe": map[string]any{"screenshot": "jpeg", "width": 400, "som": true}})
	want(t, a, 200)
	obs, _ := a.body["observation"].(map[string]any)
	if a.body["ok"] != true || obs == nil || obs["title"] != "Orchard test" || obs["scale"] != 0.5 {
		t.Fatalf("navigate+observe: %.600s", a.raw)
	}
	shot := obs["screenshot"].(map[string]any)
	if shot["width"] != 400.0 || shot["height"] != 300.0 {
		t.Fatalf("screenshot %vx%v, want 400x300", shot["width"], shot["height"])
	}
	// Coordinates in the half-size screenshot land on the button (CSS 200,140).
	a = call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{
		"actions": []map[string]any{{"type": "click", "x": 100, "y": 70},
			{"type": "click", "selector": "#q"}, {"type": "type", "text": "héllo wörld"}},
		"frame": obs["frame"], "observe": map[string]any{"screenshot": "none", "text": true}})
	want(t, a, 200)
	obs = a.body["observation"].(map[string]any)
	if a.body["ok"] != true || !strings.Contains(obs["text"].(string), "clicked") {
		t.Fatalf("click at scaled coordinates: %.800s", a.raw)
	}
	// An action that fails on the page is a result, not an HTTP error.
	a = call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{
		"action": map[string]any{"type": "click", "selector": "#nope"}})
	want(t, a, 200)
	res := a.body["results"].([]any)[0].(map[string]any)
	if a.body["ok"] != false || res["error"].(map[string]any)["code"] != "action.no_such_element" {
		t.Fatalf("missing element: %s", a.raw)
	}
	// An unknown action is the policy's failure, reported in its result; a
	// body that is not a request at all is the caller's mistake.
	a = call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{"action": map[string]any{"type": "teleport"}})
	res = a.body["results"].([]any)[0].(map[string]any)
	if a.status != 200 || res["error"].(map[string]any)["code"] != "action.invalid" || res["error"].(map[string]any)["source"] != "policy" {
		t.Fatalf("unknown action: %d %s", a.status, a.raw)
	}
	bad := call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{"actions": "not a list"})
	if bad.status < 400 || bad.status >= 500 {
		t.Fatalf("malformed request: %d %s", bad.status, bad.raw)
	}

	// The screenshot path returns image bytes.
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/"+id+"/browser/screenshot?format=png", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	img, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "image/png" {
		t.Fatalf("screenshot content type %q: %.200s", resp.Header.Get("Content-Type"), img)
	}
	if cfg, err := png.DecodeConfig(bytes.NewReader(img)); err != nil || cfg.Width != 800 || cfg.Height != 600 {
		t.Fatalf("screenshot: %v %+v", err, cfg)
	}
	tabs := call(t, srv, "GET", "/sandboxes/"+id+"/browser/tabs", nil)
	if ts, _ := tabs.body["tabs"].([]any); len(ts) != 1 {
		t.Fatalf("tabs: %s", tabs.raw)
	}

	// Chromium killed inside the sandbox: classified, then restarted.
	execWait(t, srv, id, map[string]any{"command": "pkill -KILL -f chromium; true"})
	deadline := time.Now().Add(60 * time.Second)
	sawCrash := false
	for {
		o := call(t, srv, "GET", "/sandboxes/"+id+"/browser/observation?screenshot=none", nil)
		if o.status == 503 {
			if e, _ := o.body["error"].(map[string]any); e["source"] == "browser" {
				sawCrash = true
			}
		}
		if o.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("browser not back after a crash: %s", o.raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !sawCrash {
		t.Log("the restart was faster than the first probe")
	}
	// Shell sandboxes have no browser paths.
	sh := createReady(t, srv, map[string]any{"memory": "128Mi"})
	if r := call(t, srv, "GET", "/sandboxes/"+sh+"/browser/tabs", nil); r.status != 400 {
		t.Fatalf("browser path on a shell sandbox: %d %s", r.status, r.raw)
	}
}
