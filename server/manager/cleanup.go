package manager

import (
	"context"
	"errors"
	"time"

	"github.com/orchard/orchard/faults"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/retry"
	"github.com/orchard/orchard/store"
)

// Run runs the cleanup loop until ctx ends: TTL,
// pending-timeout and heartbeat cleanup, old-job reaping and
// reconciliation every CleanupInterval. It also ends the jobs this replica
// runs whose cancel another replica asked for.
//
// When the store coordinates replicas (store.Elector), only the replica
// holding the "cleanup" lease sweeps, so replicas never race to delete.
func (m *Manager) Run(ctx context.Context) error {
	cancels := make(chan struct{})
	go func() { defer close(cancels); m.serveCancels(ctx) }()
	defer func() { <-cancels }()
	if _, ok := m.rt.(reacher); ok {
		deletes := make(chan struct{})
		go func() { defer close(deletes); m.finishDeletesLoop(ctx) }()
		defer func() { <-deletes }()
	}
	if r, ok := m.rt.(orphanReaper); ok {
		orphans := make(chan struct{})
		go func() { defer close(orphans); m.reapOrphansLoop(ctx, r) }()
		defer func() { <-orphans }()
	}
	e, ok := m.st.(store.Elector)
	if !ok {
		m.sweepLoop(ctx)
		return nil
	}
	alive := make(chan struct{})
	go func() { defer close(alive); m.keepAlive(ctx) }()
	defer func() { <-alive }()
	again := retry.NewBackoff(campaignRetry)
	for ctx.Err() == nil {
		err := store.Campaign(ctx, e, "cleanup", m.cfg.ReplicaID, leaderTTL, func(lctx context.Context) {
			m.log.Info("cleanup: this replica leads", "replica", m.cfg.ReplicaID)
			m.sweepLoop(lctx)
		})
		if err != nil && ctx.Err() == nil {
			m.log.Warn("cleanup: campaign", "err", err)
			_ = again.Wait(ctx, err) // no Attempts or Budget: ctx ends it
		}
	}
	return nil
}

// campaignRetry spaces the campaigns of a replica whose campaign failed
// (the store is out, mostly): up to leaderTTL/3, as a lease renews.
var campaignRetry = retry.Policy{Initial: leaderTTL / 3, Max: leaderTTL / 3}

// leaderTTL bounds how long cleanup pauses when its leader dies.
const leaderTTL = 30 * time.Second

// orphanReaper is a runtime that can find sandboxes on this host that no
// server can reach any more (a wiped state directory) and remove them.
type orphanReaper interface {
	ReapOrphans(ctx context.Context, grace time.Duration) int
}

// orphanGrace is how old a sandbox without an owner must be before it is
// removed as an orphan: one being created has no owner yet for a moment.
const orphanGrace = 10 * time.Minute

// reapOrphansLoop removes this host's orphaned sandboxes every
// CleanupInterval. Every replica runs it, leader or not: orphans are a
// host's, and each host needs one.
func (m *Manager) reapOrphansLoop(ctx context.Context, r orphanReaper) {
	t := time.NewTicker(m.cfg.CleanupInterval)
	defer t.Stop()
	// Not at start: reading every process's descriptors would slow it, and
	// no orphan is younger than orphanGrace anyway.
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n := r.ReapOrphans(ctx, orphanGrace); n > 0 {
			m.log.Warn("cleanup: removed orphaned sandboxes of this host", "count", n)
		}
	}
}

func (m *Manager) sweepLoop(ctx context.Context) {
	m.Sweep(ctx)
	t := time.NewTicker(m.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Sweep(ctx)
		}
	}
}

