// Package runtimetest is the conformance suite every runtime.Runtime
// implementation runs: create, inspect, reach the agent, list, delete,
// idempotency, concurrent creates and classified failures that leak nothing.
package runtimetest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
)

// Options tunes the suite for one backend.
type Options struct {
	// Image for the sandboxes the suite creates; "" leaves the backend's default.
	Image string
	// BadImage must fail to create with a classified image error. Default:
	// a reference that does not parse.
	BadImage string
	// Concurrency is the number of sandboxes created at once. Default 10.
	Concurrency int
	// CreateTimeout bounds one Create. Default 2 minutes: concurrent creates
	// on a loaded two-core machine take seconds each.
	CreateTimeout time.Duration
	// Spec, when set, adjusts each spec before Create (limits, env, labels).
	Spec func(*runtime.Spec)
	// CheckGone, when set, asserts that nothing of sandbox id is left on the
	// backend (processes, mounts, cgroups, state) after Delete or after a
	// failed Create.
	CheckGone func(t *testing.T, id string)
}

func (o *Options) defaults() {
	if o.BadImage == "" {
		o.BadImage = "Not A Valid::Reference"
	}
	if o.Concurrency == 0 {
		o.Concurrency = 10
	}
	if o.CreateTimeout == 0 {
		o.CreateTimeout = 2 * time.Minute
	}
}

// Run runs the conformance suite against runtimes made by newRuntime (called
// once per subtest).
func Run(t *testing.T, newRuntime func(t *testing.T) runtime.Runtime, opts Options) {
	opts.defaults()
	s := &suite{opts: opts}
	t.Run("Lifecycle", func(t *testing.T) { s.lifecycle(t, newRuntime(t)) })
	t.Run("ConcurrentCreate", func(t *testing.T) { s.concurrent(t, newRuntime(t)) })
	t.Run("BadImage", func(t *testing.T) { s.badImage(t, newRuntime(t)) })
	t.Run("UnknownID", func(t *testing.T) { s.unknown(t, newRuntime(t)) })
}

type suite struct{ opts Options }

func (s *suite) spec(id string) runtime.Spec {
	sp := runtime.Spec{ID: id, Image: s.opts.Image, Labels: map[string]string{"suite": "runtimetest"}}
	if s.opts.Spec != nil {
		s.opts.Spec(&sp)
	}
	return sp
}

func (s *suite) create(t *testing.T, rt runtime.Runtime, id string) runtime.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.CreateTimeout)
	defer cancel()
	inst, err := rt.Create(ctx, s.spec(id))
	if err != nil {
		t.Fatalf("Create(%s): %v", id, err)
	}
	t.Cleanup(func() { _ = rt.Delete(context.Background(), id) })
	return inst
}

func (s *suite) lifecycle(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	id := uniqueID("life")
	inst := s.create(t, rt, id)
	if inst.ID != id || !inst.Alive || inst.AgentAddr == "" {
		t.Fatalf("Create returned %+v; want ID %s, Alive, an agent address", inst, id)
	}

	got, err := rt.Inspect(ctx, id)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if !got.Alive || got.AgentAddr != inst.AgentAddr {
		t.Fatalf("Inspect = %+v; want alive at %s", got, inst.AgentAddr)
	}
	if _, err := Health(ctx, inst.AgentAddr); err != nil {
		t.Fatalf("agent health: %v", err)
	}

	list, err := rt.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if !containsID(list, id) {
		t.Fatalf("List = %v; want it to contain %s", ids(list), id)
	}

	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("second Delete = %v; want nil", err)
	}
	s.checkGone(t, rt, id, "after Delete")
}

// checkGone asserts the runtime no longer knows id (Inspect, List) and
// runs the backend's own leak check.
func (s *suite) checkGone(t *testing.T, rt runtime.Runtime, id, when string) {
	t.Helper()
	ctx := context.Background()
	if _, err := rt.Inspect(ctx, id); !faults.Is(err, faults.CodeSandboxNotFound) {
		t.Fatalf("Inspect %s = %v; want %s", when, err, faults.CodeSandboxNotFound)
	}
	list, err := rt.List(ctx)
	if err != nil {
		t.Fatalf("List %s: %v", when, err)
	}
	if containsID(list, id) {
		t.Fatalf("List %s still contains %s", when, id)
	}
	if s.opts.CheckGone != nil {
		s.opts.CheckGone(t, id)
	}
}

