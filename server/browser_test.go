package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/jpeg"
	"image/png"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"
	"github.com/go-rod/rod"
	rodcdp "github.com/go-rod/rod/lib/cdp"
	"github.com/go-rod/rod/lib/proto"
	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

const testPage = `<!doctype html><html><head><title>Orchard test</title></head>
<body style="margin:0">
<button id="b" style="position:absolute;left:100px;top:100px;width:200px;height:80px"
  onclick="document.getElementById('out').textContent='clicked'">Press</button>
<input id="q" style="position:absolute;left:100px;top:300px;width:300px">
<p id="out" style="position:absolute;left:100px;top:400px">idle</p>
</body></html>`

func TestBrowserSandbox(t *testing.T) {
	srv, id := browserSandbox(t)

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
	// Scaled by half, with the frame and scale an action can name.
	req, _ = http.NewRequest("GET", srv.URL+"/sandboxes/"+id+"/browser/screenshot?format=jpeg&scale=0.5", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	img, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if cfg, err := jpeg.DecodeConfig(bytes.NewReader(img)); err != nil || cfg.Width != 400 || cfg.Height != 300 {
		t.Fatalf("screenshot at scale 0.5: %v %+v", err, cfg)
	}
	frame, _ := strconv.Atoi(resp.Header.Get("X-Orchard-Frame"))
	if resp.Header.Get("X-Orchard-Scale") != "0.5" || frame < 1 {
		t.Fatalf("screenshot headers: frame %q scale %q", resp.Header.Get("X-Orchard-Frame"), resp.Header.Get("X-Orchard-Scale"))
	}
	a = call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{"strict": true, "frame": frame,
		"action": map[string]any{"type": "hover", "x": 10, "y": 10}})
	if a.status != 200 || a.body["ok"] != true {
		t.Fatalf("an action on the screenshot's frame, strict: %d %s", a.status, a.raw)
	}
	for _, q := range []string{"scale=0", "scale=1.5", "scale=x"} {
		if r := call(t, srv, "GET", "/sandboxes/"+id+"/browser/screenshot?"+q, nil); r.status != 400 {
			t.Errorf("screenshot ?%s: %d %s", q, r.status, r.raw)
		}
	}
	tabs := call(t, srv, "GET", "/sandboxes/"+id+"/browser/tabs", nil)
	if ts, _ := tabs.body["tabs"].([]any); len(ts) != 1 {
		t.Fatalf("tabs: %s", tabs.raw)
	}

	// Chromium killed inside the sandbox: the next call waits for the
	// restart instead of failing, and says the browser was restarted.
	execWait(t, srv, id, map[string]any{"command": "pkill -KILL -f chromium; true"})
	o := call(t, srv, "GET", "/sandboxes/"+id+"/browser/observation?screenshot=none", nil)
	if o.status != 200 || o.header.Get("X-Orchard-Restarted") == "" {
		t.Fatalf("observation right after the browser died: %d (restarted %q) %s", o.status, o.header.Get("X-Orchard-Restarted"), o.raw)
	}
	// The restarted browser reopened the page it had open.
	if o.body["url"] != "file:///workspace/page.html" {
		t.Fatalf("after the restart the browser shows %v, want the page it had open", o.body["url"])
	}
	// Shell sandboxes have no browser paths.
	sh := createReady(t, srv, map[string]any{"memory": "128Mi"})
	if r := call(t, srv, "GET", "/sandboxes/"+sh+"/browser/tabs", nil); r.status != 400 {
		t.Fatalf("browser path on a shell sandbox: %d %s", r.status, r.raw)
	}
}

// browserWithPage starts a browser sandbox showing testPage.
func browserWithPage(t *testing.T) (*testserver.Server, string) {
	t.Helper()
	srv, id := browserSandbox(t)
	a := call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{
		"actions": []map[string]any{{"type": "navigate", "url": "file:///workspace/page.html"}}})
	if a.status != 200 || a.body["ok"] != true {
		t.Fatalf("navigate: %s", a.raw)
	}
	return srv, id
}

