package manager

import (
	"context"
	"strings"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/store"
)

// A replica deletes only what its runtime reaches. Replicas that share a
// store but not a state directory (on several hosts, or misconfigured on
// one) each reach only their own local sandboxes: a delete through another
// one used to drop the record and answer success while the container ran
// on, out of every replica's sight. Now the record stays, marked
// deleting, the call fails with platform.sandbox_elsewhere, and the
// replica that reaches the container finishes the delete as soon as it
// hears of it (DeletesTopic) or, at the latest, at its next cleanup tick.

// reacher is a runtime that knows which agent addresses are its own (a
// local runtime reaches the sockets under its state directory only).
type reacher interface {
	Reaches(agentAddr string) bool
}

// reaches reports whether this replica's runtime can reach rec's
// container. Records without an address (not started yet) and runtimes
// every replica reaches the same way (Kubernetes) always can.
func (m *Manager) reaches(rec store.Sandbox) bool {
	r, ok := m.rt.(reacher)
	return !ok || rec.AgentAddr == "" || r.Reaches(rec.AgentAddr)
}

// deleteElsewhere marks rec deleting for the replica that reaches it, and
// says why this one did not delete it.
func (m *Manager) deleteElsewhere(ctx context.Context, rec store.Sandbox) error {
	where := strings.TrimPrefix(rec.AgentAddr, "unix:")
	_, err := m.st.UpdateSandbox(ctx, rec.ID, func(r *store.Sandbox) error {
		r.Status = api.StatusDeleting
		r.StatusMessage = "deleted through a replica that cannot reach it; the replica that can finishes the delete"
		return nil
	})
	if err != nil {
		return err
	}
	_ = m.st.Publish(ctx, store.SandboxTopic(rec.ID))
	_ = m.st.Publish(ctx, store.DeletesTopic)
	return faults.Newf(faults.CodeSandboxElsewhere, faults.Conflict, faults.Platform,
		"replica %s cannot reach sandbox %s: its agent is at %s, under another replica's state directory (another host, or a "+
			"replica given another --state-dir). It is marked %q; the replica that reaches it finishes the delete",
		m.cfg.ReplicaID, rec.ID, where, api.StatusDeleting)
}

// finishDeletesLoop finishes the deletes other replicas marked for
// sandboxes this one reaches: when told (DeletesTopic) and every
// CleanupInterval, in case a message was missed.
func (m *Manager) finishDeletesLoop(ctx context.Context) {
	ev, unsubscribe, err := m.st.Subscribe(ctx, store.DeletesTopic)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("deletes asked through other replicas are finished at cleanup ticks only", "err", err)
		}
		ev = nil
	} else {
		defer unsubscribe()
	}
	t := time.NewTicker(m.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ev:
		case <-t.C:
		}
		m.finishDeletes(ctx)
	}
}

// finishDeletes deletes the sandboxes marked deleting that this replica
// reaches.
func (m *Manager) finishDeletes(ctx context.Context) {
	recs, err := m.st.ListSandboxes(ctx)
	if err != nil {
		m.log.Warn("finish deletes: list sandboxes", "err", err)
		return
	}
	for _, rec := range recs {
		if rec.Status != api.StatusDeleting || !m.reaches(rec) {
			continue
		}
		if err := m.Delete(ctx, rec.ID); err != nil {
			m.log.Warn("finish a delete asked through another replica", "sandbox_id", rec.ID, "err", err)
		}
	}
}
