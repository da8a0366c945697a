// Package memory is the in-process Store: the default for a single server.
package memory

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/store"
)

// Store keeps records in maps. Values are copied in and out so callers never
// share memory with the store.
type Store struct {
	mu        sync.Mutex // guards sandboxes, jobs and docs
	sandboxes map[string]store.Sandbox
	jobs      map[string]api.Job
	docs      map[docKey]doc

	subMu sync.Mutex // guards subs
	subs  map[string]map[*sub]struct{}

	// lockMu guards fence, locks, waiting and leaders. It is taken before
	// mu when both are needed (fenced updates).
	lockMu  sync.Mutex
	fence   int64 // last fencing token handed out, for any name
	locks   map[string]lockState
	waiting map[string]chan struct{} // by lock name: closed when it is released
	leaders map[string]leader
}

type sub struct{ ch chan struct{} }

type docKey struct{ kind, id string }

type doc struct {
	b       []byte
	expires time.Time // zero: never
}

func (d doc) live(now time.Time) bool { return d.expires.IsZero() || now.Before(d.expires) }

// lockState is the holder of one named lock. One counter for all names
// keeps tokens monotonic per name without keeping released locks around.
type lockState struct {
	holder  int64     // token of the holder
	expires time.Time // when the holder's lease ends
}

type leader struct {
	holder  string
	expires time.Time
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Locker  = (*Store)(nil)
	_ store.Fenced  = (*Store)(nil)
	_ store.Elector = (*Store)(nil)
	_ store.Docs    = (*Store)(nil)
)

