package server_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// A step that runs past step_timeout_ms is the step's timeout
// (episode.deadline, the policy's, as the step's context cause says), not
// a dead sandbox agent that ends the episode env_error.
func TestEpisodeStepTimeout(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	task := map[string]any{"id": "slow", "question": "Wait.", "start_url": "data:text/html,<title>Slow</title>",
		"setup": map[string]any{"sandbox": map[string]any{"block_network": true}},
		"eval":  map[string]any{"type": "answer_match", "references": []string{"3"}}}
	e := call(t, srv, "POST", "/episodes", map[string]any{"task": task, "step_timeout_ms": 1500})
	want(t, e, 200)
	id := e.body["episode_id"].(string)
	defer call(t, srv, "DELETE", "/episodes/"+id, nil)
	s := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": map[string]any{"type": "wait", "ms": 4000}})
	want(t, s, 200)
	info, _ := s.body["info"].(map[string]any)
	errInfo, _ := info["error"].(map[string]any)
	if errInfo == nil || errInfo["code"] != "episode.deadline" || s.body["done"] != false {
		t.Errorf("step past its timeout: %s", s.raw)
	}
}

// A trainer whose step request is cut off (its client timed out) has not
// lost its episode to an env_error blamed on the sandbox: the next step is
// taken, under a number of its own in the recording, with its screenshot.
func TestEpisodeStepClientGone(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	task := map[string]any{"id": "gone", "question": "Look.", "start_url": "data:text/html,<title>x</title>",
		"setup": map[string]any{"sandbox": map[string]any{"block_network": true}},
		"eval":  map[string]any{"type": "answer_match", "references": []string{"3"}}}
	e := call(t, srv, "POST", "/episodes", map[string]any{"task": task})
	want(t, e, 200)
	id := e.body["episode_id"].(string)
	defer call(t, srv, "DELETE", "/episodes/"+id, nil)
	b, _ := json.Marshal(map[string]any{"action": map[string]any{"type": "wait", "ms": 3000}})
	req, _ := http.NewRequest("POST", srv.URL+"/episodes/"+id+"/step", bytes.NewReader(b))
	req.Header.Set("X-API-Key", srv.APIKey)
	req.Header.Set("Content-Type", "application/json")
	if _, err := (&http.Client{Timeout: time.Second}).Do(req); err == nil {
		t.Fatal("the cut-off step answered")
	}
	s := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": map[string]any{"type": "wait", "ms": 10}})
	want(t, s, 200)
	step := s.body["info"].(map[string]any)["step"].(float64)
	rec := call(t, srv, "GET", "/recordings/"+id, nil)
	seen := map[float64]int{}
	for _, st := range rec.body["steps"].([]any) {
		seen[st.(map[string]any)["n"].(float64)]++
	}
	for n, c := range seen {
		if c > 1 {
			t.Errorf("step %v recorded %d times: %s", n, c, rec.raw)
		}
	}
	if seen[step] != 1 {
		t.Errorf("step %v (answered) not recorded once: %v", step, seen)
	}
	g := call(t, srv, "GET", "/episodes/"+id, nil)
	if g.body["outcome"] != nil || g.body["status"] != "running" {
		t.Errorf("episode after a cut-off step: %s", g.raw)
	}
	req, _ = http.NewRequest("GET", srv.URL+"/recordings/"+id+"/steps/"+strconv.Itoa(int(step))+"/screenshot", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("screenshot of step %v: %d", step, res.StatusCode)
	}
}