func (s *suite) concurrent(t *testing.T, rt runtime.Runtime) {
	n := s.opts.Concurrency
	insts := make([]runtime.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	prefix := uniqueID("conc")
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("%s-%d", prefix, i)
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.CreateTimeout)
			defer cancel()
			insts[i], errs[i] = rt.Create(ctx, s.spec(id))
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for i := range n {
			_ = rt.Delete(context.Background(), fmt.Sprintf("%s-%d", prefix, i))
		}
	})
	addrs := map[string]string{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("Create #%d: %v", i, err)
			continue
		}
		if prev, dup := addrs[insts[i].AgentAddr]; dup {
			t.Errorf("%s and %s share agent address %s", prev, insts[i].ID, insts[i].AgentAddr)
		}
		addrs[insts[i].AgentAddr] = insts[i].ID
		if _, err := Health(context.Background(), insts[i].AgentAddr); err != nil {
			t.Errorf("health of %s: %v", insts[i].ID, err)
		}
	}
	if t.Failed() {
		return
	}

	var dw sync.WaitGroup
	for i := range n {
		dw.Add(1)
		go func() {
			defer dw.Done()
			if err := rt.Delete(context.Background(), insts[i].ID); err != nil {
				t.Errorf("Delete %s: %v", insts[i].ID, err)
			}
		}()
	}
	dw.Wait()
	if s.opts.CheckGone != nil {
		for i := range n {
			s.opts.CheckGone(t, insts[i].ID)
		}
	}
}

func (s *suite) badImage(t *testing.T, rt runtime.Runtime) {
	id := uniqueID("bad")
	sp := s.spec(id)
	sp.Image = s.opts.BadImage
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.CreateTimeout)
	defer cancel()
	_, err := rt.Create(ctx, sp)
	if err == nil {
		_ = rt.Delete(context.Background(), id)
		t.Fatalf("Create with image %q succeeded; want an error", sp.Image)
	}
	e := faults.Of(err)
	if !strings.HasPrefix(e.Code, "image.") || e.Category == faults.Internal {
		t.Fatalf("Create with image %q: %v (code %s, category %s); want a classified image error", sp.Image, err, e.Code, e.Category)
	}
	s.checkGone(t, rt, id, "after a failed Create")
}

func (s *suite) unknown(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	id := uniqueID("nobody")
	if _, err := rt.Inspect(ctx, id); !faults.Is(err, faults.CodeSandboxNotFound) {
		t.Errorf("Inspect(unknown) = %v; want %s", err, faults.CodeSandboxNotFound)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Errorf("Delete(unknown) = %v; want nil", err)
	}
}

// Health does GET /health on an agent address ("unix:/path" or "http://host:port").
func Health(ctx context.Context, addr string) (api.AgentHealth, error) {
	var h api.AgentHealth
	client, base, err := clientFor(addr)
	if err != nil {
		return h, err
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return h, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return h, fmt.Errorf("GET /health: status %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return h, fmt.Errorf("GET /health: decode: %w", err)
	}
	if h.Status != "ok" {
		return h, fmt.Errorf("GET /health: status %q", h.Status)
	}
	return h, nil
}

func clientFor(addr string) (*http.Client, string, error) {
	switch {
	case strings.HasPrefix(addr, "unix:"):
		path := strings.TrimPrefix(addr, "unix:")
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}
		return &http.Client{Transport: tr}, "http://agent", nil
	case strings.HasPrefix(addr, "http://"), strings.HasPrefix(addr, "https://"):
		return &http.Client{Transport: &http.Transport{}}, strings.TrimSuffix(addr, "/"), nil
	}
	return nil, "", fmt.Errorf("unsupported agent address %q", addr)
}

func containsID(list []runtime.Instance, id string) bool {
	for _, in := range list {
		if in.ID == id {
			return true
		}
	}
	return false
}

func ids(list []runtime.Instance) []string {
	out := make([]string, len(list))
	for i, in := range list {
		out[i] = in.ID
	}
	return out
}

var idSeq struct {
	sync.Mutex
	n int
}

// uniqueID returns a short id, unique within the process and across
// processes that share a backend.
func uniqueID(prefix string) string {
	idSeq.Lock()
	idSeq.n++
	n := idSeq.n
	idSeq.Unlock()
	return fmt.Sprintf("rt%s%x-%d", prefix, time.Now().UnixNano()&0xffffff, n)
}
