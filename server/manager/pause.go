package manager

import (
	"context"
	"sync"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/store"
)

// Pause stops every process of a ready sandbox in place (the runtime's
// freezer); its memory stays and it reports status "paused". Exec, files
// and actions on it answer 409 sandbox.paused until Resume. Pausing a
// paused sandbox returns it as it is.
func (m *Manager) Pause(ctx context.Context, id string) (store.Sandbox, error) {
	return m.setPaused(ctx, id, true)
}

// Resume lets a paused sandbox's processes go on where they stopped.
// Resuming a ready sandbox returns it as it is.
func (m *Manager) Resume(ctx context.Context, id string) (store.Sandbox, error) {
	return m.setPaused(ctx, id, false)
}

func (m *Manager) setPaused(ctx context.Context, id string, pause bool) (store.Sandbox, error) {
	p, ok := m.rt.(runtime.Pauser)
	if !ok {
		return store.Sandbox{}, faults.New(faults.CodeKindUnsupported, faults.NotImplemented, faults.Client,
			"this server's runtime cannot pause sandboxes")
	}
	unlock, err := m.pauseLock(ctx, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer unlock()
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return rec, err
	}
	from, to := api.StatusReady, api.StatusPaused
	if !pause {
		from, to = to, from
	}
	switch rec.Status {
	case to:
		return rec, nil
	case from:
	default:
		return rec, faults.Newf(faults.CodeSandboxNotReady, faults.Conflict, faults.Client,
			"Sandbox %s is %s: only a ready sandbox can be paused, and only a paused one resumed", id, rec.Status)
	}
	rid := rec.RuntimeName()
	if pause {
		err = p.Pause(ctx, rid)
	} else {
		err = p.Resume(ctx, rid)
	}
	if err != nil {
		return rec, err
	}
	now := m.unix()
	rec, err = m.st.UpdateSandbox(ctx, id, func(r *store.Sandbox) error {
		if r.Status != from && r.Status != to {
			return faults.Newf(faults.CodeSandboxNotReady, faults.Conflict, faults.Client, "Sandbox %s is %s", id, r.Status)
		}
		r.Status = to
		if !pause && r.LastHeartbeat != nil {
			// The heartbeat rule does not run while paused (see Sweep):
			// the client's silence then was expected.
			r.LastHeartbeat = &now
		}
		return nil
	})
	if err != nil {
		// The record went (deleted) or failed meanwhile: leave the sandbox
		// as its record says, running, so a delete's teardown is not held.
		if pause {
			_ = p.Resume(context.WithoutCancel(ctx), rid)
		}
		return rec, err
	}
	m.log.Info("sandbox "+to, "sandbox_id", id)
	_ = m.st.Publish(ctx, store.SandboxTopic(id))
	return rec, nil
}

// pauseTTL bounds how long a replica that died mid-pause holds the lease.
const pauseTTL = 30 * time.Second

// pauseLock serialises pauses and resumes of one sandbox, across replicas
// when the store has locks, so that the record and the runtime agree.
func (m *Manager) pauseLock(ctx context.Context, id string) (func(), error) {
	mu := m.pauses.get(id)
	mu.Lock()
	locker, ok := m.st.(store.Locker)
	if !ok {
		return func() { m.pauses.put(id, mu) }, nil
	}
	_, release, err := store.Hold(ctx, locker, "pause:"+id, pauseTTL, nil)
	if err != nil {
		m.pauses.put(id, mu)
		return nil, err
	}
	return func() { release(); m.pauses.put(id, mu) }, nil
}

// keyedMutex hands out one mutex per key while anyone holds or waits for
// it, and forgets it after.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*refMutex
}

type refMutex struct {
	sync.Mutex
	refs int
}

// get returns the key's mutex, not yet locked, counting the caller in.
func (k *keyedMutex) get(key string) *refMutex {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]*refMutex{}
	}
	r, ok := k.m[key]
	if !ok {
		r = &refMutex{}
		k.m[key] = r
	}
	r.refs++
	return r
}

// put unlocks the key's mutex and counts the caller out.
func (k *keyedMutex) put(key string, r *refMutex) {
	r.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if r.refs--; r.refs == 0 {
		delete(k.m, key)
	}
}

// pausedFault refuses work on a paused sandbox: its agent is frozen with
// the rest and would not answer.
func pausedFault(rec store.Sandbox) error {
	if rec.Status == api.StatusPaused {
		return faults.Newf(faults.CodeSandboxPaused, faults.Conflict, faults.Client,
			"Sandbox %s is paused; resume it first (POST /sandboxes/%s/resume)", rec.ID, rec.ID)
	}
	return nil
}
