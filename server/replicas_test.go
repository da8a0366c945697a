package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/store/redis"
)

// replicas starts two servers on one host sharing a real redis-server and
// one state directory, as two `orchard serve --store redis` would.
func replicas(t *testing.T, run ...bool) (a, b *testserver.Server, rs *testenv.RedisServer) {
	t.Helper()
	rs = testenv.StartRedis(t)
	dir := testserver.StateDir(t)
	open := func() *redis.Store {
		st, err := redis.New(context.Background(), redis.Config{URL: rs.URL(), Prefix: "t:"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	loop := len(run) > 0 && run[0]
	a = testserver.Start(t, testserver.Options{StateDir: dir, Store: open(), Run: loop})
	b = testserver.Start(t, testserver.Options{StateDir: dir, Store: open(), Run: loop})
	return a, b, rs
}

// A job runs on the replica that took its exec; a cancel sent to the other
// replica reaches it through the store and kills the command.
func TestReplicaCancelsAnothersJob(t *testing.T) {
	a, b, _ := replicas(t, true)
	id := createReady(t, a, map[string]any{"memory": "256Mi"})
	jobID := startJob(t, a, id, "echo started; sleep 60")
	awaitJobState(t, b, jobID, func(j api.Job) bool { return j.Stdout == "started\n" })
	r := call(t, b, "POST", "/jobs/"+jobID+"/cancel", nil)
	want(t, r, 200)
	j := jobOf(t, r)
	wantCanceled(t, j, "started\n")
	if j.Runner == "" || j.Runner != jobOf(t, call(t, a, "GET", "/jobs/"+jobID, nil)).Runner {
		t.Fatalf("runner %q", j.Runner)
	}
	awaitNoProcess(t, b, id, "sleep")
}

func TestReplicasShareSandboxesAndJobs(t *testing.T) {
	a, b, _ := replicas(t)
	r := call(t, a, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "memory": "256Mi"})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	// Readiness reaches the other replica's waiter through pub/sub.
	w := call(t, b, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil)
	want(t, w, 200)
	if w.body["status"] != "ready" {
		t.Fatalf("wait on the other replica: %s", w.raw)
	}
	// Exec on B reaches the agent A started; its job is visible on A.
	j := execWait(t, b, id, map[string]any{"command": "echo from-b"})
	if j.Stdout != "from-b\n" {
		t.Fatalf("exec on replica B: %+v", j)
	}
	want(t, call(t, a, "GET", "/jobs/"+j.JobID, nil), 200)

	// A job started on A completes a waiter on B promptly (no polling).
	q := call(t, a, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "sleep 0.3; echo done"})
	start := time.Now()
	jw := call(t, b, "GET", "/jobs/"+q.body["job_id"].(string)+"/wait?timeout=30", nil)
	if jw.body["status"] != "succeeded" || time.Since(start) > 3*time.Second {
		t.Fatalf("job wait across replicas: %s after %v", jw.raw, time.Since(start))
	}

	// Jobs of one sandbox stay serialised whichever replica gets them.
	var wg sync.WaitGroup
	jobs := make([]map[string]any, 2)
	for i, srv := range []*testserver.Server{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			jobs[i] = call(t, srv, "POST", "/sandboxes/"+id+"/exec",
				map[string]any{"command": "sleep 0.4", "wait": true}).body
		}()
	}
	wg.Wait()
	s0, e0 := jobs[0]["started_at"].(float64), jobs[0]["completed_at"].(float64)
	s1, e1 := jobs[1]["started_at"].(float64), jobs[1]["completed_at"].(float64)
	if s0 < e1 && s1 < e0 {
		t.Fatalf("jobs on two replicas overlapped: [%v,%v] and [%v,%v]", s0, e0, s1, e1)
	}

	// Delete on B; A sees it gone.
	want(t, call(t, b, "DELETE", "/sandboxes/"+id, nil), 200)
	want(t, call(t, a, "GET", "/sandboxes/"+id, nil), 404)
}

