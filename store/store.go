// Package store defines the state Orchard keeps about sandboxes and jobs,
// and the interface its backends (memory, Redis) implement. storetest is
// the contract suite both run.
package store

import (
	"context"
	"maps"

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