// New returns an empty store.
func New() *Store {
	return &Store{
		sandboxes: map[string]store.Sandbox{},
		jobs:      map[string]api.Job{},
		docs:      map[docKey]doc{},
		subs:      map[string]map[*sub]struct{}{},
		locks:     map[string]lockState{},
		waiting:   map[string]chan struct{}{},
		leaders:   map[string]leader{},
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
	return m.updateSandbox(id, fn)
}

func (m *Store) updateSandbox(id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
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
	return m.updateJob(id, fn)
}

func (m *Store) updateJob(id string, fn func(*api.Job) error) (api.Job, error) {
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

// lease is a held lock of a memory Store.
type lease struct {
	m     *Store
	name  string
	token int64
	ttl   time.Duration
}

// Lock implements store.Locker. Waiters are woken by the release of the
// lock and otherwise sleep until the holder's lease would expire.
func (m *Store) Lock(ctx context.Context, name string, ttl time.Duration) (store.Lease, error) {
	for {
		m.lockMu.Lock()
		now := time.Now()
		l, held := m.locks[name]
		if !held || !now.Before(l.expires) {
			m.fence++
			token := m.fence
			m.locks[name] = lockState{holder: token, expires: now.Add(ttl)}
			m.lockMu.Unlock()
			return &lease{m: m, name: name, token: token, ttl: ttl}, nil
		}
		released := m.waiting[name]
		if released == nil {
			released = make(chan struct{})
			m.waiting[name] = released
		}
		wait := l.expires.Sub(now)
		m.lockMu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-released:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		}
		t.Stop()
	}
}

// held reports whether l holds its lock. The caller holds lockMu.
func (l *lease) held() bool {
	s, ok := l.m.locks[l.name]
	return ok && s.holder == l.token && time.Now().Before(s.expires)
}

func (l *lease) Token() int64 { return l.token }

func (l *lease) Valid(ctx context.Context) error {
	l.m.lockMu.Lock()
	defer l.m.lockMu.Unlock()
	if !l.held() {
		return store.ErrLockLost(l.name)
	}
	return nil
}

func (l *lease) Refresh(ctx context.Context) error {
	l.m.lockMu.Lock()
	defer l.m.lockMu.Unlock()
	if !l.held() {
		return store.ErrLockLost(l.name)
	}
	l.m.locks[l.name] = lockState{holder: l.token, expires: time.Now().Add(l.ttl)}
	return nil
}

func (l *lease) Unlock(ctx context.Context) error {
	l.m.lockMu.Lock()
	defer l.m.lockMu.Unlock()
	if !l.held() {
		return store.ErrLockLost(l.name)
	}
	delete(l.m.locks, l.name)
	if c := l.m.waiting[l.name]; c != nil {
		close(c)
		delete(l.m.waiting, l.name)
	}
	return nil
}

// fenced runs update while holding lockMu, if l is a held lease of m.
func (m *Store) fenced(l store.Lease, update func()) error {
	ml, ok := l.(*lease)
	if !ok || ml.m != m {
		return faults.Newf(faults.CodeInternal, faults.Internal, faults.Platform, "fenced update with a lease of another store (%T)", l)
	}
	m.lockMu.Lock()
	defer m.lockMu.Unlock()
	if !ml.held() {
		return store.ErrLockLost(ml.name)
	}
	update()
	return nil
}

// UpdateSandboxFenced implements store.Fenced.
func (m *Store) UpdateSandboxFenced(ctx context.Context, l store.Lease, id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
	var s store.Sandbox
	var err error
	if ferr := m.fenced(l, func() { s, err = m.updateSandbox(id, fn) }); ferr != nil {
		return store.Sandbox{}, ferr
	}
	return s, err
}

// UpdateJobFenced implements store.Fenced.
func (m *Store) UpdateJobFenced(ctx context.Context, l store.Lease, id string, fn func(*api.Job) error) (api.Job, error) {
	var j api.Job
	var err error
	if ferr := m.fenced(l, func() { j, err = m.updateJob(id, fn) }); ferr != nil {
		return api.Job{}, ferr
	}
	return j, err
}

// TryAcquire implements store.Elector.
func (m *Store) TryAcquire(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	m.lockMu.Lock()
	defer m.lockMu.Unlock()
	now := time.Now()
	if cur, ok := m.leaders[name]; ok && cur.holder != holder && now.Before(cur.expires) {
		return false, nil
	}
	m.leaders[name] = leader{holder: holder, expires: now.Add(ttl)}
	return true, nil
}

// Release implements store.Elector.
func (m *Store) Release(ctx context.Context, name, holder string) error {
	m.lockMu.Lock()
	defer m.lockMu.Unlock()
	if m.leaders[name].holder == holder {
		delete(m.leaders, name)
	}
	return nil
}

// PutDoc implements store.Docs.
func (m *Store) PutDoc(ctx context.Context, kind, id string, b []byte, ttl time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.putDoc(kind, id, b, ttl)
	return nil
}

// putDoc stores a copy of b; the caller holds mu. Expired documents are
// dropped here, so the map does not grow with documents nobody reads.
func (m *Store) putDoc(kind, id string, b []byte, ttl time.Duration) {
	now := time.Now()
	for k, d := range m.docs {
		if !d.live(now) {
			delete(m.docs, k)
		}
	}
	d := doc{b: append([]byte(nil), b...)}
	if ttl > 0 {
		d.expires = now.Add(ttl)
	}
	m.docs[docKey{kind, id}] = d
}

// PutDocFenced implements store.Docs.
func (m *Store) PutDocFenced(ctx context.Context, l store.Lease, kind, id string, b []byte, ttl time.Duration) error {
	return m.fenced(l, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.putDoc(kind, id, b, ttl)
	})
}

// GetDoc implements store.Docs.
func (m *Store) GetDoc(ctx context.Context, kind, id string) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.docs[docKey{kind, id}]
	if !ok || !d.live(time.Now()) {
		return nil, false, nil
	}
	return append([]byte(nil), d.b...), true, nil
}

// DeleteDoc implements store.Docs.
func (m *Store) DeleteDoc(ctx context.Context, kind, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.docs, docKey{kind, id})
	return nil
}

// ListDocs implements store.Docs.
func (m *Store) ListDocs(ctx context.Context, kind string) (map[string][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	out := map[string][]byte{}
	for k, d := range m.docs {
		if k.kind == kind && d.live(now) {
			out[k.id] = append([]byte(nil), d.b...)
		}
	}
	return out, nil
}
