package server_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testserver"
)

func sh(t *testing.T, srv *testserver.Server, id, script string) string {
	t.Helper()
	j := execWait(t, srv, id, map[string]any{"command": script})
	if j.ExitCode == nil || *j.ExitCode != 0 {
		t.Fatalf("%s: %q: exit %v, stderr %q", id, script, j.ExitCode, j.Stderr)
	}
	return j.Stdout
}

func sandboxCount(t *testing.T, srv *testserver.Server) int {
	t.Helper()
	r := call(t, srv, "GET", "/sandboxes", nil)
	want(t, r, 200)
	return len(r.body["sandboxes"].([]any))
}

// Snapshots and forks of shell sandboxes through the REST API: a snapshot
// keeps the files as they were, a sandbox started from it sees them, forks
// branch off the current state and diverge without seeing each other's
// writes, snapshots and branches outlive their parent, a deleted snapshot
// stops being usable while what started from it goes on, a restarted
// server keeps its snapshots, and bad input is a classified 4xx that
// creates nothing.
func TestSnapshotsAndFork(t *testing.T) {
	dir := testserver.StateDir(t)
	srv := testserver.Start(t, testserver.Options{StateDir: dir})
	parent := createReady(t, srv, map[string]any{"memory": "256Mi", "labels": map[string]string{"team": "a"}})
	sh(t, srv, parent, "echo v1 > /workspace/state && mkdir -p /opt/app && echo cfg > /opt/app/conf")

	r := call(t, srv, "POST", "/sandboxes/"+parent+"/snapshots", map[string]any{"labels": map[string]string{"step": "1"}})
	want(t, r, 201)
	snap, _ := r.body["snapshot_id"].(string)
	if snap == "" || r.body["sandbox_id"] != parent || r.body["kind"] != "shell" || r.body["image"] != "host" || r.body["bytes"].(float64) <= 0 {
		t.Fatalf("snapshot: %s", r.raw)
	}
	sh(t, srv, parent, "echo v2 > /workspace/state")

	list := call(t, srv, "GET", "/snapshots", nil)
	want(t, list, 200)
	if s := list.body["snapshots"].([]any); len(s) != 1 || s[0].(map[string]any)["snapshot_id"] != snap {
		t.Fatalf("GET /snapshots: %s", list.raw)
	}
	want(t, call(t, srv, "GET", "/snapshots/"+snap, nil), 200)

	// A sandbox from the snapshot: the image is the snapshot's.
	r = call(t, srv, "POST", "/sandboxes", map[string]any{"snapshot": snap, "block_network": true})
	want(t, r, 200)
	restored := r.body["sandbox_id"].(string)
	want(t, call(t, srv, "GET", "/sandboxes/"+restored+"/wait?timeout=60", nil), 200)
	if got := sh(t, srv, restored, "cat /workspace/state /opt/app/conf"); got != "v1\ncfg\n" {
		t.Errorf("restored sandbox sees %q; want the files at the snapshot", got)
	}
	if g := call(t, srv, "GET", "/sandboxes/"+restored, nil); g.body["snapshot"] != snap || g.body["image"] != "host" {
		t.Errorf("restored sandbox: %s", g.raw)
	}

	// Fork: three branches of the current state, ready when it answers.
	r = call(t, srv, "POST", "/sandboxes/"+parent+"/fork", map[string]any{"count": 3, "labels": map[string]string{"branch": "yes"}})
	want(t, r, 200)
	branches := r.body["sandboxes"].([]any)
	if len(branches) != 3 {
		t.Fatalf("fork: %s", r.raw)
	}
	var ids []string
	for i, b := range branches {
		m := b.(map[string]any)
		id := m["sandbox_id"].(string)
		ids = append(ids, id)
		labels, _ := m["labels"].(map[string]any)
		if m["status"] != "ready" || m["fork_of"] != parent || labels["team"] != "a" || labels["branch"] != "yes" || m["memory"] != "256Mi" {
			t.Errorf("branch %d: %v", i, m)
		}
		sh(t, srv, id, fmt.Sprintf("echo branch-%d > /workspace/state && echo %d > /workspace/mine-%d", i, i, i))
	}
	for i, id := range ids {
		got := sh(t, srv, id, "cat /workspace/state /opt/app/conf; ls /workspace | grep mine- | tr '\\n' ' '")
		if want := fmt.Sprintf("branch-%d\ncfg\nmine-%d ", i, i); got != want {
			t.Errorf("branch %d sees %q; want %q (its own writes only)", i, got, want)
		}
	}
	if got := sh(t, srv, parent, "cat /workspace/state; ls /workspace | grep -c mine- || true"); got != "v2\n0\n" {
		t.Errorf("parent sees %q after the branches wrote", got)
	}

	// The parent goes; its snapshot, branches and restored sandbox stay.
	want(t, call(t, srv, "DELETE", "/sandboxes/"+parent, nil), 200)
	waitRuntimeGone(t, srv, parent)
	if got := sh(t, srv, ids[0], "cat /opt/app/conf"); got != "cfg\n" {
		t.Errorf("branch after its parent's deletion: %q", got)
	}
	wantCode(t, call(t, srv, "POST", "/sandboxes/"+parent+"/fork", map[string]any{"count": 1}), 404, faults.CodeSandboxNotFound)
	wantCode(t, call(t, srv, "POST", "/sandboxes/"+parent+"/snapshots", nil), 404, faults.CodeSandboxNotFound)

	// Bad input: a clear 4xx and nothing created.
	before := sandboxCount(t, srv)
	for _, c := range []struct {
		name, method, path string
		body               any
		status             int
		code               string
	}{
		{"count 0", "POST", "/sandboxes/" + ids[0] + "/fork", map[string]any{"count": 0}, 422, faults.CodeValidation},
		{"count over the cap", "POST", "/sandboxes/" + ids[0] + "/fork", map[string]any{"count": 1000}, 422, faults.CodeValidation},
		{"unknown snapshot", "POST", "/sandboxes", map[string]any{"snapshot": "snap-nope", "block_network": true}, 404, faults.CodeSnapshotNotFound},
		{"snapshot with another image", "POST", "/sandboxes", map[string]any{"snapshot": snap, "image": "docker.io/library/alpine:3", "block_network": true}, 422, faults.CodeValidation},
		{"snapshot with another kind", "POST", "/sandboxes", map[string]any{"snapshot": snap, "kind": "browser", "block_network": true}, 422, faults.CodeValidation},
		{"get unknown", "GET", "/snapshots/snap-nope", nil, 404, faults.CodeSnapshotNotFound},
		{"delete unknown", "DELETE", "/snapshots/snap-nope", nil, 404, faults.CodeSnapshotNotFound},
		{"hidden name", "GET", "/snapshots/.tmp-x", nil, 404, faults.CodeSnapshotNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantCode(t, call(t, srv, c.method, c.path, c.body), c.status, c.code)
		})
	}
	if n := sandboxCount(t, srv); n != before {
		t.Errorf("bad input left %d sandboxes; want %d", n, before)
	}

	// A server restart keeps snapshots.
	srv.Stop(t, false)
	srv = testserver.Start(t, testserver.Options{StateDir: dir})
	if g := call(t, srv, "GET", "/snapshots/"+snap, nil); g.status != 200 {
		t.Fatalf("snapshot after restart: %d %s", g.status, g.raw)
	}
	again := createReady(t, srv, map[string]any{"snapshot": snap})
	if got := sh(t, srv, again, "cat /workspace/state"); got != "v1\n" {
		t.Errorf("after restart the snapshot gives %q", got)
	}

	// A warm pool of sandboxes from the snapshot serves creates from it.
	createPool(t, srv, "from-snap", 1, map[string]any{"snapshot": snap, "block_network": true})
	awaitPool(t, srv, "from-snap", full)
	pooled := claim(t, srv, map[string]any{"snapshot": snap, "block_network": true})
	if got := sh(t, srv, pooled, "cat /workspace/state"); got != "v1\n" {
		t.Errorf("a pool sandbox from the snapshot gives %q", got)
	}
	want(t, call(t, srv, "DELETE", "/pools/from-snap", nil), 200)

	// Deleted: not listed, not usable; what started from it goes on.
	r = call(t, srv, "DELETE", "/snapshots/"+snap, nil)
	want(t, r, 200)
	wantCode(t, call(t, srv, "GET", "/snapshots/"+snap, nil), 404, faults.CodeSnapshotNotFound)
	if l := call(t, srv, "GET", "/snapshots", nil); strings.Contains(string(l.raw), snap) {
		t.Errorf("deleted snapshot listed: %s", l.raw)
	}
	wantCode(t, call(t, srv, "POST", "/sandboxes", map[string]any{"snapshot": snap, "block_network": true}), 404, faults.CodeSnapshotNotFound)
	if got := sh(t, srv, again, "cat /opt/app/conf"); got != "cfg\n" {
		t.Errorf("sandbox from a deleted snapshot: %q", got)
	}
}
