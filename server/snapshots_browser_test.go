package server_test

import (
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// sitesCmd starts the bundled sites in a sandbox, as the bundled suite's
// setup does.
const sitesCmd = "/.orchard/bin/orchard-agent sites --addr 127.0.0.1:8100"

func evaluate(t *testing.T, srv *testserver.Server, id, expr string) any {
	t.Helper()
	r := call(t, srv, "POST", "/sandboxes/"+id+"/browser/evaluate", map[string]any{"expression": expr})
	want(t, r, 200)
	return r.body["value"]
}

func actOK(t *testing.T, srv *testserver.Server, id string, actions ...map[string]any) {
	t.Helper()
	r := call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{"actions": actions})
	want(t, r, 200)
	if r.body["ok"] != true {
		t.Fatalf("actions: %.800s", r.raw)
	}
}

// A snapshot of a browser sandbox taken after signing in on the bundled
// shop restores a signed-in browser on the same page with the note typed
// (not submitted) before the snapshot; forks of it diverge: browser
// storage written in one branch is not in the other.
func TestBrowserSnapshotFork(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "kind": "browser",
		"exec": []string{sitesCmd}})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	if w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=120", nil); w.body["status"] != "ready" {
		t.Fatalf("browser sandbox: %s", w.raw)
	}
	actOK(t, srv, id,
		map[string]any{"type": "navigate", "url": "http://127.0.0.1:8100/shop/account.html"},
		map[string]any{"type": "click", "selector": "#user"}, map[string]any{"type": "type", "text": "ada"},
		map[string]any{"type": "click", "selector": "#password"}, map[string]any{"type": "type", "text": "greenleaf"},
		map[string]any{"type": "click", "selector": "#sign-in"},
		map[string]any{"type": "wait", "selector": "#signed-in:not([hidden])"},
		map[string]any{"type": "click", "selector": "#note"}, map[string]any{"type": "type", "text": "leave at the door"})
	evaluate(t, srv, id, "localStorage.setItem('who', 'parent'), 1")
	if got := evaluate(t, srv, id, "document.getElementById('status').textContent"); got != "Signed in as ada" {
		t.Fatalf("sign-in: %v", got)
	}

	r = call(t, srv, "POST", "/sandboxes/"+id+"/snapshots", nil)
	want(t, r, 201)
	if r.body["browser_state"] != true {
		t.Fatalf("snapshot: %s", r.raw)
	}
	snap := r.body["snapshot_id"].(string)

	// The page as the agent left it, in a new sandbox.
	check := func(id string) {
		t.Helper()
		for expr, want := range map[string]any{
			"location.href": "http://127.0.0.1:8100/shop/account.html",
			"document.getElementById('status').textContent": "Signed in as ada",
			"document.getElementById('note').value":         "leave at the door",
			"document.activeElement.id":                     "note",
			"localStorage.getItem('who')":                   "parent",
		} {
			if got := evaluate(t, srv, id, expr); got != want {
				t.Errorf("%s: %s = %v; want %v", id, expr, got, want)
			}
		}
	}
	r = call(t, srv, "POST", "/sandboxes", map[string]any{"snapshot": snap, "block_network": true, "exec": []string{sitesCmd}})
	want(t, r, 200)
	restored := r.body["sandbox_id"].(string)
	if w := call(t, srv, "GET", "/sandboxes/"+restored+"/wait?timeout=120", nil); w.body["status"] != "ready" || w.body["kind"] != "browser" {
		t.Fatalf("restored: %s", w.raw)
	}
	check(restored)

	r = call(t, srv, "POST", "/sandboxes/"+id+"/fork", map[string]any{"count": 2, "exec": []string{sitesCmd}})
	want(t, r, 200)
	var branches []string
	for _, b := range r.body["sandboxes"].([]any) {
		branches = append(branches, b.(map[string]any)["sandbox_id"].(string))
	}
	for _, b := range branches {
		check(b)
	}
	evaluate(t, srv, branches[0], "localStorage.setItem('who', 'branch0'), 1")
	if got := evaluate(t, srv, branches[1], "localStorage.getItem('who')"); got != "parent" {
		t.Errorf("branch 1 sees branch 0's storage: %v", got)
	}
	if got := evaluate(t, srv, id, "localStorage.getItem('who')"); got != "parent" {
		t.Errorf("the parent sees a branch's storage: %v", got)
	}
	// A fork whose start command fails keeps nothing.
	before := sandboxCount(t, srv)
	r = call(t, srv, "POST", "/sandboxes/"+id+"/fork", map[string]any{"count": 2, "exec": []string{"exit 3"}})
	if r.status < 400 {
		t.Fatalf("fork with a failing start command: %d %s", r.status, r.raw)
	}
	if n := sandboxCount(t, srv); n != before {
		t.Errorf("failed fork left %d sandboxes; want %d", n, before)
	}
}

// A desktop sandbox's fork starts its X session afresh (the X server's
// lock file and socket are not carried) with the parent's files, and its
// screen answers.
func TestDesktopFork(t *testing.T) {
	requireXvfb(t)
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"kind": "desktop"})
	sh(t, srv, id, "echo kept > /workspace/f; ls /tmp/.X11-unix")
	r := call(t, srv, "POST", "/sandboxes/"+id+"/fork", map[string]any{"count": 1})
	want(t, r, 200)
	branch := r.body["sandboxes"].([]any)[0].(map[string]any)["sandbox_id"].(string)
	if got := sh(t, srv, branch, "cat /workspace/f"); got != "kept\n" {
		t.Errorf("branch sees %q", got)
	}
	obs := call(t, srv, "GET", "/sandboxes/"+branch+"/desktop/cursor", nil)
	want(t, obs, 200)
}