// cdpCall sends one DevTools command on conn and returns its result,
// skipping the events that arrive before it.
func cdpCall(t *testing.T, conn *websocket.Conn, id int, method string, params any) json.RawMessage {
	t.Helper()
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if err := conn.WriteJSON(msg); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		var res struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if err := conn.ReadJSON(&res); err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		if res.ID != id {
			continue
		}
		if res.Error != nil {
			t.Fatalf("%s: %s", method, res.Error)
		}
		return res.Result
	}
}

// An outside DevTools client attaches through /browser/cdp and drives the
// tab the sandbox's own session opened.
func TestBrowserCDPProxy(t *testing.T) {
	srv, id := browserWithPage(t)
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/browser/cdp"
	hdr := http.Header{"X-API-Key": {srv.APIKey}}

	// Without a key the handshake is refused.
	if _, resp, err := websocket.DefaultDialer.Dial(wsURL, nil); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("unauthenticated dial: %v %v", err, resp)
	}

	conn, _, err := websocket.DefaultDialer.Dial(wsURL, hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var ver struct {
		Product string `json:"product"`
	}
	if err := json.Unmarshal(cdpCall(t, conn, 1, "Browser.getVersion", nil), &ver); err != nil || !strings.Contains(ver.Product, "Chrom") {
		t.Fatalf("Browser.getVersion: %v %+v", err, ver)
	}
	var targets struct {
		TargetInfos []target.Info `json:"targetInfos"`
	}
	if err := json.Unmarshal(cdpCall(t, conn, 2, "Target.getTargets", nil), &targets); err != nil {
		t.Fatal(err)
	}
	var page target.ID
	for _, ti := range targets.TargetInfos {
		if ti.Type == "page" && ti.URL == "file:///workspace/page.html" {
			page = ti.TargetID
		}
	}
	if page == "" {
		t.Fatalf("the session's page is not among the targets: %+v", targets.TargetInfos)
	}

	// HTTP discovery names the proxied WebSocket.
	d := call(t, srv, "GET", "/sandboxes/"+id+"/browser/cdp/json/version", nil)
	want(t, d, 200)
	if d.body["webSocketDebuggerUrl"] != wsURL || !strings.Contains(fmt.Sprint(d.body["Browser"]), "Chrom") {
		t.Fatalf("json/version: %s", d.raw)
	}

	// chromedp's remote allocator attaches to the same tab.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	actx, acancel := remote.NewAllocator(ctx, wsURL, remote.NoModifyURL, remote.WithDialHTTPHeader(hdr))
	defer acancel()
	cctx, ccancel := chromedp.NewContext(actx, chromedp.WithTargetID(page), chromedp.WithDetachOnCancel())
	title, err := chromedp.Run(cctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(cctx, chromedp.Evaluate[string](`document.getElementById('out').textContent = 'set over cdp'`)); err != nil {
		t.Fatal(err)
	}
	ccancel()
	acancel()
	if title != "Orchard test" {
		t.Fatalf("title over cdp %q", title)
	}
	sessionSees(t, srv, id, "set over cdp", "chromedp")
}

// rod attaches through the proxy too, with the API key as a handshake
// header, drives the session's tab, and detaches without closing anything.
func TestBrowserCDPProxyRod(t *testing.T) {
	srv, id := browserWithPage(t)
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/browser/cdp"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ws := &rodcdp.WebSocket{}
	if err := ws.Connect(ctx, wsURL, http.Header{"X-API-Key": {srv.APIKey}}); err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	b := rod.New().Client(rodcdp.New().Start(ws)).Context(ctx)
	if err := b.Connect(); err != nil {
		t.Fatal(err)
	}
	pages, err := b.Pages()
	if err != nil {
		t.Fatal(err)
	}
	p, err := pages.FindByURL(`^file:///workspace/page\.html$`)
	if err != nil {
		t.Fatalf("the session's page among rod's pages: %v", err)
	}
	if info, err := p.Info(); err != nil || info.Title != "Orchard test" {
		t.Fatalf("page info over rod: %+v %v", info, err)
	}
	btn, err := p.Element("#b")
	if err != nil {
		t.Fatal(err)
	}
	if err := btn.Click(proto.InputMouseButtonLeft, 1); err != nil {
		t.Fatal(err)
	}
	out, err := p.Element("#out")
	if err != nil {
		t.Fatal(err)
	}
	if text, err := out.Text(); err != nil || text != "clicked" {
		t.Fatalf("#out after rod's click: %q %v", text, err)
	}
	ws.Close()
	sessionSees(t, srv, id, "clicked", "rod")
}

// Playwright's connectOverCDP attaches through the proxy with the API key as
// a header, finds the session's tab, clicks, screenshots and disconnects;
// the sandbox's session sees the click and keeps working.
func TestBrowserCDPProxyPlaywright(t *testing.T) {
	node, dir := testenv.RequirePlaywright(t)
	srv, id := browserWithPage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "connect.js")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"CDP_URL=ws"+strings.TrimPrefix(srv.URL, "http")+"/sandboxes/"+id+"/browser/cdp",
		"CDP_KEY="+srv.APIKey)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("playwright: %v\n%s", err, stderr.String())
	}
	var got struct {
		Title string `json:"title"`
		Out   string `json:"out"`
		PNG   bool   `json:"png"`
		Bytes int    `json:"bytes"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("playwright output %q: %v", out, err)
	}
	if got.Title != "Orchard test" || got.Out != "clicked" || !got.PNG || got.Bytes < 1000 {
		t.Fatalf("playwright saw %+v", got)
	}
	sessionSees(t, srv, id, "clicked", "playwright")
}

// sessionSees checks, after an outside DevTools client (named who) has
// detached, that the sandbox's own session still answers, shows text the
// client put on the page, and kept its single tab.
func sessionSees(t *testing.T, srv *testserver.Server, id, text, who string) {
	t.Helper()
	o := call(t, srv, "GET", "/sandboxes/"+id+"/browser/observation?screenshot=none&text=true", nil)
	want(t, o, 200)
	if !strings.Contains(fmt.Sprint(o.body["text"]), text) {
		t.Fatalf("observation after %s: %.600s", who, o.raw)
	}
	if ts, _ := call(t, srv, "GET", "/sandboxes/"+id+"/browser/tabs", nil).body["tabs"].([]any); len(ts) != 1 {
		t.Fatalf("tabs after %s detached: %v", who, ts)
	}
}

// The live view streams JPEG frames to several viewers while actions run.
func TestBrowserStream(t *testing.T) {
	srv, id := browserWithPage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func(query string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/sandboxes/"+id+"/browser/stream?fps=10&quality=50"+query, nil)
		req.Header.Set("X-API-Key", srv.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("stream: %d %s", resp.StatusCode, b)
		}
		return resp
	}
	// Two viewers at the viewport's size and one scaled down to 400 wide.
	viewers := []*http.Response{open(""), open(""), open("&width=400")}
	sizes := [][2]int{{800, 600}, {800, 600}, {400, 300}}
	defer func() {
		for _, v := range viewers {
			v.Body.Close()
		}
	}()

	// An action runs while both viewers are streaming.
	acted := make(chan error, 1)
	go func() {
		body := `{"actions":[{"type":"click","selector":"#b"}],"observe":{"screenshot":"none","text":true}}`
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/sandboxes/"+id+"/browser/actions", strings.NewReader(body))
		req.Header.Set("X-API-Key", srv.APIKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			acted <- err
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !bytes.Contains(raw, []byte(`"ok":true`)) || !bytes.Contains(raw, []byte("clicked")) {
			acted <- fmt.Errorf("click during the stream: %d %.500s", resp.StatusCode, raw)
			return
		}
		acted <- nil
	}()

	for i, v := range viewers {
		mt, params, err := mime.ParseMediaType(v.Header.Get("Content-Type"))
		if err != nil || mt != "multipart/x-mixed-replace" || params["boundary"] == "" {
			t.Fatalf("viewer %d: Content-Type %q", i, v.Header.Get("Content-Type"))
		}
		mr := multipart.NewReader(v.Body, params["boundary"])
		for n := range 2 {
			part, err := mr.NextPart()
			if err != nil {
				t.Fatalf("viewer %d part %d: %v", i, n, err)
			}
			if ct := part.Header.Get("Content-Type"); ct != "image/jpeg" {
				t.Fatalf("viewer %d part %d: Content-Type %q", i, n, ct)
			}
			img, err := jpeg.Decode(part)
			if err != nil {
				t.Fatalf("viewer %d part %d: %v", i, n, err)
			}
			if b := img.Bounds(); b.Dx() != sizes[i][0] || b.Dy() != sizes[i][1] {
				t.Fatalf("viewer %d part %d: %v, want %dx%d", i, n, b, sizes[i][0], sizes[i][1])
			}
		}
	}
	select {
	case err := <-acted:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the action did not finish while viewers streamed")
	}
	// Viewers that leave end their streams; the browser keeps answering.
	for _, v := range viewers {
		v.Body.Close()
	}
	viewers = nil
	want(t, call(t, srv, "GET", "/sandboxes/"+id+"/browser/tabs", nil), 200)
	if r := call(t, srv, "GET", "/sandboxes/"+id+"/browser/stream?fps=abc", nil); r.status != 400 {
		t.Fatalf("bad fps: %d %s", r.status, r.raw)
	}
}

// browserSandbox starts a browser sandbox (800×600) with testPage written
// to /workspace/page.html.
func browserSandbox(t *testing.T) (*testserver.Server, string) {
	t.Helper()
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
	want(t, call(t, srv, "POST", "/sandboxes/"+id+"/files", map[string]any{"path": "/workspace/page.html",
		"content": base64.StdEncoding.EncodeToString([]byte(testPage))}), 200)
	return srv, id
}

// A browser killed from outside the sandbox, between calls and under
// several callers at once: every call waits for the restart and runs,
// reads interrupted by the death are run again, and the answers that
// waited say so.
func TestBrowserRestartIsWaitedFor(t *testing.T) {
	srv, id := browserWithPage(t)
	kill := func() {
		t.Helper()
		// From the host: every Chromium process of the sandbox's cgroup.
		procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/orchard", id, "cgroup.procs"))
		if err != nil {
			procs, err = os.ReadFile(filepath.Join("/sys/fs/cgroup/orchard", id, "cgroup.procs"))
		}
		if err != nil {
			t.Fatalf("sandbox cgroup: %v", err)
		}
		n := 0
		for _, f := range strings.Fields(string(procs)) {
			pid, _ := strconv.Atoi(f)
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.Contains(exe, "chrom") {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					n++
				}
			}
		}
		if n == 0 {
			t.Fatal("no Chromium process found in the sandbox")
		}
	}

	kill()
	time.Sleep(300 * time.Millisecond) // the agent notices; the restart is under way
	a := call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{
		"actions": []map[string]any{{"type": "click", "selector": "#q"}, {"type": "type", "text": "back"}}})
	if a.status != 200 || a.body["ok"] != true || a.header.Get("X-Orchard-Restarted") == "" {
		t.Fatalf("an action during the restart: %d (restarted %q) %s", a.status, a.header.Get("X-Orchard-Restarted"), a.raw)
	}

	// Four callers reading while the browser dies under them.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var failures atomic.Int64
	var calls atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := call(t, srv, "GET", "/sandboxes/"+id+"/browser/observation?screenshot=none", nil)
				calls.Add(1)
				if o.status != 200 {
					failures.Add(1)
					t.Errorf("observation during a restart: %d %s", o.status, o.raw)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	kill()
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d observations across a restart, %d failed", calls.Load(), failures.Load())
	o := call(t, srv, "GET", "/sandboxes/"+id+"/browser/observation?screenshot=none", nil)
	if o.body["url"] != "file:///workspace/page.html" {
		t.Errorf("after the restarts the browser shows %v", o.body["url"])
	}
}
