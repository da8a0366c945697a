package server_test

import (
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// An episode its trainer abandons does not keep its sandbox long past its
// deadline (episode_timeout_ms): the cleanup sweep removes it, not only
// the server-wide TTL hours later.
// The deadline leaves room for a loaded machine between the create and
// the first sweep.
func TestEpisodeAbandonedSandbox(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	task := map[string]any{"id": "abandoned", "question": "Look.", "start_url": "data:text/html,<title>x</title>",
		"setup": map[string]any{"sandbox": map[string]any{"block_network": true}},
		"eval":  map[string]any{"type": "answer_match", "references": []string{"3"}}}
	e := call(t, srv, "POST", "/episodes", map[string]any{"task": task, "episode_timeout_ms": 3000})
	want(t, e, 200)
	sb := e.body["sandbox_id"].(string)
	srv.Manager.Sweep(t.Context())
	want(t, call(t, srv, "GET", "/sandboxes/"+sb, nil), 200) // within its deadline
	time.Sleep(7 * time.Second)                              // the sandbox outlives the deadline twice over
	srv.Manager.Sweep(t.Context())
	if r := call(t, srv, "GET", "/sandboxes/"+sb, nil); r.status != 404 {
		t.Errorf("sandbox of an episode abandoned past its deadline still there: %d %s", r.status, r.raw)
	}
}
