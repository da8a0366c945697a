package redis_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/memory"
	"github.com/orchard/orchard/store/redis"
	"github.com/orchard/orchard/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// prefixes gives every store of a test process its own key space on the
// shared server.
var prefixes atomic.Int64

func uniquePrefix() string { return fmt.Sprintf("orchardtest:%d:", prefixes.Add(1)) }

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// open returns a Store on url under prefix, closed when t ends.
func open(t testing.TB, url, prefix string) *redis.Store {
	t.Helper()
	s, err := redis.New(ctx(t), redis.Config{URL: url, Prefix: prefix, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestContract(t *testing.T) {
	srv := testenv.StartRedis(t)
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, srv.URL(), uniquePrefix()) })
}

// replicas returns two Stores sharing one key space, as two servers would.
func replicas(t *testing.T) (*testenv.RedisServer, *redis.Store, *redis.Store) {
	srv := testenv.StartRedis(t)
	p := uniquePrefix()
	return srv, open(t, srv.URL(), p), open(t, srv.URL(), p)
}

func TestReplicasShareRecords(t *testing.T) {
	_, a, b := replicas(t)
	c := ctx(t)
	if err := a.CreateSandbox(c, store.Sandbox{ID: "s1", Image: "host", CreatedAt: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSandbox(c, store.Sandbox{ID: "s1"}); !faults.Is(err, faults.CodeSandboxExists) {
		t.Fatalf("duplicate create on the other replica: %v", err)
	}
	got, err := b.GetSandbox(c, "s1")
	if err != nil || got.Image != "host" {
		t.Fatalf("replica b reads %+v, %v", got, err)
	}
	if _, err := b.UpdateSandbox(c, "s1", func(r *store.Sandbox) error { r.AgentAddr = "unix:/a"; return nil }); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.GetSandbox(c, "s1"); got.AgentAddr != "unix:/a" {
		t.Fatalf("replica a does not see b's update: %+v", got)
	}
	if err := b.CreateJob(c, api.Job{JobID: "j1", SandboxID: "s1", Status: api.JobQueued}); err != nil {
		t.Fatal(err)
	}
	if j, err := a.GetJob(c, "j1"); err != nil || j.SandboxID != "s1" {
		t.Fatalf("replica a reads job %+v, %v", j, err)
	}
	for _, s := range []*redis.Store{a, b} {
		if l, err := s.ListSandboxes(c); err != nil || len(l) != 1 {
			t.Fatalf("list: %v %v", l, err)
		}
	}
	if err := a.DeleteSandbox(c, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GetSandbox(c, "s1"); !faults.Is(err, faults.CodeSandboxNotFound) {
		t.Fatalf("deleted on a, still on b: %v", err)
	}
}

// Keys follow the documented layout and jobs expire only once terminal.
func TestLayoutAndJobExpiry(t *testing.T) {
	srv := testenv.StartRedis(t)
	s := open(t, srv.URL(), "orchard:")
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer raw.Close()
	c := ctx(t)
	if err := s.CreateSandbox(c, store.Sandbox{ID: "all"}); err != nil {
		t.Fatal(err)
	}
	if typ := raw.Type(c, "orchard:sandbox:all").Val(); typ != "string" {
		t.Fatalf("orchard:sandbox:all is a %q", typ)
	}
	if m := raw.SMembers(c, "orchard:sandboxes").Val(); len(m) != 1 || m[0] != "all" {
		t.Fatalf("orchard:sandboxes = %v", m)
	}
	if ttl := raw.TTL(c, "orchard:sandbox:all").Val(); ttl != -1 {
		t.Fatalf("sandbox record TTL %v, want none", ttl)
	}
	if err := s.CreateJob(c, api.Job{JobID: "j", Status: api.JobQueued}); err != nil {
		t.Fatal(err)
	}
	ttlOf := func() time.Duration { return raw.TTL(c, "orchard:job:j").Val() }
	if ttl := ttlOf(); ttl != -1 {
		t.Fatalf("queued job TTL %v, want none", ttl)
	}
	if _, err := s.UpdateJob(c, "j", func(j *api.Job) error { j.Status = api.JobRunning; return nil }); err != nil {
		t.Fatal(err)
	}
	if ttl := ttlOf(); ttl != -1 {
		t.Fatalf("running job TTL %v, want none", ttl)
	}
	if _, err := s.UpdateJob(c, "j", func(j *api.Job) error { j.Status = api.JobSucceeded; return nil }); err != nil {
		t.Fatal(err)
	}
	if ttl := ttlOf(); ttl < 23*time.Hour || ttl > 24*time.Hour {
		t.Fatalf("finished job TTL %v, want 24h", ttl)
	}
	// An expired job disappears from the list and from the index.
	raw.Del(c, "orchard:job:j")
	if jobs, err := s.ListJobs(c); err != nil || len(jobs) != 0 {
		t.Fatalf("list after expiry: %v %v", jobs, err)
	}
	if n := raw.SCard(c, "orchard:jobs").Val(); n != 0 {
		t.Fatalf("expired job left in the index (%d members)", n)
	}
}

func TestPublishWakesOtherReplica(t *testing.T) {
	_, a, b := replicas(t)
	c := ctx(t)
	ev, cancel, err := b.Subscribe(c, store.JobTopic("j"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	var worst time.Duration
	for range 20 {
		start := time.Now()
		if err := a.Publish(c, store.JobTopic("j")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ev:
			worst = max(worst, time.Since(start))
		case <-time.After(2 * time.Second):
			t.Fatal("publish on replica a did not reach replica b within 2s")
		}
	}
	t.Logf("cross-replica wake-up, worst of 20: %v", worst)

	// A Publish right after Subscribe returns is never missed, on a fresh
	// channel each time.
	for i := range 50 {
		topic := store.JobTopic(fmt.Sprint("fresh-", i))
		ev, cancel, err := b.Subscribe(c, topic)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Publish(c, topic); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ev:
		case <-time.After(2 * time.Second):
			t.Fatalf("publish %d right after Subscribe returned was missed", i)
		}
		cancel()
	}
}

// Many subscriptions share one connection: Redis sees one subscriber
// client per Store, not one per Subscribe.
func TestSubscriptionsShareOneConnection(t *testing.T) {
	srv, a, _ := replicas(t)
	c := ctx(t)
	for i := range 50 {
		_, cancel, err := a.Subscribe(c, store.JobTopic(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
	}
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer raw.Close()
	list, err := raw.ClientList(c).Result()
	if err != nil {
		t.Fatal(err)
	}
	subs := 0
	for _, line := range strings.Split(list, "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "sub=") && f != "sub=0" {
				subs++
			}
		}
	}
	if subs != 1 {
		t.Fatalf("%d subscriber connections for 50 subscriptions of one store (two stores open), want 1:\n%s", subs, list)
	}
}

func TestLockAcrossReplicas(t *testing.T) {
	_, a, b := replicas(t)
	c := ctx(t)
	if err := a.CreateSandbox(c, store.Sandbox{ID: "s"}); err != nil {
		t.Fatal(err)
	}
	const ttl = 300 * time.Millisecond
	la, err := a.Lock(c, "sandbox:s", ttl)
	if err != nil {
		t.Fatal(err)
	}
	// b waits for a's Unlock, woken over pub/sub well before the fallback
	// poll would have fired.
	got := make(chan store.Lease, 1)
	go func() {
		lb, err := b.Lock(c, "sandbox:s", time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- lb
	}()
	time.Sleep(100 * time.Millisecond)
	if err := la.Refresh(c); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := la.Unlock(c); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	if lb == nil {
		t.FailNow()
	}
	woke := time.Since(start)
	t.Logf("replica b acquired %v after replica a unlocked", woke)
	if woke > 250*time.Millisecond {
		t.Errorf("waiter on another replica took %v to notice the unlock", woke)
	}
	if _, err := b.UpdateSandboxFenced(c, lb, "s", func(r *store.Sandbox) error { r.Status = "b"; return nil }); err != nil {
		t.Fatal(err)
	}
	// a takes the lock back after b's lease expires unrefreshed; b's
	// fenced writes are refused from then on.
	if err := lb.Unlock(c); err != nil {
		t.Fatal(err)
	}
	lb, err = b.Lock(c, "sandbox:s", ttl)
	if err != nil {
		t.Fatal(err)
	}
	la, err = a.Lock(c, "sandbox:s", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if la.Token() <= lb.Token() {
		t.Fatalf("token %d after %d", la.Token(), lb.Token())
	}
	_, err = b.UpdateSandboxFenced(c, lb, "s", func(r *store.Sandbox) error { r.Status = "stale"; return nil })
	if !faults.Is(err, faults.CodeLockLost) {
		t.Fatalf("stale replica's fenced write: %v", err)
	}
	if got, _ := a.GetSandbox(c, "s"); got.Status != "b" {
		t.Fatalf("status %q", got.Status)
	}
	_ = la.Unlock(c)
}

// A lease's holder is one replica; another takes over when it stops
// renewing, and only one of two campaigners leads.
func TestLeaderAcrossReplicas(t *testing.T) {
	_, a, b := replicas(t)
	c := ctx(t)
	const ttl = 300 * time.Millisecond
	if ok, err := a.TryAcquire(c, "cleanup", "replica-a", ttl); err != nil || !ok {
		t.Fatalf("a: %v %v", ok, err)
	}
	if ok, err := b.TryAcquire(c, "cleanup", "replica-b", ttl); err != nil || ok {
		t.Fatalf("b while a leads: %v %v", ok, err)
	}
	start := time.Now()
	for {
		ok, err := b.TryAcquire(c, "cleanup", "replica-b", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("b took over %v after a stopped renewing (ttl %v)", took, ttl)
	if took < ttl/2 || took > ttl+time.Second {
		t.Fatalf("takeover after %v with ttl %v", took, ttl)
	}

	var leading, most atomic.Int32
	lead := func(ctx context.Context) {
		n := leading.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-ctx.Done()
		leading.Add(-1)
	}
	actx, stopA := context.WithCancel(c)
	bctx, stopB := context.WithCancel(c)
	doneA := make(chan error, 1)
	doneB := make(chan error, 1)
	go func() { doneA <- store.Campaign(actx, a, "reconcile", "replica-a", ttl, lead) }()
	go func() { doneB <- store.Campaign(bctx, b, "reconcile", "replica-b", ttl, lead) }()
	time.Sleep(5 * ttl)
	if leading.Load() != 1 {
		t.Fatalf("%d leaders", leading.Load())
	}
	stopA()
	<-doneA
	time.Sleep(2 * ttl)
	if leading.Load() != 1 {
		t.Fatalf("%d leaders after one campaigner stopped", leading.Load())
	}
	stopB()
	<-doneB
	if most.Load() != 1 {
		t.Fatalf("%d leaders at once", most.Load())
	}
}

// Redis goes away: calls fail fast and classified; it comes back: the same
// Stores carry on, subscriptions included.
func TestOutage(t *testing.T) {
	srv, a, b := replicas(t)
	c := ctx(t)
	if err := a.CreateSandbox(c, store.Sandbox{ID: "s"}); err != nil {
		t.Fatal(err)
	}
	ev, cancel, err := b.Subscribe(c, store.SandboxTopic("s"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()

	srv.Stop()
	drain(ev)
	for name, call := range map[string]func() error{
		"GetSandbox": func() error { _, err := a.GetSandbox(c, "s"); return err },
		"UpdateJob": func() error {
			_, err := a.UpdateJob(c, "j", func(*api.Job) error { return nil })
			return err
		},
		"ListSandboxes": func() error { _, err := a.ListSandboxes(c); return err },
		"Publish":       func() error { return a.Publish(c, "x") },
		"Subscribe": func() error {
			_, cancel, err := b.Subscribe(c, "y")
			if err == nil {
				cancel()
			}
			return err
		},
		"Lock": func() error { _, err := a.Lock(c, "l", time.Second); return err },
	} {
		start := time.Now()
		err := call()
		took := time.Since(start)
		f := faults.Of(err)
		if f == nil || f.Code != faults.CodeStoreUnavailable || f.Category != faults.Unavailable ||
			f.Source != faults.Platform || !f.Retryable || f.StatusOf() != 503 {
			t.Errorf("%s with Redis down: %v (%+v)", name, err, f)
		}
		if took > 2*time.Second {
			t.Errorf("%s took %v to fail", name, took)
		}
		t.Logf("%s failed after %v: %v", name, took, err)
	}

	srv.Start() // same port, no data: the server keeps none
	start := time.Now()
	for {
		_, err := a.GetSandbox(c, "s")
		if faults.Is(err, faults.CodeSandboxNotFound) {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("store not back 10s after Redis: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("calls succeed again %v after Redis restarted", time.Since(start))

	// The subscriber of b re-subscribed and woke its waiter, who may have
	// missed events while Redis was down.
	select {
	case <-ev:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up after the subscriber reconnected")
	}
	if err := a.CreateSandbox(c, store.Sandbox{ID: "s"}); err != nil {
		t.Fatal(err)
	}
	drain(ev)
	if err := a.Publish(c, store.SandboxTopic("s")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ev:
	case <-time.After(2 * time.Second):
		t.Fatal("publish after the outage not delivered to an old subscription")
	}
	ev2, cancel2, err := b.Subscribe(c, store.SandboxTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel2()
	if err := a.Publish(c, store.SandboxTopic("t")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ev2:
	case <-time.After(2 * time.Second):
		t.Fatal("publish after the outage not delivered to a new subscription")
	}
	l, err := b.Lock(c, "l", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(c)
}

// A Redis that hangs (accepts nothing, answers nothing, resets nothing)
// makes calls fail within their I/O timeouts, and the event subscriber
// notices the silence, replaces its connection and wakes its waiters once
// Redis answers again.
func TestHungRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the subscriber's health checks")
	}
	srv, a, b := replicas(t)
	c := ctx(t)
	ev, cancel, err := b.Subscribe(c, store.JobTopic("j"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	start := time.Now()
	_, err = a.GetSandbox(c, "s")
	took := time.Since(start)
	t.Logf("GetSandbox on a hung Redis failed after %v: %v", took, err)
	if f := faults.Of(err); f == nil || f.Code != faults.CodeStoreUnavailable || !f.Retryable {
		t.Fatalf("GetSandbox on a hung Redis: %v", err)
	}
	if took > 3*time.Second {
		t.Errorf("GetSandbox on a hung Redis took %v", took)
	}
	// Long enough for the subscriber to ping, give up and replace its
	// connection at least once.
	time.Sleep(8 * time.Second)
	drain(ev)
	srv.Resume()
	resumed = true
	select {
	case <-ev:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up after Redis answered again")
	}
	if err := a.Publish(c, store.JobTopic("j")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ev:
	case <-time.After(2 * time.Second):
		t.Fatal("publish not delivered after the hang")
	}
}

func TestConfig(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := ctx(t)
	if _, err := redis.New(c, redis.Config{URL: "http://x"}); !faults.Is(err, faults.CodeMisconfigured) {
		t.Fatalf("bad scheme: %v", err)
	}
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer raw.Close()
	if err := raw.ConfigSet(c, "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := redis.New(c, redis.Config{URL: srv.URL()}); !faults.Is(err, faults.CodeStoreUnavailable) {
		t.Fatalf("no password: %v", err)
	}
	s := open(t, "redis://:s3cret@"+srv.Addr()+"/2", "")
	if err := s.CreateSandbox(c, store.Sandbox{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	authed := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Password: "s3cret", DB: 2})
	defer authed.Close()
	if n := authed.Exists(c, redis.DefaultPrefix+"sandbox:p").Val(); n != 1 {
		t.Fatal("record not under the default prefix in db 2")
	}
	start := time.Now()
	if _, err := redis.New(c, redis.Config{URL: "redis://127.0.0.1:1"}); !faults.Is(err, faults.CodeStoreUnavailable) {
		t.Fatalf("nothing listening: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("New took %v to give up on a closed port", d)
	}
}

// testWriter sends a store's log to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func BenchmarkGetSandbox(b *testing.B) {
	for name, s := range benchStores(b) {
		b.Run(name, func(b *testing.B) {
			c := ctx(b)
			rec := store.Sandbox{ID: "bench", Image: "host", Status: api.StatusReady, Ready: true,
				AgentAddr: "unix:/run/orchard/bench/agent.sock", Labels: map[string]string{"team": "rl"}}
			// The framework may run this function more than once per store.
			if err := s.CreateSandbox(c, rec); err != nil && !faults.Is(err, faults.CodeSandboxExists) {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.GetSandbox(c, "bench"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkUpdateJob(b *testing.B) {
	for name, s := range benchStores(b) {
		b.Run(name, func(b *testing.B) {
			c := ctx(b)
			if err := s.CreateJob(c, api.Job{JobID: "bench", Command: "echo hi", Status: api.JobRunning}); err != nil {
				b.Fatal(err)
			}
			out := "line of output\n"
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.UpdateJob(c, "bench", func(j *api.Job) error { j.Stdout = out; return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchStores(b *testing.B) map[string]store.Store {
	srv := testenv.StartRedis(b)
	return map[string]store.Store{"memory": memory.New(), "redis": open(b, srv.URL(), uniquePrefix())}
}
