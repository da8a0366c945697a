package server_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/recordings"
)

// The recording holds what the policy sent: no action on step 0 (the
// reset: the start-page load is the server's), and the action object
// itself on a step, so the HTML replay marks where a click landed and the
// parquet export has no assistant turn the policy never took.
func TestEpisodeRecordingActions(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	task := map[string]any{"id": "rec", "question": "Click.", "start_url": "data:text/html,<title>Shop</title><p>hello",
		"setup": map[string]any{"sandbox": map[string]any{"block_network": true}},
		"eval":  map[string]any{"type": "answer_match", "references": []string{"3"}}}
	e := call(t, srv, "POST", "/episodes", map[string]any{"task": task})
	want(t, e, 200)
	id := e.body["episode_id"].(string)
	want(t, call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": map[string]any{"type": "click", "x": 100, "y": 95}}), 200)
	want(t, call(t, srv, "POST", "/episodes/"+id+"/finish", map[string]any{"answer": "3"}), 200)
	rec := call(t, srv, "GET", "/recordings/"+id, nil)
	want(t, rec, 200)
	steps := rec.body["steps"].([]any)
	if len(steps) != 2 {
		t.Fatalf("steps: %s", rec.raw)
	}
	if a, ok := steps[0].(map[string]any)["action"]; ok {
		t.Errorf("step 0 (the reset) has an action: %v", a)
	}
	if a, _ := steps[1].(map[string]any)["action"].(map[string]any); a == nil || a["type"] != "click" {
		t.Errorf("step 1 action is not the click the policy sent: %v", steps[1].(map[string]any)["action"])
	}
	if h, _ := getBody(t, srv, "/recordings/"+id+"/export?format=html"); !bytes.Contains(h, []byte(`class="mark"`)) || !bytes.Contains(h, []byte("step 1: click")) {
		t.Error("html replay marks no click")
	}
	pq, _ := getBody(t, srv, "/recordings/"+id+"/export?format=parquet")
	rows, err := parquet.Read[recordings.ParquetRow](bytes.NewReader(pq), int64(len(pq)))
	if err != nil || len(rows) != 1 {
		t.Fatalf("parquet: %v", err)
	}
	if strings.Contains(rows[0].Messages, "navigate") {
		t.Errorf("parquet messages hold a navigate the policy never sent: %s", rows[0].Messages)
	}
}
