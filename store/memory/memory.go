// Package memory is the in-process Store: the default for a single server.
package memory

import (
	"context"
	"sort"
	"sync"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/store"
)

// Store keeps records in maps. Values are copied in and out so callers never
// share memory with the store.
type Store struct {
	mu        sync.Mutex // guards sandboxes and jobs
	sandboxes map[string]store.Sandbox
	jobs      map[string]api.Job

	subMu sync.Mutex // guards subs
	subs  map[string]map[*sub]struct{}
}

type sub struct{ ch chan struct{} }

var _ store.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	return &Store{
		sandboxes: map[string]store.Sandbox{},
		jobs:      map[string]api.Job{},
		subs:      map[string]map[*sub]struct{}{},
	}
}

// CreateSandbox implements store.Store.
func (m *Store) CreateSandbox(ctx context.Context, s store.Sandbox) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sandboxes[s.ID]; ok {
		return store.ErrSandboxExists(s.ID)
	}
	m.sandboxes[s.ID] = s.Clone()
	return nil
}

// GetSandbox implements store.Store.
func (m *Store) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sandboxes[id]
	if !ok {
		return store.Sandbox{}, store.ErrSandboxNotFound(id)
	}
	return s.Clone(), nil
}

// UpdateSandbox implements store.Store.
func (m *Store) UpdateSandbox(ctx context.Context, id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sandboxes[id]
	if !ok {
		return store.Sandbox{}, store.ErrSandboxNotFound(id)
	}
	s = s.Clone()
	if err := fn(&s); err != nil {
		return store.Sandbox{}, err
	}
	s.ID = id
	m.sandboxes[id] = s.Clone()
	return s, nil
}

// DeleteSandbox implements store.Store.
func (m *Store) DeleteSandbox(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.sandboxes, id)
	return nil
}

// ListSandboxes implements store.Store; records come sorted by creation time.
func (m *Store) ListSandboxes(ctx context.Context) ([]store.Sandbox, error) {
	m.mu.Lock()
	out := make([]store.Sandbox, 0, len(m.sandboxes))
	for _, s := range m.sandboxes {
		out = append(out, s.Clone())
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAt != out[j].CreatedAt {
			return out[i].CreatedAt < out[j].CreatedAt
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// CreateJob implements store.Store.
func (m *Store) CreateJob(ctx context.Context, j api.Job) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.jobs[j.JobID] = store.CloneJob(j)
	return nil
}

// GetJob implements store.Store.
func (m *Store) GetJob(ctx context.Context, id string) (api.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j, ok := m.jobs[id]
	if !ok {
		return api.Job{}, store.ErrJobNotFound(id)
	}
	return store.CloneJob(j), nil
}

// UpdateJob implements store.Store.
func (m *Store) UpdateJob(ctx context.Context, id string, fn func(*api.Job) error) (api.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j, ok := m.jobs[id]
	if !ok {
		return api.Job{}, store.ErrJobNotFound(id)
	}
	j = store.CloneJob(j)
	if err := fn(&j); err != nil {
		return api.Job{}, err
	}
	j.JobID = id
	m.jobs[id] = store.CloneJob(j)
	return j, nil
}

// DeleteJob implements store.Store.
func (m *Store) DeleteJob(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.jobs, id)
	return nil
}

// ListJobs implements store.Store.
func (m *Store) ListJobs(ctx context.Context) ([]api.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]api.Job, 0, len(m.jobs))
	for _, j := range m.jobs {
		out = append(out, store.CloneJob(j))
	}
	return out, nil
}

// Subscribe implements store.Store.
func (m *Store) Subscribe(ctx context.Context, topic string) (<-chan struct{}, func(), error) {
	s := &sub{ch: make(chan struct{}, 1)}
	m.subMu.Lock()
	if m.subs[topic] == nil {
		m.subs[topic] = map[*sub]struct{}{}
	}
	m.subs[topic][s] = struct{}{}
	m.subMu.Unlock()
	var once sync.Once
	cancel := func() {
		once.Do(func() {
			m.subMu.Lock()
			delete(m.subs[topic], s)
			if len(m.subs[topic]) == 0 {
				delete(m.subs, topic)
			}
			m.subMu.Unlock()
		})
	}
	return s.ch, cancel, nil
}

// Publish implements store.Store.
func (m *Store) Publish(ctx context.Context, topic string) error {
	m.subMu.Lock()
	defer m.subMu.Unlock()
	for s := range m.subs[topic] {
		select {
		case s.ch <- struct{}{}:
		default: // a value is already pending: coalesce
		}
	}
	return nil
}
