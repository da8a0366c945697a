// Package storetest is the contract every store.Store implementation must
// pass: the memory store runs it in-process, the Redis store against a real
// redis-server.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/store"
)

// Run runs the contract against stores made by newStore (a fresh, empty
// store per call).
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("SandboxCRUD", func(t *testing.T) { testSandboxCRUD(t, newStore(t)) })
	t.Run("SandboxConflict", func(t *testing.T) { testSandboxConflict(t, newStore(t)) })
	t.Run("SandboxIsolation", func(t *testing.T) { testIsolation(t, newStore(t)) })
	t.Run("ConcurrentUpdates", func(t *testing.T) { testConcurrentUpdates(t, newStore(t)) })
	t.Run("Jobs", func(t *testing.T) { testJobs(t, newStore(t)) })
	t.Run("PubSub", func(t *testing.T) { testPubSub(t, newStore(t)) })
	t.Run("List", func(t *testing.T) { testList(t, newStore(t)) })

	// Optional abilities: a store that has them must honour their contract.
	t.Run("LockExclusion", func(t *testing.T) { testLockExclusion(t, locker(t, newStore(t))) })
	t.Run("LockWakesOnUnlock", func(t *testing.T) { testLockWakesOnUnlock(t, locker(t, newStore(t))) })
	t.Run("LockCanceled", func(t *testing.T) { testLockCanceled(t, locker(t, newStore(t))) })
	t.Run("LockRefresh", func(t *testing.T) { testLockRefresh(t, locker(t, newStore(t))) })
	t.Run("Fencing", func(t *testing.T) { testFencing(t, newStore(t)) })
	t.Run("Elector", func(t *testing.T) { testElector(t, elector(t, newStore(t))) })
	t.Run("Campaign", func(t *testing.T) { testCampaign(t, elector(t, newStore(t))) })
	t.Run("CampaignStalled", func(t *testing.T) { testCampaignStalled(t, elector(t, newStore(t))) })
	t.Run("Docs", func(t *testing.T) { testDocs(t, docs(t, newStore(t))) })
	t.Run("DocsFenced", func(t *testing.T) { testDocsFenced(t, newStore(t)) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %s", code)
	}
	if got := faults.Of(err).Code; got != code {
		t.Fatalf("got code %q (%v), want %q", got, err, code)
	}
}

