package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/store"
)

func locker(t *testing.T, s store.Store) store.Locker {
	t.Helper()
	l, ok := s.(store.Locker)
	if !ok {
		t.Skipf("%T is not a store.Locker", s)
	}
	return l
}

func elector(t *testing.T, s store.Store) store.Elector {
	t.Helper()
	e, ok := s.(store.Elector)
	if !ok {
		t.Skipf("%T is not a store.Elector", s)
	}
	return e
}

// Holders of one lock never overlap, and each gets a larger token than the
// one before it.
func testLockExclusion(t *testing.T, l store.Locker) {
	c := ctx(t)
	const holders, rounds = 4, 5
	var inside atomic.Int32
	var mu sync.Mutex // guards last
	var last int64
	var wg sync.WaitGroup
	for range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				lease, err := l.Lock(c, "excl", 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders inside the lock", n)
				}
				mu.Lock()
				if lease.Token() <= last {
					t.Errorf("token %d after %d: not monotonic", lease.Token(), last)
				}
				last = lease.Token()
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				inside.Add(-1)
				if err := lease.Unlock(c); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	// Different names do not exclude each other.
	a, err := l.Lock(c, "name-a", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Lock(c, "name-b", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = a.Unlock(c)
	_ = b.Unlock(c)
}

// A waiter is woken by the release, not by the holder's long lease running out.
func testLockWakesOnUnlock(t *testing.T, l store.Locker) {
	c := ctx(t)
	first, err := l.Lock(c, "wake", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan store.Lease, 1)
	go func() {
		second, err := l.Lock(c, "wake", time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- second
	}()
	select {
	case <-got:
		t.Fatal("second Lock returned while the lock was held")
	case <-time.After(100 * time.Millisecond):
	}
	start := time.Now()
	if err := first.Unlock(c); err != nil {
		t.Fatal(err)
	}
	select {
	case second := <-got:
		t.Logf("waiter acquired %v after unlock", time.Since(start))
		if second == nil {
			return
		}
		if second.Token() <= first.Token() {
			t.Errorf("token %d after %d", second.Token(), first.Token())
		}
		_ = second.Unlock(c)
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by Unlock")
	}
}

func testLockCanceled(t *testing.T, l store.Locker) {
	c := ctx(t)
	held, err := l.Lock(c, "busy", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(c)
	wctx, cancel := context.WithTimeout(c, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = l.Lock(wctx, "busy", time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock of a held lock with an expiring context: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Lock returned %v after its context ended", d)
	}
}

// Refresh keeps a short lease alive past its ttl.
func testLockRefresh(t *testing.T, l store.Locker) {
	c := ctx(t)
	// Long enough that a loaded machine's late wake-ups (a third of it
	// each) do not let the lease lapse between refreshes.
	const ttl = time.Second
	lease, err := l.Lock(c, "refresh", ttl)
	if err != nil {
		t.Fatal(err)
	}
	for range 7 {
		time.Sleep(ttl / 3)
		if err := lease.Refresh(c); err != nil {
			t.Fatalf("refresh: %v", err)
		}
	}
	if err := lease.Valid(c); err != nil {
		t.Fatalf("refreshed lease not valid: %v", err)
	}
	wctx, cancel := context.WithTimeout(c, ttl/2)
	defer cancel()
	if _, err := l.Lock(wctx, "refresh", ttl); err == nil {
		t.Fatal("a refreshed lock was taken by another holder")
	}
	if err := lease.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if err := lease.Valid(c); !faults.Is(err, faults.CodeLockLost) {
		t.Fatalf("Valid after Unlock: %v", err)
	}
}

// A holder whose lease expired and was taken over cannot write through it.
func testFencing(t *testing.T, s store.Store) {
	l := locker(t, s)
	f, ok := s.(store.Fenced)
	if !ok {
		t.Skipf("%T is not a store.Fenced", s)
	}
	c := ctx(t)
	if err := s.CreateSandbox(c, store.Sandbox{ID: "fx", Status: api.StatusPending}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(c, api.Job{JobID: "jx", SandboxID: "fx", Status: api.JobQueued}); err != nil {
		t.Fatal(err)
	}
	const ttl = 200 * time.Millisecond
	first, err := l.Lock(c, "sandbox:fx", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.UpdateSandboxFenced(c, first, "fx", func(r *store.Sandbox) error { r.Status = "first"; return nil }); err != nil {
		t.Fatalf("fenced update while held: %v", err)
	}
	if _, err := f.UpdateSandboxFenced(c, first, "missing", func(*store.Sandbox) error { return nil }); !faults.Is(err, faults.CodeSandboxNotFound) {
		t.Fatalf("fenced update of a missing record: %v", err)
	}
	abort := errors.New("abort")
	if _, err := f.UpdateJobFenced(c, first, "jx", func(*api.Job) error { return abort }); !errors.Is(err, abort) {
		t.Fatalf("aborted fenced update returned %v", err)
	}

	// first stops refreshing (paused, partitioned); second gets the lock
	// once first's lease has run out.
	start := time.Now()
	second, err := l.Lock(c, "sandbox:fx", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited > ttl+2*time.Second {
		t.Errorf("expired lock taken over after %v (ttl %v)", waited, ttl)
	}
	if second.Token() <= first.Token() {
		t.Fatalf("token %d after %d", second.Token(), first.Token())
	}
	for name, err := range map[string]error{
		"Valid":   first.Valid(c),
		"Refresh": first.Refresh(c),
		"UpdateSandboxFenced": func() error {
			_, err := f.UpdateSandboxFenced(c, first, "fx", func(r *store.Sandbox) error { r.Status = "stale"; return nil })
			return err
		}(),
		"UpdateJobFenced": func() error {
			_, err := f.UpdateJobFenced(c, first, "jx", func(j *api.Job) error { j.Status = api.JobFailed; return nil })
			return err
		}(),
		"Unlock": first.Unlock(c),
	} {
		if !faults.Is(err, faults.CodeLockLost) {
			t.Errorf("%s by the stale holder: %v, want %s", name, err, faults.CodeLockLost)
			continue
		}
		if e := faults.Of(err); e.Category != faults.Conflict || e.Source != faults.Platform {
			t.Errorf("%s: class %s/%s", name, e.Category, e.Source)
		}
	}
	if got, _ := s.GetSandbox(c, "fx"); got.Status != "first" {
		t.Fatalf("stale holder's write was stored: status %q", got.Status)
	}
	if got, _ := s.GetJob(c, "jx"); got.Status != api.JobQueued {
		t.Fatalf("stale holder's job write was stored: status %q", got.Status)
	}
	if err := second.Valid(c); err != nil {
		t.Fatalf("stale holder's Unlock released the new holder: %v", err)
	}
	if _, err := f.UpdateSandboxFenced(c, second, "fx", func(r *store.Sandbox) error { r.Status = "second"; return nil }); err != nil {
		t.Fatalf("new holder's fenced update: %v", err)
	}
	if _, err := f.UpdateJobFenced(c, second, "jx", func(j *api.Job) error { j.Status = api.JobRunning; return nil }); err != nil {
		t.Fatalf("new holder's fenced job update: %v", err)
	}
	if err := second.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if _, err := f.UpdateSandboxFenced(c, second, "fx", func(*store.Sandbox) error { return nil }); !faults.Is(err, faults.CodeLockLost) {
		t.Fatalf("fenced update after Unlock: %v", err)
	}
}

func testElector(t *testing.T, e store.Elector) {
	c := ctx(t)
	try := func(holder string, ttl time.Duration, want bool) {
		t.Helper()
		got, err := e.TryAcquire(c, "cleanup", holder, ttl)
		if err != nil || got != want {
			t.Fatalf("TryAcquire(%s) = %v, %v; want %v", holder, got, err, want)
		}
	}
	try("a", time.Minute, true)
	try("b", time.Minute, false)
	try("a", time.Minute, true) // renewal
	if err := e.Release(c, "cleanup", "b"); err != nil {
		t.Fatal(err)
	}
	try("b", time.Minute, false) // b's release did not free a's lease
	if err := e.Release(c, "cleanup", "a"); err != nil {
		t.Fatal(err)
	}
	try("b", 200*time.Millisecond, true)
	try("a", time.Minute, false)
	time.Sleep(400 * time.Millisecond) // b stops renewing
	try("a", time.Minute, true)
	if ok, err := e.TryAcquire(c, "other", "b", time.Minute); err != nil || !ok {
		t.Fatalf("leases of different names: %v %v", ok, err)
	}
}

// leaders records who leads, failing the test if two ever lead at once.
type leaders struct {
	t       *testing.T
	mu      sync.Mutex // guards current and history
	current string
	history []string
}

func (l *leaders) lead(name string) func(ctx context.Context) {
	return func(ctx context.Context) {
		l.mu.Lock()
		if l.current != "" {
			l.t.Errorf("%s leads while %s leads", name, l.current)
		}
		l.current = name
		l.history = append(l.history, name)
		l.mu.Unlock()
		<-ctx.Done()
		l.mu.Lock()
		l.current = ""
		l.mu.Unlock()
	}
}

func (l *leaders) waitFor(pred func(current string, history []string) bool, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		ok := pred(l.current, l.history)
		l.mu.Unlock()
		if ok {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

func campaign(ctx context.Context, e store.Elector, holder string, ttl time.Duration, lead func(context.Context)) <-chan error {
	done := make(chan error, 1)
	go func() { done <- store.Campaign(ctx, e, "leader", holder, ttl, lead) }()
	return done
}

// One of two campaigners leads; when it steps down the other takes over.
func testCampaign(t *testing.T, e store.Elector) {
	c := ctx(t)
	// Long enough that a loaded machine's renewal never lags a whole lease.
	const ttl = time.Second
	ls := &leaders{t: t}
	actx, stopA := context.WithCancel(c)
	bctx, stopB := context.WithCancel(c)
	defer stopA()
	defer stopB()
	doneA := campaign(actx, e, "a", ttl, ls.lead("a"))
	if !ls.waitFor(func(cur string, _ []string) bool { return cur == "a" }, 5*time.Second) {
		t.Fatal("a never led")
	}
	doneB := campaign(bctx, e, "b", ttl, ls.lead("b"))
	time.Sleep(3 * ttl) // several renewal rounds: b must not lead
	stopA()
	if err := <-doneA; !errors.Is(err, context.Canceled) {
		t.Fatalf("Campaign returned %v after its context was canceled", err)
	}
	if !ls.waitFor(func(cur string, _ []string) bool { return cur == "b" }, 5*time.Second) {
		t.Fatal("b did not take over")
	}
	stopB()
	<-doneB
	if fmt.Sprint(ls.history) != "[a b]" {
		t.Fatalf("leaders: %v", ls.history)
	}
}

// stalling wraps an Elector; once stalled, a holder's calls hang until
// their context ends, as on a partitioned network.
type stalling struct {
	store.Elector
	stalled atomic.Bool
}

func (s *stalling) TryAcquire(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	if s.stalled.Load() {
		<-ctx.Done()
		return false, context.Cause(ctx)
	}
	return s.Elector.TryAcquire(ctx, name, holder, ttl)
}

func (s *stalling) Release(ctx context.Context, name, holder string) error {
	if s.stalled.Load() {
		<-ctx.Done()
		return context.Cause(ctx)
	}
	return s.Elector.Release(ctx, name, holder)
}

// A leader that cannot renew stops leading before its lease expires, and
// the other campaigner takes over once it has.
func testCampaignStalled(t *testing.T, e store.Elector) {
	c := ctx(t)
	const ttl = 300 * time.Millisecond
	ls := &leaders{t: t}
	sa := &stalling{Elector: e}
	actx, stopA := context.WithCancel(c)
	defer stopA()
	doneA := campaign(actx, sa, "a", ttl, ls.lead("a"))
	if !ls.waitFor(func(cur string, _ []string) bool { return cur == "a" }, 5*time.Second) {
		t.Fatal("a never led")
	}
	bctx, stopB := context.WithCancel(c)
	defer stopB()
	doneB := campaign(bctx, e, "b", ttl, ls.lead("b"))
	sa.stalled.Store(true)
	if !ls.waitFor(func(cur string, _ []string) bool { return cur == "b" }, 5*time.Second) {
		t.Fatal("b did not take over from a stalled leader")
	}
	stopA()
	stopB()
	<-doneA
	<-doneB
}

func docs(t *testing.T, s store.Store) store.Docs {
	d, ok := s.(store.Docs)
	if !ok {
		t.Skipf("%T is not a store.Docs", s)
	}
	return d
}

// Documents: whole-document writes, copies out, kinds kept apart, expiry
// that GetDoc and ListDocs both honour.
func testDocs(t *testing.T, d store.Docs) {
	c := ctx(t)
	if _, ok, err := d.GetDoc(c, "episode", "e1"); err != nil || ok {
		t.Fatalf("GetDoc of a missing document: ok=%v err=%v", ok, err)
	}
	if err := d.PutDoc(c, "episode", "e1", []byte(`{"v":1}`), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.PutDoc(c, "episode", "e1", []byte(`{"v":2}`), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.PutDoc(c, "other", "e1", []byte(`{"other":true}`), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.PutDoc(c, "episode", "short", []byte(`{"v":3}`), 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	b, ok, err := d.GetDoc(c, "episode", "e1")
	if err != nil || !ok || string(b) != `{"v":2}` {
		t.Fatalf("GetDoc = %q, %v, %v; want the last write", b, ok, err)
	}
	b[0] = 'X' // the store must have handed out a copy
	if b, _, _ := d.GetDoc(c, "episode", "e1"); string(b) != `{"v":2}` {
		t.Fatalf("changing a returned document changed the store: %q", b)
	}
	list, err := d.ListDocs(c, "episode")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || string(list["e1"]) != `{"v":2}` || string(list["short"]) != `{"v":3}` {
		t.Fatalf("ListDocs(episode) = %q", list)
	}
	time.Sleep(400 * time.Millisecond)
	if _, ok, err := d.GetDoc(c, "episode", "short"); err != nil || ok {
		t.Fatalf("expired document still read: ok=%v err=%v", ok, err)
	}
	if list, err := d.ListDocs(c, "episode"); err != nil || len(list) != 1 || list["e1"] == nil {
		t.Fatalf("ListDocs after expiry = %q, %v; want only e1", list, err)
	}
	if err := d.DeleteDoc(c, "episode", "e1"); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteDoc(c, "episode", "e1"); err != nil {
		t.Fatalf("deleting a missing document: %v", err)
	}
	if list, err := d.ListDocs(c, "episode"); err != nil || len(list) != 0 {
		t.Fatalf("ListDocs after delete = %q, %v", list, err)
	}
	if b, ok, _ := d.GetDoc(c, "other", "e1"); !ok || string(b) != `{"other":true}` {
		t.Fatalf("another kind's document changed: %q %v", b, ok)
	}
}

// A document writer that lost its lease cannot write.
func testDocsFenced(t *testing.T, s store.Store) {
	l, d := locker(t, s), docs(t, s)
	c := ctx(t)
	const ttl = 200 * time.Millisecond
	first, err := l.Lock(c, "episode:e1", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.PutDocFenced(c, first, "episode", "e1", []byte(`"first"`), 0); err != nil {
		t.Fatalf("fenced write while held: %v", err)
	}
	second, err := l.Lock(c, "episode:e1", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.PutDocFenced(c, first, "episode", "e1", []byte(`"stale"`), 0); !faults.Is(err, faults.CodeLockLost) {
		t.Fatalf("stale holder's write: %v, want %s", err, faults.CodeLockLost)
	}
	if b, _, _ := d.GetDoc(c, "episode", "e1"); string(b) != `"first"` {
		t.Fatalf("stale holder's write was stored: %s", b)
	}
	if err := d.PutDocFenced(c, second, "episode", "e1", []byte(`"second"`), time.Minute); err != nil {
		t.Fatalf("new holder's write: %v", err)
	}
	if b, _, _ := d.GetDoc(c, "episode", "e1"); string(b) != `"second"` {
		t.Fatalf("new holder's write not stored: %s", b)
	}
	_ = second.Unlock(c)
}