func TestRedisOutageFailsFastAndRecovers(t *testing.T) {
	a, _, rs := replicas(t)
	id := createReady(t, a, map[string]any{"memory": "256Mi"})
	rs.Stop()
	start := time.Now()
	r := call(t, a, "GET", "/sandboxes/"+id, nil)
	if r.status != 503 || time.Since(start) > 5*time.Second {
		t.Fatalf("with Redis down: %d after %v: %s", r.status, time.Since(start), r.raw)
	}
	e, _ := r.body["error"].(map[string]any)
	if e["code"] != "platform.store_unavailable" || e["retryable"] != true || r.header.Get("Retry-After") == "" {
		t.Fatalf("outage classification: %s (Retry-After %q)", r.raw, r.header.Get("Retry-After"))
	}
	rs.Start()
	// Redis came back empty (no persistence in the test server): the
	// replica carries on without a restart.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := call(t, a, "GET", "/health", nil)
		g := call(t, a, "GET", "/sandboxes", nil)
		if r.status == 200 && g.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after Redis returned: %s", g.raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	createReady(t, a, map[string]any{"memory": "256Mi"})
}

// An episode's calls may land on any replica: the suite loaded on one is
// known to the other, steps alternate between them, concurrent steps on
// two replicas are serialised, and the recording holds every step.
func TestReplicasShareEpisodes(t *testing.T) {
	testenv.RequireChromium(t)
	a, b, rs := replicas(t)
	loadShop(t, a)
	e := call(t, b, "POST", "/episodes", map[string]any{"task_id": "search-lamp", "max_steps": 10})
	want(t, e, 200)
	id := e.body["episode_id"].(string)
	for i, act := range searchSteps[:2] {
		srv := []*testserver.Server{a, b}[i%2]
		s := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": act})
		want(t, s, 200)
		if info := s.body["info"].(map[string]any); info["step"] != float64(i+1) || info["error"] != nil {
			t.Fatalf("step %d on replica %d: %s", i+1, i%2, s.raw)
		}
	}
	// The last click and a no-op wait race on the two replicas: both run,
	// one after the other, as steps 3 and 4.
	var wg sync.WaitGroup
	steps := make([]float64, 2)
	for i, act := range []map[string]any{searchSteps[2], {"type": "wait", "ms": 50}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := call(t, []*testserver.Server{a, b}[i], "POST", "/episodes/"+id+"/step", map[string]any{"action": act})
			want(t, s, 200)
			steps[i] = s.body["info"].(map[string]any)["step"].(float64)
		}()
	}
	wg.Wait()
	if steps[0]+steps[1] != 7 || steps[0] == steps[1] {
		t.Fatalf("concurrent steps on two replicas numbered %v, want 3 and 4", steps)
	}
	g := call(t, a, "GET", "/episodes/"+id, nil)
	want(t, g, 200)
	if g.body["steps"] != 4.0 || g.body["status"] != "running" {
		t.Fatalf("episode seen on A: %s", g.raw)
	}
	l := call(t, b, "GET", "/episodes", nil)
	want(t, l, 200)
	if eps := l.body["episodes"].([]any); len(eps) != 1 || eps[0].(map[string]any)["episode_id"] != id {
		t.Fatalf("list on B: %s", l.raw)
	}
	f := call(t, a, "POST", "/episodes/"+id+"/finish", map[string]any{"answer": "3 results"})
	want(t, f, 200)
	if f.body["outcome"] != "success" {
		t.Fatalf("finish on A: %s", f.raw)
	}
	// finish is idempotent on the other replica, which sees the result.
	f2 := call(t, b, "POST", "/episodes/"+id+"/finish", nil)
	if f2.body["outcome"] != "success" || f2.body["steps"] != 4.0 {
		t.Fatalf("finish again on B: %s", f2.raw)
	}
	rec := call(t, b, "GET", "/recordings/"+id, nil)
	want(t, rec, 200)
	if n := len(rec.body["steps"].([]any)); n != 5 || rec.body["manifest"].(map[string]any)["outcome"] != "success" {
		t.Fatalf("recording has %d steps (want the start page and 4): %s", n, rec.raw)
	}
	want(t, call(t, a, "GET", "/sandboxes/"+e.body["sandbox_id"].(string), nil), 404)

	// Redis down: an episode call fails fast and classified.
	rs.Stop()
	start := time.Now()
	r := call(t, b, "GET", "/episodes/"+id, nil)
	if r.status != 503 || time.Since(start) > 5*time.Second {
		t.Fatalf("episode read with Redis down: %d after %v: %s", r.status, time.Since(start), r.raw)
	}
	rs.Start()
}
