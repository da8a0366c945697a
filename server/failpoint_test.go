package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/failpoint"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// Failures a fault plan cannot reach, through named failpoints: a runtime
// that refuses creates for capacity twice is retried into a ready sandbox,
// and the retries show in the metrics; an agent that cannot be reached and
// a store that refuses writes come out classified.
func TestFailpoints(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})

	t.Cleanup(failpoint.Enable("runtime.local.create", failpoint.Return(
		faults.New(faults.CodeCapacity, faults.Capacity, faults.Platform, "no room (failpoint)")).Times(2)))
	id := createReady(t, srv, nil)
	r := call(t, srv, "GET", "/sandboxes/"+id, nil)
	want(t, r, 200)
	m := scrape(t, srv)
	if !strings.Contains(m, `orchard_retries_total{layer="create"} 2`) {
		t.Errorf("create retries not counted:\n%s", grepLines(m, "orchard_retries_total"))
	}

	// A create failure that is not about capacity is not retried.
	t.Cleanup(failpoint.Enable("runtime.local.create", failpoint.Return(
		faults.New(faults.CodeCreateFailed, faults.Internal, faults.Platform, "broken (failpoint)")).Times(1)))
	r = call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true})
	want(t, r, 200)
	w := call(t, srv, "GET", "/sandboxes/"+r.body["sandbox_id"].(string)+"/wait?timeout=30", nil)
	if w.body["status"] != "failed" || !strings.Contains(string(w.raw), faults.CodeCreateFailed) {
		t.Errorf("create failure: %d %s", w.status, w.raw)
	}

	// An agent that does not answer once is reached again: the exec is
	// retried within its connect window and the job succeeds.
	t.Cleanup(failpoint.Enable("agent.client.request", failpoint.Return(
		faults.New(faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "agent unreachable (failpoint)")).Times(1)))
	j := execWait(t, srv, id, map[string]any{"command": "echo back"})
	if j.Status != "succeeded" || strings.TrimSpace(j.Stdout) != "back" {
		t.Errorf("exec after one unreachable agent: %+v", j)
	}
}

func scrape(t *testing.T, srv *testserver.Server) string {
	t.Helper()
	res, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The ends of a create and of a job are written whatever the store does
// meanwhile: nothing else ever moves a record out of pending, nor ends a
// job whose runner lives. A store that fails those writes twice is
// retried; a job whose exec lease was lost (the store stalled past it) is
// still ended by its runner; and the exec answers what the command did.
func TestStoreBlipsAtTheEnds(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	unavailable := faults.New(faults.CodeStoreUnavailable, faults.Unavailable, faults.Platform, "store unavailable (failpoint)")

	t.Cleanup(failpoint.Enable("manager.create.outcome", failpoint.Return(unavailable).Times(2)))
	id := createReady(t, srv, nil)

	for _, tc := range []struct {
		name string
		err  *faults.Error
		n    int
	}{
		{"store unavailable", unavailable, 2},
		{"exec lease lost", faults.New(faults.CodeLockLost, faults.Conflict, faults.Platform, "lease lost (failpoint)"), 1},
	} {
		t.Cleanup(failpoint.Enable("manager.job.final", failpoint.Return(tc.err).Times(tc.n)))
		r := call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "echo " + tc.name, "wait": true})
		if r.status != 200 || r.body["status"] != "succeeded" || r.body["stdout"] != tc.name+"\n" {
			t.Fatalf("%s: exec answered %s", tc.name, r.raw)
		}
		j := call(t, srv, "GET", "/jobs/"+r.body["job_id"].(string), nil)
		if j.body["status"] != "succeeded" || j.body["exit_code"] != float64(0) {
			t.Fatalf("%s: stored job %s", tc.name, j.raw)
		}
	}
}
