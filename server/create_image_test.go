package server_test

import (
	"testing"

	"github.com/orchard/orchard/internal/testserver"
)

// POST /sandboxes without an image is a 422 (ORCHARD_COMPAT §3.4: image is
// required), whatever else the body holds; null is not a string either.
func TestCreateWithoutImage(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	for _, body := range []string{
		`{"block_network":true,"sandbox_id":"image"}`,
		`{"block_network":true,"labels":{"image":"x"}}`,
		`{"block_network":true,"image":null}`,
	} {
		r := call(t, srv, "POST", "/sandboxes", body)
		if r.status == 200 {
			call(t, srv, "DELETE", "/sandboxes/"+r.body["sandbox_id"].(string), nil)
		}
		if r.status != 422 {
			t.Errorf("create %s: %d %s, want 422", body, r.status, r.raw)
			continue
		}
		if d, ok := r.body["detail"].([]any); !ok || len(d) != 1 {
			t.Errorf("create %s: 422 detail %s, want FastAPI's list", body, r.raw)
		}
	}
}
