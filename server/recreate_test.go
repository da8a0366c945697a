package server_test

import (
	"testing"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// DELETE frees the id at once (the record is gone and a create with it is
// accepted): a create that reuses it right away must give a working
// sandbox, not one that fails because the old one is still being removed.
func TestRecreateSameIDAfterDelete(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	body := func() map[string]any {
		return map[string]any{"image": "host", "block_network": true, "sandbox_id": "reuse1", "memory": "256Mi", "cpu": "1"}
	}
	for round := range 5 {
		id := createReady(t, srv, body())
		want(t, call(t, srv, "DELETE", "/sandboxes/"+id, nil), 200)
		r := call(t, srv, "POST", "/sandboxes", body())
		want(t, r, 200)
		w := call(t, srv, "GET", "/sandboxes/reuse1/wait?timeout=60", nil)
		want(t, w, 200)
		if w.body["status"] != "ready" {
			t.Fatalf("round %d: re-created sandbox: %s", round, w.raw)
		}
		want(t, call(t, srv, "DELETE", "/sandboxes/reuse1", nil), 200)
	}
}
