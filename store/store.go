// Package store defines the state Orchard keeps about sandboxes and jobs,
// and the interface its backends (memory, Redis) implement. storetest is
// the contract suite both run.
package store

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// Sandbox is the stored record of one sandbox (ORCHARD_COMPAT §5 plus our
// fields). Times are Unix seconds, as on the wire.
type Sandbox struct {
	ID              string            `json:"sandbox_id"`
	Namespace       string            `json:"namespace"`
	Kind            string            `json:"kind"`
	Image           string            `json:"image"`
	BlockNetwork    bool              `json:"block_network"`
	CPU             string            `json:"cpu"`
	Memory          string            `json:"memory"`
	CreatedAt       float64           `json:"created_at"`
	Ready           bool              `json:"ready"` // latched once true
	Status          string            `json:"status"`
	StatusMessage   string            `json:"status_message"`
	CreationTimeout int               `json:"creation_timeout"`
	LastHeartbeat   *float64          `json:"last_heartbeat"`
	TTLSeconds      int               `json:"ttl_seconds,omitempty"` // 0 = server default
	Labels          map[string]string `json:"labels,omitempty"`
	Env             map[string]string `json:"env,omitempty"`
	AgentAddr       string            `json:"agent_addr,omitempty"`
	// Fault classifies a failed sandbox.
	Fault *api.FaultInfo `json:"fault,omitempty"`
	// EphemeralStorage is the limit on what the sandbox writes, a quantity.
	EphemeralStorage string `json:"ephemeral_storage,omitempty"`
	// Snapshot is the snapshot the sandbox started from; ForkOf the
	// sandbox it was forked from.
	Snapshot string `json:"snapshot,omitempty"`
	ForkOf   string `json:"fork_of,omitempty"`
	// RuntimeID is the runtime's name of the sandbox when it differs from
	// ID (a warm-pool sandbox claimed under an id its client chose: the
	// runtime's id names its directory, socket and container and cannot
	// change); empty: ID. Every runtime call goes through RuntimeName.
	RuntimeID string `json:"runtime_id,omitempty"`
	// Pool names the warm pool that made the sandbox, if one did.
	Pool string `json:"pool,omitempty"`
	// PoolState is PoolMember while the sandbox waits in its pool
	// unclaimed (not the user's: not listed, no heartbeat cleanup),
	// PoolMoving while a claim moves it to another id, "" once claimed.
	PoolState string `json:"pool_state,omitempty"`
}

// Pool states (Sandbox.PoolState).
const (
	PoolMember = "member"
	PoolMoving = "moving"
)

// RuntimeName is the id the runtime knows the sandbox by.
func (s Sandbox) RuntimeName() string {
	if s.RuntimeID != "" {
		return s.RuntimeID
	}
	return s.ID
}

// Clone returns a deep copy.
func (s Sandbox) Clone() Sandbox {
	s.Labels = maps.Clone(s.Labels)
	s.Env = maps.Clone(s.Env)
	if s.LastHeartbeat != nil {
		v := *s.LastHeartbeat
		s.LastHeartbeat = &v
	}
	if s.Fault != nil {
		f := *s.Fault
		s.Fault = &f
	}
	return s
}

// CloneJob returns a deep copy of a job.
func CloneJob(j api.Job) api.Job {
	cp := func(p *float64) *float64 {
		if p == nil {
			return nil
		}
		v := *p
		return &v
	}
	j.StartedAt, j.CompletedAt = cp(j.StartedAt), cp(j.CompletedAt)
	if j.ExitCode != nil {
		v := *j.ExitCode
		j.ExitCode = &v
	}
	if j.Error != nil {
		v := *j.Error
		j.Error = &v
	}
	if j.Fault != nil {
		f := *j.Fault
		j.Fault = &f
	}
	return j
}

// Store is the shared state. Every method may block on a network backend, so
// each takes a context; an unreachable backend is platform.store_unavailable.
type Store interface {
	// CreateSandbox stores a new record; conflict (sandbox.exists) if the id is taken.
	CreateSandbox(ctx context.Context, s Sandbox) error
	// GetSandbox returns the record or a not_found fault.
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// UpdateSandbox applies fn to the current record atomically and stores
	// the result; not_found if there is no record. fn may return an error to abort.
	UpdateSandbox(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error)
	// DeleteSandbox removes the record; deleting a missing record is not an error.
	DeleteSandbox(ctx context.Context, id string) error
	ListSandboxes(ctx context.Context) ([]Sandbox, error)

	// CreateJob stores a new job.
	CreateJob(ctx context.Context, j api.Job) error
	GetJob(ctx context.Context, id string) (api.Job, error)
	UpdateJob(ctx context.Context, id string, fn func(*api.Job) error) (api.Job, error)
	DeleteJob(ctx context.Context, id string) error
	ListJobs(ctx context.Context) ([]api.Job, error)

	// Subscribe delivers a value on the returned channel each time topic is
	// published (coalesced: a slow reader sees at least one value after the
	// latest publish). cancel releases the subscription.
	Subscribe(ctx context.Context, topic string) (events <-chan struct{}, cancel func(), err error)
	Publish(ctx context.Context, topic string) error
}