// Sweep runs one cleanup and reconciliation pass.
func (m *Manager) Sweep(ctx context.Context) {
	// Deleted snapshots and ended forks leave layers nothing may use any
	// more. In line: the sweep is background work of its own, which
	// Shutdown waits for through Run, not through m.bg.
	defer m.prune(ctx)
	now := m.now()
	// Records are stored before their containers are created, so a
	// container listed before the records has its record among them unless
	// it is an orphan; listing the other way round could take a sandbox
	// another replica is creating for one.
	before, listErr := m.rt.List(ctx)
	recs, err := m.st.ListSandboxes(ctx)
	if err != nil {
		m.log.Warn("cleanup: list sandboxes", "err", err)
		return
	}
	known := make(map[string]bool, len(recs))
	for _, r := range recs {
		known[r.ID] = true
		known[r.RuntimeName()] = true // a claimed pool sandbox's container
		age := now.Sub(unixTime(r.CreatedAt))
		ttl := m.cfg.SandboxTTL
		if r.TTLSeconds > 0 {
			ttl = api.Seconds(r.TTLSeconds)
		}
		var why string
		switch {
		case age > ttl:
			why = "ttl expired"
		case !r.Ready && age > api.Seconds(r.CreationTimeout)+m.cfg.PendingTimeoutBuffer:
			why = "pending timeout"
		case m.cfg.HeartbeatCleanupEnabled && r.PoolState == "" && r.Ready && r.Status != api.StatusPaused && r.LastHeartbeat != nil &&
			now.Sub(unixTime(*r.LastHeartbeat)) > m.cfg.HeartbeatTimeout:
			why = "heartbeat timeout"
		}
		if why != "" {
			m.log.Info("cleanup: deleting sandbox", "sandbox_id", r.ID, "reason", why)
			if err := m.Delete(ctx, r.ID); err != nil {
				m.log.Warn("cleanup: delete", "sandbox_id", r.ID, "err", err)
			}
			known[r.ID] = false
			known[r.RuntimeName()] = false
		}
	}

	if jobs, err := m.st.ListJobs(ctx); err == nil {
		for _, j := range jobs {
			switch {
			case j.Terminal() && now.Sub(unixTime(j.CreatedAt)) > m.cfg.OrphanJobTTL:
				_ = m.st.DeleteJob(ctx, j.JobID)
			case !j.Terminal() && !m.runsHere(j) && m.runnerGone(ctx, j, now):
				m.failLostJob(ctx, j)
			}
		}
	}

	// And a record listed before this second list whose container is
	// missing from it has really lost its container.
	after, err := m.rt.List(ctx)
	if listErr != nil || err != nil {
		m.log.Warn("cleanup: runtime list failed; skipping reconciliation", "err", errors.Join(listErr, err))
		return
	}
	live := make(map[string]bool, len(after))
	for _, inst := range after {
		live[inst.ID] = true
	}
	for _, inst := range before {
		if _, ok := known[inst.ID]; ok || !live[inst.ID] {
			continue
		}
		m.mu.Lock()
		_, starting := m.creating[inst.ID]
		m.mu.Unlock()
		if starting {
			continue
		}
		m.log.Info("reconcile: removing sandbox without a record", "sandbox_id", inst.ID)
		if err := m.rt.Delete(ctx, inst.ID); err != nil {
			m.log.Warn("reconcile: delete", "sandbox_id", inst.ID, "err", err)
		}
	}
	for _, r := range recs {
		if known[r.ID] && (r.Status == api.StatusReady || r.Status == api.StatusPaused) && !live[r.RuntimeName()] {
			m.failVanished(ctx, r.ID, r.RuntimeName())
		}
	}
}

// failVanished fails the record of a ready sandbox whose container or pod
// is gone (deleted outside Orchard, or lost with its node), rather than
// dropping it: a client holding the id learns what happened instead of
// meeting a 404, and the record goes at its TTL like any other.
func (m *Manager) failVanished(ctx context.Context, id, rid string) {
	f := faults.New(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox,
		"Pod not found: the sandbox's container was removed outside Orchard")
	_, err := m.st.UpdateSandbox(ctx, id, func(r *store.Sandbox) error {
		if r.Status != api.StatusReady && r.Status != api.StatusPaused {
			return nil // deleted or failed meanwhile: nothing to add
		}
		fi := toFaultInfo(f)
		r.Status, r.StatusMessage, r.Fault = api.StatusFailed, f.Message, &fi
		return nil
	})
	if err != nil {
		m.log.Warn("reconcile: fail record of a vanished sandbox", "sandbox_id", id, "err", err)
		return
	}
	m.log.Info("reconcile: failed the record of a vanished sandbox", "sandbox_id", id)
	m.detachEgress(rid)
	_ = m.st.Publish(ctx, store.SandboxTopic(id))
}

// Recover reconciles the store with sandboxes an earlier server process
// left running: a live sandbox without a record is adopted (its record is
// rebuilt from the spec the runtime kept) so clients holding its id carry
// on; a dead one is removed.
func (m *Manager) Recover(ctx context.Context) error {
	insts, err := m.rt.List(ctx)
	if err != nil {
		return err
	}
	adoptPooled, poolsDone := m.recoverPools(ctx)
	defer poolsDone()
	for _, inst := range insts {
		if inst.Alive && inst.Spec.ID != "" {
			// Network-enabled sandboxes get their egress back at once.
			m.attachEgress(inst.Spec, inst.AgentAddr)
		}
		if _, err := m.st.GetSandbox(ctx, inst.ID); err == nil {
			continue
		}
		if !m.cfg.AdoptOrphans {
			// A store that outlives server processes still has the records
			// of every sandbox; a container without one is being deleted
			// or an orphan, which the cleanup leader removes.
			continue
		}
		if inst.Alive && adoptPooled(inst) {
			continue
		}
		if !inst.Alive || inst.Spec.ID == "" {
			m.log.Info("recover: removing sandbox left by an earlier process", "sandbox_id", inst.ID, "alive", inst.Alive)
			if err := m.rt.Delete(ctx, inst.ID); err != nil {
				m.log.Warn("recover: delete", "sandbox_id", inst.ID, "err", err)
			}
			continue
		}
		sp := inst.Spec
		rec := store.Sandbox{
			ID: inst.ID, Namespace: m.cfg.Namespace, Kind: sp.Kind, Image: sp.Image, BlockNetwork: sp.BlockNetwork,
			CPU: sp.CPUQuantity, Memory: sp.MemoryQuantity, CreatedAt: float64(inst.CreatedAt.UnixNano()) / 1e9,
			Ready: true, Status: api.StatusReady, CreationTimeout: 3600, Labels: sp.Labels, Env: sp.Env,
			AgentAddr: inst.AgentAddr, TTLSeconds: sp.TTLSeconds, EphemeralStorage: sp.EphemeralStorageQuantity,
		}
		if err := m.st.CreateSandbox(ctx, rec); err != nil {
			m.log.Warn("recover: store record", "sandbox_id", inst.ID, "err", err)
			continue
		}
		m.log.Info("recover: re-attached sandbox", "sandbox_id", inst.ID)
	}
	return nil
}

