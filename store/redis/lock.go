package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/store"
)

// maxLockWait bounds one sleep of a Lock waiter between attempts. Waiters
// are woken by the holder's Unlock and sleep exactly until an abandoned
// lock expires; this is only the fallback should a wake-up be lost.
const maxLockWait = 500 * time.Millisecond

// lease is a lock held in Redis: lockKey(name) holds value until it
// expires. The nonce in value tells holders apart even if the token
// counter was lost with Redis's data.
type lease struct {
	s     *Store
	name  string
	token int64
	value string
	ttl   time.Duration
}

// acquireScript takes KEYS[1] (the lock) if it is free, with a token from
// KEYS[2]; it returns {token, 0}, or {0, ms until the holder's lease ends}.
var acquireScript = goredis.NewScript(`
local left = redis.call('PTTL', KEYS[1])
if left ~= -2 then return {0, left} end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ':' .. ARGV[1], 'PX', ARGV[2])
return {token, 0}`)

// refreshScript extends KEYS[1] to ARGV[2] ms if it still holds ARGV[1].
var refreshScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

// releaseScript deletes KEYS[1] if it still holds ARGV[1] and wakes the
// waiters on channel ARGV[2].
var releaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0`)

func lockTopic(name string) string { return "lock:" + name }

func millis(d time.Duration) int64 { return max(1, d.Milliseconds()) }

// Lock implements store.Locker.
func (s *Store) Lock(ctx context.Context, name string, ttl time.Duration) (store.Lease, error) {
	if ttl <= 0 {
		return nil, faults.New(faults.CodeInternal, faults.Internal, faults.Platform, "lock: ttl must be positive")
	}
	nonce := strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64(), 36)
	l, wait, err := s.tryLock(ctx, name, nonce, ttl)
	if l != nil || err != nil {
		return l, err
	}
	// Subscribe before the next attempt, so an Unlock between that attempt
	// and the wait still wakes us.
	released, cancel, err := s.Subscribe(ctx, lockTopic(name))
	if err != nil {
		return nil, err
	}
	defer cancel()
	for {
		if l, wait, err = s.tryLock(ctx, name, nonce, ttl); l != nil || err != nil {
			return l, err
		}
		t := time.NewTimer(min(wait, maxLockWait))
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

// tryLock makes one attempt; without the lock it says how long the current
// holder's lease has left.
func (s *Store) tryLock(ctx context.Context, name, nonce string, ttl time.Duration) (*lease, time.Duration, error) {
	res, err := acquireScript.Run(ctx, s.rdb, []string{s.lockKey(name), s.fenceKey()}, nonce, millis(ttl)).Int64Slice()
	if err != nil {
		return nil, 0, s.fail(ctx, err)
	}
	if len(res) != 2 {
		return nil, 0, s.fail(ctx, fmt.Errorf("lock %s: unexpected reply %v", name, res))
	}
	if token := res[0]; token > 0 {
		return &lease{s: s, name: name, token: token, value: strconv.FormatInt(token, 10) + ":" + nonce, ttl: ttl}, 0, nil
	}
	left := time.Duration(res[1]) * time.Millisecond
	if left <= 0 { // no expiry (not ours) or expired just now
		left = maxLockWait
	}
	return nil, left + time.Millisecond, nil
}

func (l *lease) Token() int64 { return l.token }

func (l *lease) Valid(ctx context.Context) error {
	v, err := l.s.rdb.Get(ctx, l.s.lockKey(l.name)).Result()
	if errors.Is(err, goredis.Nil) || (err == nil && v != l.value) {
		return store.ErrLockLost(l.name)
	}
	if err != nil {
		return l.s.fail(ctx, err)
	}
	return nil
}

func (l *lease) Refresh(ctx context.Context) error {
	return l.run(ctx, refreshScript, millis(l.ttl))
}

func (l *lease) Unlock(ctx context.Context) error {
	return l.run(ctx, releaseScript, l.s.channel(lockTopic(l.name)))
}

func (l *lease) run(ctx context.Context, script *goredis.Script, arg any) error {
	ok, err := script.Run(ctx, l.s.rdb, []string{l.s.lockKey(l.name)}, l.value, arg).Int()
	if err != nil {
		return l.s.fail(ctx, err)
	}
	if ok == 0 {
		return store.ErrLockLost(l.name)
	}
	return nil
}

// ownLease accepts only leases this package made.
func (s *Store) ownLease(l store.Lease) (*lease, error) {
	rl, ok := l.(*lease)
	if !ok || rl == nil {
		return nil, faults.Newf(faults.CodeInternal, faults.Internal, faults.Platform, "fenced update with a lease of another store (%T)", l)
	}
	return rl, nil
}

// watched is the WATCH list of an update: the record, and the lock too
// when fenced, so that losing the lock between the check and EXEC aborts
// the transaction.
func (s *Store) watched(l *lease, key string) []string {
	if l == nil {
		return []string{key}
	}
	return []string{s.lockKey(l.name), key}
}

// checkLease runs inside a fenced update's WATCH: the lock must still hold
// l's value.
func (s *Store) checkLease(ctx context.Context, tx *goredis.Tx, l *lease) error {
	if l == nil {
		return nil
	}
	v, err := tx.Get(ctx, s.lockKey(l.name)).Result()
	if errors.Is(err, goredis.Nil) || (err == nil && v != l.value) {
		return abortError{store.ErrLockLost(l.name)}
	}
	return err
}

// tryAcquireScript gives KEYS[1] to ARGV[1] for ARGV[2] ms if it is free or
// already ARGV[1]'s.
var tryAcquireScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0`)

var releaseLeaderScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// TryAcquire implements store.Elector.
func (s *Store) TryAcquire(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	ok, err := tryAcquireScript.Run(ctx, s.rdb, []string{s.leaderKey(name)}, holder, millis(ttl)).Int()
	if err != nil {
		return false, s.fail(ctx, err)
	}
	return ok == 1, nil
}

// Release implements store.Elector.
func (s *Store) Release(ctx context.Context, name, holder string) error {
	if err := releaseLeaderScript.Run(ctx, s.rdb, []string{s.leaderKey(name)}, holder).Err(); err != nil {
		return s.fail(ctx, err)
	}
	return nil
}
