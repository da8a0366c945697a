package main

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/kubetest"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

type kubeSandbox struct {
	ID     string `json:"sandbox_id"`
	Status string `json:"status"`
	Fault  *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"fault"`
}

func createOnKube(t *testing.T, p *testserver.Process, labels map[string]string) string {
	t.Helper()
	var sb kubeSandbox
	body := map[string]any{"image": "orchard.local/shell:dev", "block_network": true, "cpu": "100m", "memory": "64Mi", "labels": labels}
	if _, err := call(t.Context(), p, "POST", "/sandboxes", body, &sb); err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

func waitOnKube(t *testing.T, p *testserver.Process, id string) kubeSandbox {
	t.Helper()
	var sb kubeSandbox
	if _, err := call(t.Context(), p, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil, &sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

// awaitStatus polls GET /sandboxes/{id} on p until its status is want.
func awaitStatus(t *testing.T, p *testserver.Process, id, want string, within time.Duration) kubeSandbox {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var sb kubeSandbox
		_, err := call(t.Context(), p, "GET", "/sandboxes/"+id, nil, &sb)
		if err == nil && sb.Status == want {
			return sb
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: status %q (err %v) after %s, want %q", id, sb.Status, err, within, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Two replicas on one Redis and one sandbox namespace share the work as on
// the local runtime: a sandbox created through one is waited on, listed
// and deleted through the other; the record of a pod deleted behind the
// servers' backs is failed with a classified fault; and a replica that is
// stopped and started again serves every sandbox it had. The API server
// still sees no pod reads.
func TestServeOnKubeReplicas(t *testing.T) {
	cs := kubetest.Client(t) // skips without a cluster
	ns := kubetest.Namespace(t, cs)
	rd := testenv.StartRedis(t)
	shared := []string{"USE_REDIS=true", "REDIS_URL=" + rd.URL(), "CLEANUP_INTERVAL_SECONDS=1"}
	a := startKubeServerIn(t, ns, shared...)
	b := startKubeServerIn(t, ns, shared...)
	ctx := t.Context()

	var ids []string
	for i, p := range []*testserver.Process{a, b, a, b} {
		ids = append(ids, createOnKube(t, p, map[string]string{"n": fmt.Sprint(i)}))
	}
	for i, id := range ids {
		other := []*testserver.Process{b, a}[i%2]
		if sb := waitOnKube(t, other, id); sb.Status != "ready" {
			t.Fatalf("sandbox %s through the other replica: %+v (fault %+v)", id, sb, sb.Fault)
		}
	}
	for _, p := range []*testserver.Process{a, b} {
		var list struct{ Sandboxes []kubeSandbox }
		if _, err := call(ctx, p, "GET", "/sandboxes", nil, &list); err != nil {
			t.Fatal(err)
		}
		if len(list.Sandboxes) != len(ids) {
			t.Fatalf("%s lists %d sandboxes, want %d", p.URL, len(list.Sandboxes), len(ids))
		}
	}

	// A pod deleted outside Orchard: whichever replica leads cleanup fails
	// its record; both report it.
	lost := ids[0]
	zero := int64(0)
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "sandbox-"+lost, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	sb := awaitStatus(t, b, lost, "failed", 30*time.Second)
	if sb.Fault == nil || sb.Fault.Code != faults.CodeSandboxDied {
		t.Fatalf("record of a deleted pod: %+v, want fault %s", sb, faults.CodeSandboxDied)
	}
	awaitStatus(t, a, lost, "failed", 5*time.Second)

	// A replica restarted (SIGTERM, then a new process on the same Redis)
	// serves the sandboxes it had, from its informer and the store.
	if err := a.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	a = startKubeServerIn(t, ns, shared...)
	for _, id := range ids[1:] {
		if sb := waitOnKube(t, a, id); sb.Status != "ready" {
			t.Fatalf("sandbox %s after the replica's restart: %+v", id, sb)
		}
	}

	// Deletes through the replica that did not create them.
	for i, id := range ids {
		if _, err := call(ctx, []*testserver.Process{b, a}[i%2], "DELETE", "/sandboxes/"+id, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	awaitNoPods(t, cs, ns)
	for _, p := range []*testserver.Process{a, b} {
		if calls := kubeCalls(t, p); calls["get pods"] != 0 || calls["list pods"] > 2 {
			t.Errorf("%s: API calls %v: want no pod gets and at most the informer's lists", p.URL, calls)
		}
	}
}

// A server on the memory store that is killed and started again adopts
// the pods its predecessor left: their records are rebuilt from the
// informer (the spec each pod carries), so clients holding their ids carry
// on; delete then removes them.
func TestServeOnKubeRestartAdopts(t *testing.T) {
	p, cs, ns := startKubeServer(t)
	ids := []string{createOnKube(t, p, map[string]string{"keep": "1"}), createOnKube(t, p, nil)}
	for _, id := range ids {
		waitOnKube(t, p, id)
	}
	p.Kill()
	p = startKubeServerIn(t, ns)
	for _, id := range ids {
		if sb := waitOnKube(t, p, id); sb.Status != "ready" {
			t.Fatalf("sandbox %s after a crash and restart: %+v", id, sb)
		}
	}
	var list struct{ Sandboxes []kubeSandbox }
	if _, err := call(t.Context(), p, "GET", "/sandboxes?labels=keep%3D1", nil, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != ids[0] {
		t.Fatalf("label filter after restart: %+v, want only %s", list, ids[0])
	}
	for _, id := range ids {
		if _, err := call(t.Context(), p, "DELETE", "/sandboxes/"+id, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	awaitNoPods(t, cs, ns)
}