func unixTime(f float64) time.Time {
	return time.Unix(0, int64(f*1e9))
}

// Shutdown stops accepting work, cancels running jobs and pending creates
// with a shutting-down cause, and waits for background work up to ctx.
// Sandboxes themselves are left running: the next server re-attaches.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.stopOnce.Do(func() { close(m.stopping); m.stopCancel() })
	done := make(chan struct{})
	go func() { m.bg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	// Out of time: cut short what is still running, then give it a moment
	// to record its final state.
	m.mu.Lock()
	for _, c := range m.creating {
		c.cancel(errShutdown)
	}
	for _, js := range m.jobs {
		for _, cancel := range js {
			cancel(errShutdown)
		}
	}
	m.mu.Unlock()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	return context.Cause(ctx)
}

// runsHere reports whether this replica runs the job.
func (m *Manager) runsHere(j api.Job) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.jobs[j.SandboxID][j.JobID]
	return ok
}

// failLostJob ends a job whose runner is gone, so waiters stop waiting.
func (m *Manager) failLostJob(ctx context.Context, j api.Job) {
	f := faults.New(faults.CodeJobLost, faults.Unavailable, faults.Platform, "the server running this job stopped before it finished")
	now := m.unix()
	_, err := m.st.UpdateJob(ctx, j.JobID, func(j *api.Job) error {
		if j.Terminal() {
			return nil
		}
		fi := toFaultInfo(f)
		j.Status, j.CompletedAt, j.Error, j.Fault = api.JobFailed, &now, &f.Message, &fi
		return nil
	})
	if err == nil {
		m.log.Warn("cleanup: failed a job whose runner is gone", "job_id", j.JobID, "sandbox_id", j.SandboxID)
		_ = m.st.Publish(ctx, store.JobTopic(j.JobID))
	}
}

// runnerGone reports whether the replica that owns an unfinished job has
// stopped: its liveness lease lapsed (see keepAlive), or, for a job that
// names no runner, it is past every bound a live runner keeps.
func (m *Manager) runnerGone(ctx context.Context, j api.Job, now time.Time) bool {
	e, ok := m.st.(store.Elector)
	if j.Runner == "" || !ok {
		return j.Status == api.JobRunning && j.StartedAt != nil &&
			now.Sub(unixTime(*j.StartedAt)) > api.Seconds(j.TimeoutSeconds)+2*waitSlack+time.Minute
	}
	if j.Runner == m.cfg.ReplicaID {
		return false
	}
	// The lease is free only if its holder stopped renewing it: take it for
	// a moment to find out, and give it back.
	probe := "sweeper:" + m.cfg.ReplicaID
	free, err := e.TryAcquire(ctx, replicaLease(j.Runner), probe, time.Second)
	if err != nil || !free {
		return false
	}
	_ = e.Release(ctx, replicaLease(j.Runner), probe)
	return true
}

// replicaTTL is how long after a replica dies its unfinished jobs are
// failed (by the next sweep after that).
const replicaTTL = 15 * time.Second

func replicaLease(id string) string { return "replica:" + id }

// keepAlive holds this replica's liveness lease until ctx ends, so other
// replicas can tell its unfinished jobs from lost ones.
func (m *Manager) keepAlive(ctx context.Context) {
	e, ok := m.st.(store.Elector)
	if !ok {
		return
	}
	name := replicaLease(m.cfg.ReplicaID)
	t := time.NewTicker(replicaTTL / 3)
	defer t.Stop()
	for {
		if _, err := e.TryAcquire(ctx, name, m.cfg.ReplicaID, replicaTTL); err != nil && ctx.Err() == nil {
			m.log.Warn("liveness lease", "err", err)
		}
		if err := m.refreshHost(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("host record", "err", err)
		}
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = e.Release(rctx, name, m.cfg.ReplicaID)
			cancel()
			return
		case <-t.C:
		}
	}
}
