package server_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/server/manager"
)

// ephemeral_storage: what a sandbox writes is on the host's disk within
// its own limit, so a write beyond it fails with ENOSPC in the writer and
// the sandbox goes on; absent, the server's default applies; nonsense or
// more than the host's disk has free is a 422 naming the field.
func TestEphemeralStorage(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{Manager: manager.Config{DefaultEphemeralStorage: "48Mi"}})
	df := func(t *testing.T, id string) string {
		t.Helper()
		j := execWait(t, srv, id, map[string]any{"command": "df -B1 --output=size /workspace | tail -n 1"})
		return strings.TrimSpace(j.Stdout)
	}

	t.Run("LimitIsENOSPC", func(t *testing.T) {
		id := createReady(t, srv, map[string]any{"memory": "256Mi", "ephemeral_storage": "64Mi"})
		j := execWait(t, srv, id, map[string]any{"command": "head -c 1G /dev/zero > /workspace/big"})
		if j.ExitCode == nil || *j.ExitCode == 0 || !strings.Contains(j.Stderr, "No space left on device") || j.Fault != nil {
			t.Fatalf("writing 1 GiB with 64Mi: exit %v, fault %+v, stderr %q; want a plain failure with ENOSPC", j.ExitCode, j.Fault, j.Stderr)
		}
		if j := execWait(t, srv, id, map[string]any{"command": "echo alive"}); j.Stdout != "alive\n" {
			t.Fatalf("exec after ENOSPC: %+v", j)
		}
		g := call(t, srv, "GET", "/sandboxes/"+id, nil)
		if g.body["status"] != "ready" || g.body["ephemeral_storage"] != "64Mi" {
			t.Errorf("sandbox after ENOSPC: %s", g.raw)
		}
		if got := df(t, id); got != strconv.Itoa(64<<20) {
			t.Errorf("df shows %q bytes, want the limit, %d", got, 64<<20)
		}
	})

	t.Run("Default", func(t *testing.T) {
		r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true})
		want(t, r, 200)
		if r.body["ephemeral_storage"] != "48Mi" {
			t.Errorf("create answer: %s; want ephemeral_storage 48Mi", r.raw)
		}
		id := createReady(t, srv, nil)
		if got := df(t, id); got != strconv.Itoa(48<<20) {
			t.Errorf("df shows %q bytes, want the default, %d", got, 48<<20)
		}
		_ = call(t, srv, "DELETE", "/sandboxes/"+r.body["sandbox_id"].(string), nil)
	})

	t.Run("Invalid", func(t *testing.T) {
		for _, q := range []any{"lots", "-1Gi", "0", "1Mi", 10, "1000Pi"} {
			r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "ephemeral_storage": q})
			if r.status != 422 || !strings.Contains(string(r.raw), "ephemeral_storage") {
				t.Errorf("ephemeral_storage %#v: %d %s; want a 422 naming the field", q, r.status, r.raw)
			}
		}
	})

	t.Run("OpenAPI", func(t *testing.T) {
		r := call(t, srv, "GET", "/openapi.json", nil)
		props := r.body["components"].(map[string]any)["schemas"].(map[string]any)["CreateSandboxRequest"].(map[string]any)["properties"].(map[string]any)
		f, _ := props["ephemeral_storage"].(map[string]any)
		if d, _ := f["description"].(string); f["type"] != "string" || !strings.Contains(d, "ENOSPC") {
			t.Errorf("CreateSandboxRequest.ephemeral_storage in the OpenAPI document: %v", f)
		}
	})
}
