package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store/redis"
)

// Two replicas on one Redis that do not share a state directory (another
// host's, or a misconfigured one's): a delete through the replica that
// cannot reach the container does not answer success. The record stays,
// marked deleting, and the replica that reaches the container finishes
// the delete; a sandbox of the replica's own deletes as always.
func TestDeleteThroughAReplicaThatCannotReachTheContainer(t *testing.T) {
	rs := testenv.StartRedis(t)
	open := func() *redis.Store {
		st, err := redis.New(context.Background(), redis.Config{URL: rs.URL(), Prefix: "elsewhere:"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	// Cleanup ticks far apart: the delete must be finished by the message
	// between replicas, not by a tick.
	cfg := manager.Config{CleanupInterval: time.Hour}
	a := testserver.Start(t, testserver.Options{Store: open(), Run: true, Manager: cfg})
	b := testserver.Start(t, testserver.Options{Store: open(), Run: true, Manager: cfg})

	id := createReady(t, a, map[string]any{"memory": "128Mi"})
	r := call(t, b, "DELETE", "/sandboxes/"+id, nil)
	e, _ := r.body["error"].(map[string]any)
	if r.status != 409 || e == nil || e["code"] != faults.CodeSandboxElsewhere {
		t.Fatalf("delete through the other replica: %d %s", r.status, r.raw)
	}

	// The replica that reaches it deletes it: the record and the container.
	deadline := time.Now().Add(30 * time.Second)
	for {
		g := call(t, b, "GET", "/sandboxes/"+id, nil)
		if g.status == 404 {
			break
		}
		if g.status != 200 || (g.body["status"] != api.StatusDeleting && g.body["status"] != api.StatusReady) {
			t.Fatalf("while the delete is pending: %d %s", g.status, g.raw)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica that reaches the sandbox did not finish the delete: %s", g.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitGone := time.Now().Add(30 * time.Second)
	for {
		_, err := a.Runtime.Inspect(context.Background(), id)
		if err != nil && faults.Of(err).Category == faults.NotFound {
			break
		}
		if time.Now().After(waitGone) {
			t.Fatalf("the container runs on after the delete: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// B's own sandbox deletes through B at once.
	own := createReady(t, b, map[string]any{"memory": "128Mi"})
	want(t, call(t, b, "DELETE", "/sandboxes/"+own, nil), 200)
}
