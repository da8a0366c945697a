package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/browser"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// The dashboard's files are public and locked down; the data behind them
// is not.
func TestDashboardFiles(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	cases := []struct {
		path, contentType, has string
	}{
		{"/ui", "text/html", `<script src="/ui/app.js" defer></script>`},
		{"/ui/app.js", "text/javascript", "X-API-Key"},
		{"/ui/runs.js", "text/javascript", "wilson"},
		{"/ui/app.css", "text/css", "#viewer"},
	}
	var page string
	for _, c := range cases {
		res, err := http.Get(srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), c.contentType) {
			t.Errorf("GET %s without a key: %d %q", c.path, res.StatusCode, res.Header.Get("Content-Type"))
		}
		if !strings.Contains(string(body), c.has) {
			t.Errorf("GET %s: no %q in the body", c.path, c.has)
		}
		csp := res.Header.Get("Content-Security-Policy")
		for _, d := range []string{"script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "default-src 'none'"} {
			if !strings.Contains(csp, d) {
				t.Errorf("GET %s: CSP %q lacks %q", c.path, csp, d)
			}
		}
		if res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", c.path)
		}
		if c.path == "/ui" {
			page = string(body)
		}
	}
	// The page has no inline script for the CSP to have to allow.
	scripts := strings.NewReplacer(`<script src="/ui/app.js" defer></script>`, "", `<script src="/ui/runs.js" defer></script>`, "")
	if strings.Contains(scripts.Replace(page), "<script") {
		t.Error("the dashboard page has an inline script")
	}
	if r := call(t, srv, "GET", "/sandboxes", nil, "wrong"); r.status != 403 {
		t.Errorf("the data still needs a key: %d", r.status)
	}
}

