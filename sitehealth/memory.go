package sitehealth

import (
	"context"
	"sync"
	"time"
)

// sweepEvery is how many writes pass between sweeps of expired records, so
// a server that visits many hosts and never asks for Status still forgets
// them, at a cost spread thin over the writes.
const sweepEvery = 1024

// Memory is a Backend for one server: its records live in the process.
// Expiry follows the real clock.
type Memory struct {
	mu     sync.Mutex // guards recs and writes, and serializes Update
	recs   map[string]memRecord
	writes int
}

type memRecord struct {
	data    []byte
	expires time.Time // zero: never
}

var _ Backend = (*Memory)(nil)

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{recs: map[string]memRecord{}} }

// Update implements Backend. fn runs under the lock, once.
func (m *Memory) Update(ctx context.Context, host string, ttl time.Duration, fn func(rec []byte) ([]byte, error)) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var old []byte
	if r, ok := m.recs[host]; ok && r.live(now) {
		old = r.data
	}
	b, err := fn(old)
	if err != nil {
		return err
	}
	r := memRecord{data: b}
	if ttl > 0 {
		r.expires = now.Add(ttl)
	}
	m.recs[host] = r
	if m.writes++; m.writes%sweepEvery == 0 {
		for h, r := range m.recs {
			if !r.live(now) {
				delete(m.recs, h)
			}
		}
	}
	return nil
}

// List implements Backend.
func (m *Memory) List(ctx context.Context) (map[string][]byte, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	out := make(map[string][]byte, len(m.recs))
	for h, r := range m.recs {
		if r.live(now) {
			out[h] = r.data
		} else {
			delete(m.recs, h)
		}
	}
	return out, nil
}

func (r memRecord) live(now time.Time) bool { return r.expires.IsZero() || now.Before(r.expires) }
