package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/memory"
)

// TestHold checks that a held lease outlives its ttl through the refreshes,
// that release frees it at once and stops the refreshes, and that a lease
// lost while held is reported.
func TestHold(t *testing.T) {
	t.Parallel()
	// Long enough that a loaded machine (-race, many packages at once)
	// does not stall a refresh past it.
	const ttl = 400 * time.Millisecond
	tests := []struct {
		name string
		hold time.Duration // how long the lock is held
		lose bool          // let the lease expire by stalling the store's view
	}{
		{name: "released before the first refresh", hold: 0},
		{name: "kept past its ttl by refreshes", hold: 4 * ttl},
		{name: "lost lease is reported", hold: 2 * ttl, lose: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := memory.New()
			ctx := context.Background()
			lostc := make(chan error, 1)
			lease, release, err := store.Hold(ctx, st, "l", ttl, func(err error) { lostc <- err })
			if err != nil {
				t.Fatal(err)
			}
			if tt.lose {
				// Another holder's Unlock path is not reachable from
				// here; unlocking the lease behind Hold's back is.
				if err := lease.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(tt.hold)
			if tt.lose {
				select {
				case err := <-lostc:
					if !faults.Is(err, faults.CodeLockLost) {
						t.Errorf("lost with %v", err)
					}
				default:
					t.Error("lost lease not reported")
				}
				release()
				return
			}
			if err := lease.Valid(ctx); err != nil {
				t.Fatalf("lease after %v: %v", tt.hold, err)
			}
			release()
			// Free at once, not after the ttl.
			tctx, cancel := context.WithTimeout(ctx, ttl/4)
			defer cancel()
			l2, err := st.Lock(tctx, "l", ttl)
			if err != nil {
				t.Fatalf("lock after release: %v", err)
			}
			// No refresh of the released lease may disturb the next
			// holder (which is not refreshed: it lives one ttl).
			time.Sleep(ttl / 2)
			if err := l2.Valid(ctx); err != nil {
				t.Errorf("second holder lost its lease: %v", err)
			}
			select {
			case err := <-lostc:
				t.Errorf("lost reported for a released lease: %v", err)
			default:
			}
		})
	}
}