func testSandboxCRUD(t *testing.T, s store.Store) {
	c := ctx(t)
	hb := 12.5
	rec := store.Sandbox{ID: "abc12345", Namespace: "sandbox-pods", Kind: api.KindShell, Image: "host",
		CPU: "1", Memory: "1Gi", CreatedAt: 100.25, Status: api.StatusPending, CreationTimeout: 60,
		LastHeartbeat: &hb, Labels: map[string]string{"team": "rl"}, Env: map[string]string{"A": "b"}}
	if err := s.CreateSandbox(c, rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(c, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Image != "host" || got.CreatedAt != 100.25 || got.Labels["team"] != "rl" || got.Env["A"] != "b" ||
		got.LastHeartbeat == nil || *got.LastHeartbeat != 12.5 || got.CreationTimeout != 60 {
		t.Fatalf("round trip lost data: %+v", got)
	}
	upd, err := s.UpdateSandbox(c, rec.ID, func(r *store.Sandbox) error {
		r.Ready, r.Status, r.AgentAddr = true, api.StatusReady, "unix:/x"
		return nil
	})
	if err != nil || !upd.Ready || upd.AgentAddr != "unix:/x" {
		t.Fatalf("update: %+v %v", upd, err)
	}
	got, _ = s.GetSandbox(c, rec.ID)
	if !got.Ready || got.Status != api.StatusReady {
		t.Fatalf("update not stored: %+v", got)
	}
	abort := errors.New("abort")
	if _, err := s.UpdateSandbox(c, rec.ID, func(r *store.Sandbox) error { r.Image = "changed"; return abort }); !errors.Is(err, abort) {
		t.Fatalf("aborted update returned %v", err)
	}
	if got, _ := s.GetSandbox(c, rec.ID); got.Image != "host" {
		t.Fatalf("aborted update was stored: %q", got.Image)
	}
	if err := s.DeleteSandbox(c, rec.ID); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetSandbox(c, rec.ID)
	wantCode(t, err, faults.CodeSandboxNotFound)
	_, err = s.UpdateSandbox(c, rec.ID, func(*store.Sandbox) error { return nil })
	wantCode(t, err, faults.CodeSandboxNotFound)
	if err := s.DeleteSandbox(c, rec.ID); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}

func testSandboxConflict(t *testing.T, s store.Store) {
	c := ctx(t)
	if err := s.CreateSandbox(c, store.Sandbox{ID: "dup", Image: "a"}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.CreateSandbox(c, store.Sandbox{ID: "dup", Image: "b"}), faults.CodeSandboxExists)
	if got, _ := s.GetSandbox(c, "dup"); got.Image != "a" {
		t.Fatalf("duplicate create overwrote the record: %q", got.Image)
	}
	// Ids that collide with key names of a naive layout must be plain ids.
	for _, id := range []string{"all", "ip:x", "lock:y"} {
		if err := s.CreateSandbox(c, store.Sandbox{ID: id}); err != nil {
			t.Fatalf("id %q: %v", id, err)
		}
	}
}

// Values returned must not alias the stored ones.
func testIsolation(t *testing.T, s store.Store) {
	c := ctx(t)
	if err := s.CreateSandbox(c, store.Sandbox{ID: "iso", Labels: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetSandbox(c, "iso")
	got.Labels["k"] = "mutated"
	if again, _ := s.GetSandbox(c, "iso"); again.Labels["k"] != "v" {
		t.Fatal("caller's map aliases the store")
	}
}

func testConcurrentUpdates(t *testing.T, s store.Store) {
	c := ctx(t)
	if err := s.CreateSandbox(c, store.Sandbox{ID: "ctr", Labels: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.UpdateSandbox(c, "ctr", func(r *store.Sandbox) error {
				r.Labels[fmt.Sprint(i)] = "x"
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got, _ := s.GetSandbox(c, "ctr")
	if len(got.Labels) != n {
		t.Fatalf("lost updates: %d of %d labels", len(got.Labels), n)
	}
}

func testJobs(t *testing.T, s store.Store) {
	c := ctx(t)
	j := api.Job{JobID: "j1", SandboxID: "sb", Command: "echo hi", Status: api.JobQueued, CreatedAt: 5}
	if err := s.CreateJob(c, j); err != nil {
		t.Fatal(err)
	}
	code, now := 0, 7.5
	upd, err := s.UpdateJob(c, "j1", func(j *api.Job) error {
		j.Status, j.Stdout, j.ExitCode, j.CompletedAt = api.JobSucceeded, "hi\n", &code, &now
		return nil
	})
	if err != nil || upd.Status != api.JobSucceeded {
		t.Fatalf("update job: %+v %v", upd, err)
	}
	got, err := s.GetJob(c, "j1")
	if err != nil || got.Stdout != "hi\n" || got.ExitCode == nil || *got.ExitCode != 0 || *got.CompletedAt != 7.5 {
		t.Fatalf("job round trip: %+v %v", got, err)
	}
	jobs, err := s.ListJobs(c)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("list jobs: %v %v", jobs, err)
	}
	if err := s.DeleteJob(c, "j1"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetJob(c, "j1")
	wantCode(t, err, faults.CodeJobNotFound)
	_, err = s.UpdateJob(c, "j1", func(*api.Job) error { return nil })
	wantCode(t, err, faults.CodeJobNotFound)
}

func testPubSub(t *testing.T, s store.Store) {
	c := ctx(t)
	ev, cancel, err := s.Subscribe(c, store.JobTopic("x"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	other, cancelOther, err := s.Subscribe(c, store.JobTopic("y"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancelOther()
	for range 3 { // coalesced, must not block
		if err := s.Publish(c, store.JobTopic("x")); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-ev:
	case <-time.After(5 * time.Second):
		t.Fatal("no event delivered")
	}
	select {
	case <-other:
		t.Fatal("event delivered to another topic")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	cancel() // idempotent
	if err := s.Publish(c, store.JobTopic("x")); err != nil {
		t.Fatal(err)
	}
}

func testList(t *testing.T, s store.Store) {
	c := ctx(t)
	for i, id := range []string{"b", "a", "c"} {
		if err := s.CreateSandbox(c, store.Sandbox{ID: id, CreatedAt: float64(10 - i)}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListSandboxes(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].ID != "c" || got[2].ID != "b" {
		t.Fatalf("list order by created_at: %+v", got)
	}
}
