package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/store"
)

// Replicas on one host must share one state directory: a local sandbox
// lives in its runtime's state directory, so a replica given another one
// can neither reach nor delete the sandboxes its peers made, and a
// delete through it would answer success while the container runs on.
// Each replica with a local runtime and a shared store keeps a document
// per host (hostKind, by machine id) naming the directory, refreshed with
// its liveness lease; a replica started on the same host with another
// directory is refused. (The memory store keeps the record too; it has no
// peers to read it.)

// hostKind is the store.Docs kind of the per-host documents.
const hostKind = "host"

type hostDoc struct {
	StateDir string `json:"state_dir"`
	Replica  string `json:"replica"`
}

// HostID names this machine among replicas: its machine id (the same for
// every process and container sharing the host's /etc), else its name.
func HostID() string {
	for _, p := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if b, err := os.ReadFile(p); err == nil {
			if id := strings.TrimSpace(string(b)); id != "" {
				return id
			}
		}
	}
	h, _ := os.Hostname()
	return h
}

// ClaimHost records that this replica keeps its sandboxes in stateDir on
// this host, and refuses (platform.misconfigured) when a live replica on
// the same host keeps them in another directory. A store that is not
// shared (memory) has no peers: nothing to check. The record is kept
// alive by Run's liveness loop.
func (m *Manager) ClaimHost(ctx context.Context, stateDir string) error {
	d, ok := m.st.(store.Docs)
	if !ok || m.cfg.HostID == "" {
		return nil
	}
	raw, found, err := d.GetDoc(ctx, hostKind, m.cfg.HostID)
	if err != nil {
		return err
	}
	if found {
		var prev hostDoc
		if json.Unmarshal(raw, &prev) == nil && prev.StateDir != stateDir && prev.Replica != m.cfg.ReplicaID {
			return faults.Newf(faults.CodeMisconfigured, faults.Internal, faults.Platform,
				"replica %s on this host keeps its sandboxes in %s, and this one was given %s: replicas on one host must share "+
					"the state directory (--state-dir, ORCHARD_STATE_DIR), or they cannot reach each other's sandboxes",
				prev.Replica, prev.StateDir, stateDir)
		}
	}
	m.hostState = stateDir
	return m.refreshHost(ctx)
}

// refreshHost renews this host's record for replicaTTL.
func (m *Manager) refreshHost(ctx context.Context) error {
	d, ok := m.st.(store.Docs)
	if !ok || m.hostState == "" {
		return nil
	}
	b, err := json.Marshal(hostDoc{StateDir: m.hostState, Replica: m.cfg.ReplicaID})
	if err != nil {
		return err
	}
	if err := d.PutDoc(ctx, hostKind, m.cfg.HostID, b, replicaTTL); err != nil {
		return fmt.Errorf("host record: %w", err)
	}
	return nil
}
