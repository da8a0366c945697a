package redis

import (
	"context"
	"errors"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/orchard/orchard/internal/failpoint"
	"github.com/orchard/orchard/store"
)

// casScript replaces KEYS[1] with ARGV[2] (expiring in ARGV[3] ms, 0 =
// never) if it still holds ARGV[1] and, when KEYS[2] is given, the lock
// KEYS[2] still holds ARGV[4]. It returns 1 when it wrote, 0 when the
// record changed since it was read, -1 when the lock is not held.
var casScript = goredis.NewScript(`
if #KEYS > 1 and redis.call('GET', KEYS[2]) ~= ARGV[4] then
  return -1
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[2])
end
return 1`)

// recentValues remembers the last value this process wrote of a few
// records, so the next update of a record that nobody else changed (a
// job's finish after its create) is one round trip: the compare-and-set
// with the remembered value. A stale entry only costs the read it saved.
type recentValues struct {
	mu   sync.Mutex // guards vals
	vals map[string][]byte
}

// recentMax bounds the remembered records; past it the memory starts over.
const recentMax = 4096

func (r *recentValues) get(key string) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.vals[key]
	return b, ok
}

func (r *recentValues) put(key string, b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.vals == nil || len(r.vals) >= recentMax {
		r.vals = map[string][]byte{}
	}
	r.vals[key] = b
}

func (r *recentValues) forget(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.vals, key)
}

// casUpdate is a read-modify-write of one record in two round trips (one
// when the record's value is remembered): GET, then the compare-and-set
// script, retried while another writer changes
// the record first (each retry runs apply on the fresh value). With l it
// is fenced: the script checks the lock in the same atomic step. This is
// what makes an exec on the Redis store cost little more than on the
// memory one: WATCH/GET/MULTI/EXEC took four round trips.
func (s *Store) casUpdate(ctx context.Context, l *lease, key string, notFound func() error,
	apply func(old []byte) (b []byte, ttl time.Duration, err error)) error {
	if err := failpoint.Eval("store.redis.write"); err != nil {
		return err
	}
	keys := []string{key}
	lockValue := ""
	if l != nil {
		keys, lockValue = append(keys, s.lockKey(l.name)), l.value
	}
	old, cached := s.recent.get(key)
	for attempt := range maxTxAttempts {
		var err error
		if !cached {
			old, err = s.rdb.Get(ctx, key).Bytes()
		}
		cached = false
		if errors.Is(err, goredis.Nil) {
			if l != nil {
				// A lost lock is reported before a missing record, as the
				// transactional version did.
				if v, err := s.rdb.Get(ctx, keys[1]).Result(); err == nil || errors.Is(err, goredis.Nil) {
					if v != lockValue {
						return store.ErrLockLost(l.name)
					}
				}
			}
			return notFound()
		}
		if err != nil {
			return s.fail(ctx, err)
		}
		b, ttl, err := apply(old)
		if err != nil {
			return err
		}
		res, err := casScript.Run(ctx, s.rdb, keys, old, b, max(ttl.Milliseconds(), 0), lockValue).Int()
		if err != nil {
			return s.fail(ctx, err)
		}
		switch res {
		case 1:
			s.recent.put(key, b)
			return nil
		case -1:
			return store.ErrLockLost(l.name)
		}
		if attempt == 0 {
			continue // the cached value was stale: read and retry at once
		}
		if err := raceBackoff(ctx, attempt); err != nil {
			return err
		}
	}
	return errBusy(key)
}