// The dashboard in a real Chromium against a real server: a wrong key is
// refused with the server's message, the right one shows the sandboxes
// (labels that look like HTML stay text), a browser sandbox's live view
// draws frames from its MJPEG stream, and a sandbox is deleted with two
// clicks.
func TestDashboardInChromium(t *testing.T) {
	path := testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	const payload = `<img src=x onerror="document.title='pwned'">`
	shell := createReady(t, srv, map[string]any{"labels": map[string]string{"team": payload}})
	web := createReady(t, srv, map[string]any{"kind": "browser", "memory": "1Gi"})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := browser.Launch(ctx, browser.Options{ExecPath: path})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	defer b.Close()
	do := func(t testing.TB, a ...browser.Action) {
		t.Helper()
		res, err := b.Do(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if !r.OK {
				t.Fatalf("action %d (%s): %+v", i, a[i].Type, r.Error)
			}
		}
	}
	eval := func(t testing.TB, expr string, v any) {
		t.Helper()
		raw, err := b.Evaluate(ctx, expr)
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatalf("evaluate %s: %s: %v", expr, raw, err)
		}
	}
	// waitFor polls a JavaScript condition in the page.
	waitFor := func(t testing.TB, what, cond string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var ok bool
			eval(t, "!!("+cond+")", &ok)
			if ok {
				return
			}
			if time.Now().After(deadline) {
				var page string
				eval(t, `document.body.innerText`, &page)
				t.Fatalf("%s: not within 30 s; the page shows:\n%s", what, page)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	login := func(key string) {
		t.Helper()
		do(t, browser.Action{Type: browser.ActType, Selector: "#key", Text: key, Clear: true},
			browser.Action{Type: browser.ActKey, Keys: "Enter"})
	}

	do(t, browser.Action{Type: browser.ActNavigate, URL: srv.URL + "/ui"})
	waitFor(t, "the key form", `!document.querySelector('#login').hidden`)
	login("not-the-key")
	waitFor(t, "the refusal", `document.querySelector('#error').textContent.includes('Invalid API key')`)
	login(srv.APIKey)
	row := func(id string) string {
		return fmt.Sprintf(`document.querySelector('#sandboxes tr[data-id="%s"]')`, id)
	}
	waitFor(t, "both sandboxes listed", row(shell)+` && `+row(web))

	var labels struct {
		Text   string `json:"text"`
		Images int    `json:"images"`
		Title  string `json:"title"`
	}
	eval(t, `(() => { const r = `+row(shell)+`; return {text: r.textContent, images: r.querySelectorAll('img').length, title: document.title}; })()`, &labels)
	if !strings.Contains(labels.Text, "team="+payload) || labels.Images != 0 || labels.Title != "Orchard" {
		t.Errorf("a label that looks like HTML: row text %q, %d img elements, title %q", labels.Text, labels.Images, labels.Title)
	}
	var capacity string
	eval(t, `document.querySelector('#resources dl').textContent`, &capacity)
	if !strings.Contains(capacity, "allocatable") || !strings.Contains(capacity, "sandboxes2") {
		t.Errorf("capacity panel: %q", capacity)
	}

	// The browser sandbox's live view: frames decoded from the stream.
	do(t, browser.Action{Type: browser.ActClick, Selector: fmt.Sprintf(`button[data-view="%s"]`, web)})
	waitFor(t, "live view frames", `(() => { const i = document.querySelector('#viewer img'); return Number(i.dataset.frames) >= 2 && i.complete && i.naturalWidth === 800; })()`)
	do(t, browser.Action{Type: browser.ActClick, Selector: "#viewer-close"})
	waitFor(t, "live view closed", `document.querySelector('#viewer').hidden`)

	// A desktop sandbox's live view: its screen, polled.
	t.Run("desktop", func(t *testing.T) {
		requireXvfb(t)
		desk := createReady(t, srv, map[string]any{"kind": "desktop", "desktop": map[string]any{"width": 1280, "height": 800}})
		view := fmt.Sprintf(`button[data-view="%s"]`, desk)
		waitFor(t, "the desktop's view button", `document.querySelector('`+view+`')`)
		do(t, browser.Action{Type: browser.ActClick, Selector: view})
		waitFor(t, "desktop frames", `(() => { const i = document.querySelector('#viewer img'); return Number(i.dataset.frames) >= 2 && i.complete && i.naturalWidth === 800 && i.naturalHeight === 500; })()`)
		do(t, browser.Action{Type: browser.ActClick, Selector: "#viewer-close"})
		waitFor(t, "live view closed", `document.querySelector('#viewer').hidden`)
	})

	// The exec console runs a command in the shell sandbox and shows its
	// output and exit code, as text.
	do(t, browser.Action{Type: browser.ActClick, Selector: fmt.Sprintf(`button[data-exec="%s"]`, shell)})
	do(t, browser.Action{Type: browser.ActType, Selector: "#console-cmd", Text: `echo $((6*7)); echo '<b>x</b>' >&2; exit 3`},
		browser.Action{Type: browser.ActKey, Keys: "Enter"})
	waitFor(t, "the command's exit", `document.querySelector('#console-out [data-exit]')`)
	var console struct {
		Text  string `json:"text"`
		Exit  string `json:"exit"`
		Bolds int    `json:"bolds"`
	}
	eval(t, `(() => { const o = document.querySelector('#console-out'); return {text: o.textContent, exit: o.querySelector('[data-exit]').dataset.exit, bolds: o.querySelectorAll('b').length}; })()`, &console)
	if !strings.Contains(console.Text, "42") || !strings.Contains(console.Text, "<b>x</b>") || console.Exit != "3" || console.Bolds != 0 {
		t.Errorf("exec console: %+v", console)
	}
	do(t, browser.Action{Type: browser.ActClick, Selector: "#console-close"})

	// Delete: the first click only arms the button.
	del := fmt.Sprintf(`button[data-delete="%s"]`, shell)
	do(t, browser.Action{Type: browser.ActClick, Selector: del})
	waitFor(t, "armed", `document.querySelector('`+del+`').textContent === 'confirm delete'`)
	if r := call(t, srv, "GET", "/sandboxes/"+shell, nil); r.status != 200 || r.body["status"] == "deleted" {
		t.Fatalf("one click deleted the sandbox: %s", r.raw)
	}
	do(t, browser.Action{Type: browser.ActClick, Selector: del})
	waitFor(t, "the deleted sandbox gone from the list", `!`+row(shell))
	if r := call(t, srv, "GET", "/sandboxes/"+shell, nil); r.status != 404 {
		t.Errorf("after the dashboard's delete: %d %s", r.status, r.raw)
	}
}
