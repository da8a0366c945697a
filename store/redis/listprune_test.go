package redis_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/store"
)

// A record that is deleted and created again (same id) while another
// replica lists must stay in the index: a record missing from the index is
// never listed again, so cleanup never removes its sandbox.
func TestListDoesNotUnindexRecreatedRecord(t *testing.T) {
	_, a, b := replicas(t)
	c := ctx(t)
	const id = "again"
	deadline := time.Now().Add(5 * time.Second)
	for round := 0; time.Now().Before(deadline); round++ {
		if err := b.CreateSandbox(c, store.Sandbox{ID: id}); err != nil {
			t.Fatal(err)
		}
		var stop atomic.Bool
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // b: delete and re-create the id, as a client reusing it would
			defer wg.Done()
			for !stop.Load() {
				_ = b.DeleteSandbox(c, id)
				_ = b.CreateSandbox(c, store.Sandbox{ID: id})
			}
		}()
		for range 100 {
			if _, err := a.ListSandboxes(c); err != nil {
				t.Fatal(err)
			}
		}
		stop.Store(true)
		wg.Wait() // the loop ends on a create: the record exists
		recs, err := a.ListSandboxes(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.GetSandbox(c, id); err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1 {
			t.Fatalf("round %d: record %s exists but ListSandboxes lists %d records: a list pruned it from the index", round, id, len(recs))
		}
		_ = b.DeleteSandbox(c, id)
	}
}