// Topics.

// SandboxTopic is published when a sandbox's record changes state.
func SandboxTopic(id string) string { return "sandbox:" + id }

// JobTopic is published when a job changes state.
func JobTopic(id string) string { return "job:" + id }

// ReplicaTopic is published to ask a server replica to look at the jobs it
// runs (a cancel was requested for one of them).
func ReplicaTopic(id string) string { return "replica:" + id }

// DeletesTopic is published when a sandbox is marked deleting, for the
// replica that reaches its container to finish the delete.
const DeletesTopic = "deletes"

// ErrSandboxNotFound builds the Orchard not-found error for id.
func ErrSandboxNotFound(id string) *faults.Error {
	return faults.Newf(faults.CodeSandboxNotFound, faults.NotFound, faults.Client, "Sandbox %s not found", id)
}

// ErrJobNotFound builds the Orchard not-found error for a job id.
func ErrJobNotFound(id string) *faults.Error {
	return faults.Newf(faults.CodeJobNotFound, faults.NotFound, faults.Client, "Job %s not found", id)
}

// ErrSandboxExists builds the conflict error for a duplicate id.
func ErrSandboxExists(id string) *faults.Error {
	return faults.Newf(faults.CodeSandboxExists, faults.Conflict, faults.Client, "Sandbox %s already exists", id)
}

// ErrLockLost builds the error for a write or refresh by a holder that no
// longer holds the lock called name.
func ErrLockLost(name string) *faults.Error {
	return faults.Newf(faults.CodeLockLost, faults.Conflict, faults.Platform, "lock %s is no longer held", name)
}

// Coordination across replicas. A store that several server processes share
// implements these optional abilities, found by type assertion; the memory
// store implements them in-process, so code written against them works with
// one replica too.

// Locker hands out exclusive locks that expire unless refreshed, so a holder
// that dies cannot block others for longer than ttl.
type Locker interface {
	// Lock blocks until the caller holds the lock called name, ctx ends (its
	// cause is returned) or the store fails. It is woken by the release of
	// the lock, not by polling; the expiry of an abandoned lock is noticed
	// within a bounded delay.
	Lock(ctx context.Context, name string, ttl time.Duration) (Lease, error)
}

// Lease is a held lock. Once it has expired or been taken by another holder,
// every method returns a lock_lost fault (ErrLockLost).
type Lease interface {
	// Token is the fencing token: greater than the token of every earlier
	// holder of the same name, so a resource that remembers the highest
	// token it has seen can refuse a stale holder.
	Token() int64
	// Valid returns nil while the lease is held.
	Valid(ctx context.Context) error
	// Refresh extends the lease to ttl (the one given to Lock) from now.
	Refresh(ctx context.Context) error
	// Unlock releases the lock and wakes its waiters; one of them gets it.
	Unlock(ctx context.Context) error
}

// Fenced is a store whose writes can be conditioned on a Lease from the same
// store: the update is applied only if the lease is still held when it is
// stored, atomically with the check. A holder that lost its lock (expired
// while it was paused or partitioned, then taken by another) gets lock_lost
// and changes nothing.
type Fenced interface {
	UpdateSandboxFenced(ctx context.Context, l Lease, id string, fn func(*Sandbox) error) (Sandbox, error)
	UpdateJobFenced(ctx context.Context, l Lease, id string, fn func(*api.Job) error) (api.Job, error)
}

// Docs keeps JSON documents that other packages own — episodes — by kind
// and id, each expiring ttl after its last write (0: never). Writes replace
// the whole document; a writer that must not race others holds a Lease on
// the document's name and writes with PutDocFenced.
type Docs interface {
	PutDoc(ctx context.Context, kind, id string, doc []byte, ttl time.Duration) error
	// PutDocFenced is PutDoc applied only if l is still held, atomically
	// with the check; lock_lost otherwise.
	PutDocFenced(ctx context.Context, l Lease, kind, id string, doc []byte, ttl time.Duration) error
	// GetDoc returns the document, or ok false if there is none (or it expired).
	GetDoc(ctx context.Context, kind, id string) (doc []byte, ok bool, err error)
	DeleteDoc(ctx context.Context, kind, id string) error
	// ListDocs returns every live document of kind by id.
	ListDocs(ctx context.Context, kind string) (map[string][]byte, error)
}

