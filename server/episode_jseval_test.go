package server_test

import (
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// A js eval whose script is a promise is judged on the promise's value; a
// script the page cannot compile is the task's fault (task.invalid), and
// the episode still finishes and releases its sandbox.
func TestEpisodeJSEval(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	for _, c := range []struct{ script, outcome, code string }{
		{"document.title === 'Shop'", "success", ""},
		{"Promise.resolve(document.title === 'Shop')", "success", ""},
		{"new Promise((r) => setTimeout(() => r(document.title === 'Shop'), 50))", "success", ""},
		{"Promise.resolve(document.title === 'Nope')", "failure", ""},
		{"Promise.reject(new Error('no cart'))", "failure", ""},
		{"document.title === 'Shop';", "env_error", "task.invalid"},
	} {
		task := map[string]any{"id": "js", "question": "Look.", "start_url": "data:text/html,<title>Shop</title>",
			"setup": map[string]any{"sandbox": map[string]any{"block_network": true}},
			"eval":  map[string]any{"type": "js", "script": c.script}}
		e := call(t, srv, "POST", "/episodes", map[string]any{"task": task})
		want(t, e, 200)
		id, sb := e.body["episode_id"].(string), e.body["sandbox_id"].(string)
		f := call(t, srv, "POST", "/episodes/"+id+"/finish", map[string]any{})
		att, _ := f.body["attribution"].(map[string]any)
		if f.status != 200 || f.body["outcome"] != c.outcome || (c.code != "" && (att == nil || att["code"] != c.code)) {
			t.Errorf("js %q: %d %s", c.script, f.status, f.raw)
		}
		if r := call(t, srv, "GET", "/sandboxes/"+sb, nil); r.status != 404 {
			call(t, srv, "DELETE", "/episodes/"+id, nil)
			t.Errorf("js %q: the episode's sandbox outlived finish: %d", c.script, r.status)
		}
	}
}
