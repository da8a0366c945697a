package server_test

import (
	"testing"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// A plain GET (no upgrade) of the PTY path is refused with a JSON error
// body and the error object, as every error is (ORCHARD_COMPAT fact 1).
func TestPTYWithoutUpgradeIsJSON(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "256Mi"})
	r := call(t, srv, "GET", "/sandboxes/"+id+"/exec/pty", nil) // fails on a non-JSON body
	if r.status < 400 || r.status >= 500 {
		t.Fatalf("plain GET of the PTY path: %d %s", r.status, r.raw)
	}
	if e, ok := r.body["error"].(map[string]any); !ok || e["code"] == "" {
		t.Fatalf("no error object: %s", r.raw)
	}
}
