package server_test

import (
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// On a server without a judge, an episode of a judge task is refused at
// once, before a sandbox is made, instead of running to an env_error at
// finish (which a runner then re-queues).
func TestEpisodeJudgeUnconfigured(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	task := map[string]any{"id": "judged", "question": "Look.", "start_url": "data:text/html,<title>x</title>",
		"setup": map[string]any{"sandbox": map[string]any{"block_network": true}},
		"eval":  map[string]any{"type": "judge"}}
	e := call(t, srv, "POST", "/episodes", map[string]any{"task": task})
	if e.status == 200 {
		id := e.body["episode_id"].(string)
		f := call(t, srv, "POST", "/episodes/"+id+"/finish", map[string]any{"answer": "x"})
		t.Fatalf("judge task started without a judge (%d); finish: %s", e.status, f.raw)
	}
	if e.status != 501 || e.body["error"].(map[string]any)["code"] != "platform.judge_failed" {
		t.Errorf("refusal: %d %s", e.status, e.raw)
	}
	if l := call(t, srv, "GET", "/sandboxes", nil); len(l.body["sandboxes"].([]any)) != 0 {
		t.Errorf("a sandbox was made: %s", l.raw)
	}
}
