package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/server/manager"
)

// TestCleanupRules runs the cleanup pass of ORCHARD_COMPAT §7 against real
// sandboxes: the TTL is a hard cap, a sandbox that heartbeats and stops is
// removed while one that never heartbeats is exempt, and a sandbox stuck
// pending past its create timeout plus the buffer is removed.
func TestCleanupRules(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{Manager: manager.Config{
		SandboxTTL:              time.Hour,
		HeartbeatTimeout:        time.Second,
		HeartbeatCleanupEnabled: true,
		PendingTimeoutBuffer:    time.Second,
	}})
	ctx := context.Background()
	short := createReady(t, srv, map[string]any{"memory": "128Mi"})
	// A per-sandbox TTL overrides the server's.
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "ttl_seconds": 1})
	want(t, r, 200)
	ttl := r.body["sandbox_id"].(string)
	want(t, call(t, srv, "GET", "/sandboxes/"+ttl+"/wait?timeout=60", nil), 200)
	beating := createReady(t, srv, map[string]any{"memory": "128Mi"})
	want(t, call(t, srv, "POST", "/sandboxes/"+beating+"/heartbeat", nil), 200)
	// Timeouts past time.Duration's range (about 292 years) mean a long
	// time, not a negative one that has already passed.
	const huge = 10_000_000_000
	long := createReady(t, srv, map[string]any{"memory": "128Mi", "ttl_seconds": huge, "timeout": huge})
	r = call(t, srv, "POST", "/sandboxes/"+long+"/exec", map[string]any{"command": "echo hi", "wait": true, "timeout_seconds": huge})
	if r.status != 200 || r.body["status"] != "succeeded" || r.body["stdout"] != "hi\n" {
		t.Fatalf("exec with a huge timeout: %s", r.raw)
	}

	r = call(t, srv, "POST", "/sandboxes", map[string]any{"image": stuckRegistry(t) + "/stuck:1", "block_network": true, "timeout": 1})
	want(t, r, 200)
	pending := r.body["sandbox_id"].(string)

	time.Sleep(2100 * time.Millisecond)
	srv.Manager.Sweep(ctx)

	for id, gone := range map[string]bool{short: false, long: false, ttl: true, beating: true, pending: true} {
		r := call(t, srv, "GET", "/sandboxes/"+id, nil)
		if gone && r.status != 404 {
			t.Errorf("sandbox %s should have been cleaned up: %s", id, r.raw)
		}
		if !gone && r.status != 200 {
			t.Errorf("sandbox %s (never heartbeats, within TTL) was removed: %d", id, r.status)
		}
	}
	waitRuntimeGone(t, srv, ttl, beating)
}

// TestReconcile: a container without a record is removed, and the record
// of a ready sandbox whose container vanished is failed with a classified
// fault (and kept, so its holder learns why).
func TestReconcile(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	ctx := context.Background()
	if _, err := srv.Runtime.Create(ctx, runtime.Spec{ID: "orphan-1", Kind: "shell", Image: "host", MemoryBytes: 128 << 20}); err != nil {
		t.Fatal(err)
	}
	vanished := createReady(t, srv, map[string]any{"memory": "128Mi"})
	if err := srv.Runtime.Delete(ctx, vanished); err != nil {
		t.Fatal(err)
	}
	kept := createReady(t, srv, map[string]any{"memory": "128Mi"})

	srv.Manager.Sweep(ctx)

	if _, err := srv.Runtime.Inspect(ctx, "orphan-1"); faults.Of(err).Category != faults.NotFound {
		t.Fatalf("orphan container survived reconciliation: %v", err)
	}
	r := call(t, srv, "GET", "/sandboxes/"+vanished, nil)
	if r.status != 200 || r.body["status"] != "failed" {
		t.Fatalf("record of a vanished sandbox: %d %s, want 200 and status failed", r.status, r.raw)
	}
	if f, _ := r.body["fault"].(map[string]any); f["code"] != faults.CodeSandboxDied {
		t.Fatalf("vanished sandbox's fault = %v, want %s", r.body["fault"], faults.CodeSandboxDied)
	}
	want(t, call(t, srv, "DELETE", "/sandboxes/"+vanished, nil), 200)
	if r := call(t, srv, "GET", "/sandboxes/"+kept, nil); r.status != 200 || r.body["status"] != "ready" {
		t.Fatalf("a healthy sandbox was touched: %s", r.raw)
	}
}

func waitRuntimeGone(t testing.TB, srv *testserver.Server, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range ids {
		for {
			_, err := srv.Runtime.Inspect(context.Background(), id)
			if faults.Of(err) != nil && faults.Of(err).Category == faults.NotFound {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s still in the runtime after cleanup", id)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
