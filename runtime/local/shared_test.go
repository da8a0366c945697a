package local

import (
	"context"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
)

// Two runtimes on one state directory (replicas on one host): one that
// looks at a sandbox while the other is still creating it must not take
// the half-made sandbox for a broken one for good.
func TestSharedStateSeesSandboxCreatedElsewhere(t *testing.T) {
	a := newLocal(t)
	b := newLocal(t, func(c *Config) { c.StateDir = a.cfg.StateDir })
	const id = "shared1"
	created := make(chan error, 1)
	go func() {
		_, err := b.Create(ctxTimeout(t, 2*time.Minute), runtime.Spec{ID: id, MemoryBytes: 256 << 20, CPU: 1})
		created <- err
	}()
	defer func() { _ = b.Delete(context.Background(), id) }()
	// a looks (a sweep's List, a GET's Inspect) while b creates.
	seen := ""
	var err error
wait:
	for {
		select {
		case err = <-created:
			break wait
		default:
		}
		if inst, ierr := a.Inspect(context.Background(), id); ierr == nil && seen == "" {
			seen = inst.Reason
		} else if ierr != nil && !faults.Is(ierr, faults.CodeSandboxNotFound) {
			t.Fatal(ierr)
		}
		time.Sleep(100 * time.Microsecond)
	}
	if err != nil {
		t.Fatalf("create on b: %v", err)
	}
	t.Logf("a first saw the sandbox as %q", seen)
	deadline := time.Now().Add(3 * time.Second)
	for {
		inst, ierr := a.Inspect(context.Background(), id)
		if ierr == nil && inst.Alive {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox alive on b, but a reports alive=%v reason=%q err=%v", inst.Alive, inst.Reason, ierr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