// Elector keeps named leases held by one holder at a time, for leader
// election: one cleanup/reconcile loop among all replicas. Campaign runs the
// usual loop over it.
type Elector interface {
	// TryAcquire makes holder the holder of name for ttl if name is free,
	// expired, or already holder's (a renewal), and reports whether holder
	// now holds it. It never blocks on another holder.
	TryAcquire(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// Release gives name up if holder holds it; otherwise it does nothing.
	Release(ctx context.Context, name, holder string) error
}

// Campaign runs lead while holder holds the lease name, until ctx ends. It
// tries to acquire the lease every ttl/3; once acquired it renews it at the
// same rate and runs lead with a context that is canceled as soon as a
// renewal fails or cannot be confirmed before two thirds of ttl have passed
// since the last successful one — before the lease can expire and another
// replica take over. When lead's context is canceled Campaign waits for lead
// to return, then campaigns again. When lead returns by itself the lease is
// released and Campaign returns nil; when ctx ends it releases the lease and
// returns ctx's cause.
func Campaign(ctx context.Context, e Elector, name, holder string, ttl time.Duration, lead func(ctx context.Context)) error {
	every := max(ttl/3, time.Millisecond)
	release := func() {
		// The caller's ctx may be done already: release with a budget of its own.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), every)
		defer cancel()
		_ = e.Release(rctx, name, holder)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		// The lease runs from when the store applies the call, which is
		// after it starts: measuring from the start errs on the safe side.
		start := time.Now()
		ok, err := e.TryAcquire(ctx, name, holder, ttl)
		if ctx.Err() != nil {
			if ok {
				release()
			}
			return context.Cause(ctx)
		}
		if err == nil && ok {
			if done := leadWhileHeld(ctx, e, name, holder, ttl, start, t, lead); done {
				release()
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				return nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// leadWhileHeld runs lead until the lease is lost (false) or lead returns or
// ctx ends (true).
func leadWhileHeld(ctx context.Context, e Elector, name, holder string, ttl time.Duration, last time.Time,
	t *time.Ticker, lead func(context.Context)) bool {
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lead(lctx)
	}()
	for {
		select {
		case <-done:
			return true
		case <-ctx.Done():
			<-done
			return true
		case <-t.C:
			start := time.Now()
			rctx, rcancel := context.WithDeadline(ctx, last.Add(ttl*2/3))
			ok, err := e.TryAcquire(rctx, name, holder, ttl)
			rcancel()
			if err == nil && ok {
				last = start
				continue
			}
			if ctx.Err() != nil {
				<-done
				return true
			}
			cancel(ErrLockLost(name))
			<-done
			return false
		}
	}
}

// Hold takes the lock called name from l and keeps it: a timer refreshes
// the lease every ttl/3 until release is called, so ttl only bounds how long
// a holder that died blocks the next one. When the lease is lost while held
// (expired during a stall, then taken by another holder), lost is called
// with the cause; a store outage is retried while the lease may still hold.
// release stops the refreshes and unlocks. A timer rather than a goroutine
// with a ticker: most holds (a short exec) end before the first refresh, and
// then cost neither a goroutine nor the hand-off of stopping it.
func Hold(ctx context.Context, l Locker, name string, ttl time.Duration, lost func(error)) (Lease, func(), error) {
	lease, err := l.Lock(ctx, name, ttl)
	if err != nil {
		return nil, nil, err
	}
	var (
		mu         sync.Mutex // guards t and stopped
		t          *time.Timer
		stopped    bool
		refreshing sync.WaitGroup // a refresh in progress, which release waits for
	)
	var refresh func()
	refresh = func() {
		defer refreshing.Done()
		err := lease.Refresh(context.Background())
		if faults.Is(err, faults.CodeLockLost) {
			if lost != nil {
				lost(err)
			}
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			refreshing.Add(1)
			t = time.AfterFunc(ttl/3, refresh)
		}
	}
	mu.Lock()
	refreshing.Add(1)
	t = time.AfterFunc(ttl/3, refresh)
	mu.Unlock()
	release := func() {
		mu.Lock()
		stopped = true
		if t.Stop() {
			refreshing.Done() // never ran
		}
		mu.Unlock()
		refreshing.Wait()
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = lease.Unlock(uctx)
	}
	return lease, release, nil
}
