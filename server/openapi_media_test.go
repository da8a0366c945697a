package server_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// The OpenAPI document describes the browser's image and stream answers
// as what they are, and the query parameters the agent reads.
func TestOpenAPIBrowserMedia(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	r := call(t, srv, "GET", "/openapi.json", nil, "")
	want(t, r, 200)
	paths := r.body["paths"].(map[string]any)
	get := func(p string) map[string]any { return paths[p].(map[string]any)["get"].(map[string]any) }
	media := func(p string) []string {
		ok := get(p)["responses"].(map[string]any)["200"].(map[string]any)
		var out []string
		for k := range ok["content"].(map[string]any) {
			out = append(out, k)
		}
		return out
	}
	if m := media("/sandboxes/{id}/browser/screenshot"); len(m) != 1 || !strings.HasPrefix(m[0], "image/") {
		t.Errorf("browser/screenshot 200 documented as %v, want an image type", m)
	}
	if m := media("/sandboxes/{id}/browser/stream"); len(m) != 1 || !strings.HasPrefix(m[0], "multipart/") {
		t.Errorf("browser/stream 200 documented as %v, want multipart/x-mixed-replace", m)
	}
	for _, p := range []string{"/sandboxes/{id}/browser/observation", "/sandboxes/{id}/browser/screenshot"} {
		params, _ := json.Marshal(get(p)["parameters"])
		if !strings.Contains(string(params), `"name":"marks"`) {
			t.Errorf("%s lacks the marks parameter: %s", p, params)
		}
	}
}
