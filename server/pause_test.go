package server_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// readCount reads the count the sandbox's loop keeps in /tmp/count (0
// before its first).
func readCount(t *testing.T, srv *testserver.Server, id string) int {
	t.Helper()
	j := execWait(t, srv, id, map[string]any{"command": "cat /tmp/count 2>/dev/null || echo 0"})
	n, err := strconv.Atoi(strings.TrimSpace(j.Stdout))
	if err != nil {
		t.Fatalf("count %q: %v (stderr %q)", j.Stdout, err, j.Stderr)
	}
	return n
}

func wantCode(t *testing.T, r resp, status int, code string) {
	t.Helper()
	want(t, r, status)
	if e, _ := r.body["error"].(map[string]any); e["code"] != code {
		t.Fatalf("error %s, want code %s", r.raw, code)
	}
}

// A paused sandbox's processes stop in place: a counting loop does not
// advance while paused and, resumed, goes on from where it stopped (its
// memory intact); exec, files, patches and the PTY answer 409
// sandbox.paused meanwhile; pause and resume are idempotent; a paused
// sandbox is deleted like any other.
func TestPauseResume(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "128Mi"})
	// The count lives in the shell's memory; the file only shows it,
	// renamed into place: a read between a truncation and its write
	// would see an empty file.
	execWait(t, srv, id, map[string]any{"command": "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.02; done' >/dev/null 2>&1 &"})
	deadline := time.Now().Add(10 * time.Second)
	for readCount(t, srv, id) < 5 {
		if time.Now().After(deadline) {
			t.Fatal("the counting loop does not count")
		}
	}

	// The loop's pace, for the bound below: a second running counts many.
	start := readCount(t, srv, id)
	time.Sleep(time.Second)
	before := readCount(t, srv, id)
	if before-start < 10 {
		t.Fatalf("the loop counted %d in a second running; too slow to tell a pause", before-start)
	}
	r := call(t, srv, "POST", "/sandboxes/"+id+"/pause", nil)
	want(t, r, 200)
	if r.body["status"] != "paused" {
		t.Fatalf("pause answered %s", r.raw)
	}
	want(t, call(t, srv, "POST", "/sandboxes/"+id+"/pause", nil), 200) // again: nothing to do
	if g := call(t, srv, "GET", "/sandboxes/"+id, nil); g.body["status"] != "paused" {
		t.Fatalf("GET after pause: %s", g.raw)
	}
	if w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=5", nil); w.status != 200 || w.body["status"] != "paused" {
		t.Fatalf("wait on a paused sandbox: %d %s", w.status, w.raw)
	}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/sandboxes/" + id + "/exec", map[string]any{"command": "true", "wait": true}},
		{"GET", "/sandboxes/" + id + "/files?path=/tmp/count", nil},
		{"POST", "/sandboxes/" + id + "/files", map[string]any{"path": "/tmp/x", "content": "eA=="}},
		{"GET", "/sandboxes/" + id + "/files/list?path=/tmp", nil},
		{"POST", "/sandboxes/" + id + "/apply_patch", map[string]any{"patch": "--- a/x\n+++ b/x\n"}},
	} {
		wantCode(t, call(t, srv, c.method, c.path, c.body), 409, faults.CodeSandboxPaused)
	}
	time.Sleep(time.Second) // ~50 counts, were it running

	r = call(t, srv, "POST", "/sandboxes/"+id+"/resume", nil)
	want(t, r, 200)
	if r.body["status"] != "ready" {
		t.Fatalf("resume answered %s", r.raw)
	}
	after := readCount(t, srv, id)
	t.Logf("%d counts in a second running; %d before the pause, %d after the resume", before-start, before, after)
	// Between the two reads: the exec that read `before`, the pause, and
	// the resume and the exec after it — a few counts, not a second's.
	if after < before || after > before+(before-start)/2 {
		t.Fatalf("count %d before the pause, %d right after the resume: want it to go on from where it stopped", before, after)
	}
	deadline = time.Now().Add(10 * time.Second)
	for readCount(t, srv, id) <= after {
		if time.Now().After(deadline) {
			t.Fatal("the loop did not go on after resume")
		}
	}
	want(t, call(t, srv, "POST", "/sandboxes/"+id+"/resume", nil), 200) // ready already

	// A paused sandbox is deleted like any other: its frozen processes
	// are thawed to die.
	want(t, call(t, srv, "POST", "/sandboxes/"+id+"/pause", nil), 200)
	want(t, call(t, srv, "DELETE", "/sandboxes/"+id, nil), 200)
	waitRuntimeGone(t, srv, id)

	wantCode(t, call(t, srv, "POST", "/sandboxes/nope/pause", nil), 404, faults.CodeSandboxNotFound)
	wantCode(t, call(t, srv, "POST", "/sandboxes/nope/resume", nil), 404, faults.CodeSandboxNotFound)
}
