package server_test

import (
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// A fault a plan injects at a browser step is tagged in the step's info
// with its truth, as network faults are, so a chaos run over episodes can
// score the attribution.
func TestEpisodeStepFaultTruth(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	loadShop(t, srv)
	cases := []struct {
		kind, source, code string
	}{
		{"browser_crash", "browser", "browser.crashed"},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			e := call(t, srv, "POST", "/episodes", map[string]any{"task_id": "search-lamp", "max_steps": 10,
				"sandbox": map[string]any{"faults": map[string]any{
					"faults": []map[string]any{{"kind": c.kind, "p": 1, "after_steps": 2, "times": 1}}}}})
			want(t, e, 200)
			id := e.body["episode_id"].(string)
			defer call(t, srv, "DELETE", "/episodes/"+id, nil)
			s := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": searchSteps[0]})
			want(t, s, 200)
			info, _ := s.body["info"].(map[string]any)
			errInfo, _ := info["error"].(map[string]any)
			if errInfo == nil || errInfo["code"] != c.code {
				t.Fatalf("step info %v: want error %s", info, c.code)
			}
			inj, _ := info["injected"].(map[string]any)
			if inj == nil || inj["kind"] != c.kind || inj["source"] != c.source || inj["code"] != c.code {
				t.Errorf("step info injected = %v, want {kind: %s, source: %s, code: %s}", info["injected"], c.kind, c.source, c.code)
			}
		})
	}
}
