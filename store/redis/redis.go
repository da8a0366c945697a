// Package redis is the Store that several server replicas share: records,
// jobs, locks, leader leases and events live in one Redis (standalone or a
// managed single endpoint), reached with go-redis.
//
// Key layout, under Config.Prefix (default "orchard:"):
//
//	sandbox:<id>    sandbox record, JSON, no expiry (the server's cleanup owns a sandbox's lifetime)
//	sandboxes       SET of sandbox ids ("all" is an ordinary id: no key collides with a record)
//	job:<id>        job, JSON; no expiry while queued or running, 24 h once terminal (refreshed on update)
//	jobs            SET of job ids; members whose job expired are pruned when listed
//	lock:<name>     held lock: "<token>:<nonce>", expiring with its lease
//	fence           the fencing token counter, one for all lock names
//	leader:<name>   leader lease: the holder's id, expiring with its lease
//	event:<topic>   pub/sub channel of a Subscribe topic
//	doc:<kind>:<id>, docs:<kind>  documents of other packages (episodes); see docs.go
//	site:<host>, sites            site-health breaker state; see sitehealth.go
//
// Every Redis failure (dial, timeout, reset, EOF, a server that is loading
// or read-only) is a platform.store_unavailable fault: category
// unavailable, retryable, HTTP 503. Calls fail within about two seconds
// when Redis is down and work again as soon as it is back, without a new
// Store.
package redis

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/failpoint"
	"github.com/orchard/orchard/retry"
	"github.com/orchard/orchard/store"
)

const (
	// DefaultPrefix namespaces every key and channel.
	DefaultPrefix = "orchard:"

	// ioTimeout bounds one network step (dial, read, write, waiting for a
	// pooled connection): Redis answers in well under a millisecond, so a
	// second means it is gone, and the caller hears so quickly.
	ioTimeout = time.Second

	// jobTTL is how long a finished job stays readable (Orchard's 24 h).
	jobTTL = 24 * time.Hour

	// maxTxAttempts bounds optimistic-transaction retries of one update.
	// Each retry means another writer won, so even 50 writers racing on
	// one record finish well inside it.
	maxTxAttempts = 200

	// mgetBatch bounds the keys fetched by one MGET when listing.
	mgetBatch = 500
)

// Config configures a Store.
type Config struct {
	// URL is redis://[user:password@]host:port[/db] or rediss:// for TLS.
	// Query parameters of go-redis's ParseURL (dial_timeout, ...) are
	// honoured; unset timeouts default to one second.
	URL string
	// Prefix is prepended to every key and channel; DefaultPrefix if empty.
	Prefix string
	// Logger receives connection loss and recovery of the event
	// subscriber; slog.Default() if nil.
	Logger *slog.Logger
	// CAFile is a PEM bundle of CA certificates trusted for a rediss://
	// URL in addition to the system roots, for a Redis whose certificate a
	// private CA issued. Setting it with a redis:// URL is a
	// misconfiguration: TLS would silently not be used.
	CAFile string
}

// Store is a store.Store backed by Redis. It is safe for concurrent use;
// Close releases its connections.
type Store struct {
	rdb    *goredis.Client
	prefix string
	log    *slog.Logger
	sub    *subscriber
	recent recentValues // last written values of records, for casUpdate
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Locker  = (*Store)(nil)
	_ store.Fenced  = (*Store)(nil)
	_ store.Elector = (*Store)(nil)
)

// New connects to Redis, checks it answers, and starts the shared event
// subscriber. An invalid URL or CA file is platform.misconfigured; an
// unreachable Redis, or one whose TLS certificate does not verify, is
// platform.store_unavailable.
func New(ctx context.Context, cfg Config) (*Store, error) {
	opt, err := goredis.ParseURL(cfg.URL)
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeMisconfigured, faults.Internal, faults.Platform,
			"invalid Redis URL").WithRetryable(false)
	}
	for _, d := range []*time.Duration{&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout} {
		if *d == 0 {
			*d = ioTimeout
		}
	}
	// One retry covers the first command on a pooled connection that a
	// Redis restart closed; more would only delay the answer in an outage.
	if opt.MaxRetries == 0 {
		opt.MaxRetries = 1
	}
	opt.DialerRetries = 1
	if cfg.CAFile != "" {
		if err := trustCAFile(opt, cfg.CAFile); err != nil {
			return nil, faults.Wrap(err, faults.CodeMisconfigured, faults.Internal, faults.Platform,
				"invalid Redis CA certificate configuration").WithRetryable(false)
		}
	}
	opt.ContextTimeoutEnabled = true
	// Maintenance notifications are for managed clusters that move
	// endpoints; a plain Redis rejects them and they add a goroutine.
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{rdb: goredis.NewClient(opt), prefix: cfg.Prefix, log: cfg.Logger}
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		_ = s.rdb.Close()
		return nil, s.fail(ctx, fmt.Errorf("connect to %s: %w", opt.Addr, err))
	}
	s.sub = newSubscriber(s)
	return s, nil
}

// trustCAFile adds the certificates of the PEM file at path to the roots
// that verify the server of a TLS connection.
func trustCAFile(opt *goredis.Options, path string) error {
	if opt.TLSConfig == nil {
		return errors.New("a Redis CA file is set but the URL is not rediss://")
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read Redis CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("no PEM certificate in Redis CA file %s", path)
	}
	opt.TLSConfig.RootCAs = pool
	return nil
}

// Close stops the event subscriber and closes every connection. Calls after
// Close fail with store_unavailable.
func (s *Store) Close() error {
	s.sub.close()
	return s.rdb.Close()
}

// Ping reports whether Redis answers, for readiness checks.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return s.fail(ctx, err)
	}
	return nil
}

// RouteClientLogs sends go-redis's own log lines (each failed dial while
// Redis is down, ...) to l at debug level instead of the standard logger.
// go-redis has one logger per process, so this affects every client in it:
// call it once, from main.
func RouteClientLogs(l *slog.Logger) { goredis.SetLogger(clientLogger{l}) }

type clientLogger struct{ l *slog.Logger }

func (c clientLogger) Printf(ctx context.Context, format string, v ...any) {
	c.l.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}

func (s *Store) sandboxKey(id string) string { return s.prefix + "sandbox:" + id }
func (s *Store) sandboxesKey() string        { return s.prefix + "sandboxes" }
func (s *Store) jobKey(id string) string     { return s.prefix + "job:" + id }
func (s *Store) jobsKey() string             { return s.prefix + "jobs" }
func (s *Store) lockKey(name string) string  { return s.prefix + "lock:" + name }
func (s *Store) fenceKey() string            { return s.prefix + "fence" }
func (s *Store) leaderKey(name string) string {
	return s.prefix + "leader:" + name
}
func (s *Store) channel(topic string) string { return s.prefix + "event:" + topic }

// fail classifies an error of a Redis call. The caller's own cancellation or
// deadline stays what it is; a reply that means our own request was wrong
// (a script or type error) is internal; anything else means Redis cannot
// serve us now.
func (s *Store) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	var re goredis.Error
	if errors.As(err, &re) && !errors.Is(err, goredis.ErrClosed) {
		msg := re.Error()
		if strings.HasPrefix(msg, "ERR ") || strings.HasPrefix(msg, "WRONGTYPE") {
			return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform, "internal error")
		}
	}
	return faults.Wrap(err, faults.CodeStoreUnavailable, faults.Unavailable, faults.Platform,
		"state store unavailable, please retry")
}

// abortError carries an error of the caller's update function, or of our
// own checks, out of a transaction unchanged.
type abortError struct{ err error }

func (e abortError) Error() string { return e.err.Error() }

// update runs body in an optimistic transaction over keys, retrying while
// another writer changes them first. body wraps its own errors in
// abortError; every other error is Redis's.
func (s *Store) update(ctx context.Context, body func(tx *goredis.Tx) error, keys ...string) error {
	if err := failpoint.Eval("store.redis.write"); err != nil {
		return err
	}
	for attempt := range maxTxAttempts {
		err := s.rdb.Watch(ctx, body, keys...)
		var ab abortError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ab):
			return ab.err
		case !errors.Is(err, goredis.TxFailedErr):
			return s.fail(ctx, err)
		}
		if err := raceBackoff(ctx, attempt); err != nil {
			return err
		}
	}
	return errBusy(keys[len(keys)-1])
}

// raceBackoff waits before retrying an update that another writer won
// after attempt (counted from 0) lost: jittered and growing a little, so
// racing writers spread out.
func raceBackoff(ctx context.Context, attempt int) error {
	return retry.Sleep(ctx, txRace.Delay(attempt))
}

// txRace spaces the attempts of an optimistic update: a race lost to
// another writer is over within the time of one round trip, so the waits
// stay within a few milliseconds; maxTxAttempts bounds them.
var txRace = retry.Policy{Initial: time.Millisecond, Max: 11 * time.Millisecond}

// errBusy is the answer to an update of key that lost every race.
func errBusy(key string) error {
	return faults.Newf(faults.CodeStoreUnavailable, faults.Unavailable, faults.Platform,
		"state store busy: %d concurrent updates of %s, please retry", maxTxAttempts, key)
}

// CreateSandbox implements store.Store: SET NX of the record and its index
// entry in one script, so a duplicate id never overwrites and an indexed
// id always has a record.
func (s *Store) CreateSandbox(ctx context.Context, sb store.Sandbox) error {
	b, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	created, err := createScript.Run(ctx, s.rdb, []string{s.sandboxKey(sb.ID), s.sandboxesKey()}, b, sb.ID).Int()
	if err != nil {
		return s.fail(ctx, err)
	}
	if created == 0 {
		return store.ErrSandboxExists(sb.ID)
	}
	s.recent.put(s.sandboxKey(sb.ID), b)
	return nil
}

var createScript = goredis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('SADD', KEYS[2], ARGV[2])
  return 1
end
return 0`)

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	b, err := s.rdb.Get(ctx, s.sandboxKey(id)).Bytes()
	if errors.Is(err, goredis.Nil) {
		return store.Sandbox{}, store.ErrSandboxNotFound(id)
	}
	if err != nil {
		return store.Sandbox{}, s.fail(ctx, err)
	}
	sb, err := decodeSandbox(b)
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("decode sandbox %s: %w", id, err)
	}
	return sb, nil
}

// decodeSandbox reads a stored record. Labels and Env come back as empty
// maps rather than nil (JSON omits empty ones), so an update function can
// write into them as it could into a record it had created with empty maps.
func decodeSandbox(b []byte) (store.Sandbox, error) {
	var sb store.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		return sb, err
	}
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	if sb.Env == nil {
		sb.Env = map[string]string{}
	}
	return sb, nil
}

// UpdateSandbox implements store.Store with a compare-and-set (casUpdate):
// fn may run more than once when another replica writes the record
// concurrently, each time on a fresh copy, and only its last result is
// stored.
func (s *Store) UpdateSandbox(ctx context.Context, id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
	return s.updateSandbox(ctx, nil, id, fn)
}

// UpdateSandboxFenced implements store.Fenced.
func (s *Store) UpdateSandboxFenced(ctx context.Context, l store.Lease, id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
	rl, err := s.ownLease(l)
	if err != nil {
		return store.Sandbox{}, err
	}
	return s.updateSandbox(ctx, rl, id, fn)
}

func (s *Store) updateSandbox(ctx context.Context, l *lease, id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
	var out store.Sandbox
	err := s.casUpdate(ctx, l, s.sandboxKey(id), func() error { return store.ErrSandboxNotFound(id) },
		func(old []byte) ([]byte, time.Duration, error) {
			sb, err := decodeSandbox(old)
			if err != nil {
				return nil, 0, fmt.Errorf("decode sandbox %s: %w", id, err)
			}
			if err := fn(&sb); err != nil {
				return nil, 0, err
			}
			sb.ID = id
			out = sb
			b, err := json.Marshal(sb)
			return b, 0, err
		})
	if err != nil {
		return store.Sandbox{}, err
	}
	return out, nil
}

// DeleteSandbox implements store.Store.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	s.recent.forget(s.sandboxKey(id))
	_, err := s.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Del(ctx, s.sandboxKey(id))
		p.SRem(ctx, s.sandboxesKey(), id)
		return nil
	})
	if err != nil {
		return s.fail(ctx, err)
	}
	return nil
}

// ListSandboxes implements store.Store; records come sorted by creation
// time, then id, as from the memory store.
func (s *Store) ListSandboxes(ctx context.Context) ([]store.Sandbox, error) {
	out, err := listAll(ctx, s, s.sandboxesKey(), s.sandboxKey, decodeSandbox)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAt != out[j].CreatedAt {
			return out[i].CreatedAt < out[j].CreatedAt
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// listAll loads every member of the index set and drops from the index the
// members whose record is gone (an expired job).
func listAll[T any](ctx context.Context, s *Store, index string, key func(string) string, decode func([]byte) (T, error)) ([]T, error) {
	ids, err := s.rdb.SMembers(ctx, index).Result()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	sort.Strings(ids)
	out := make([]T, 0, len(ids))
	var stale, staleKeys []string
	for len(ids) > 0 {
		batch := ids[:min(len(ids), mgetBatch)]
		ids = ids[len(batch):]
		keys := make([]string, len(batch))
		for i, id := range batch {
			keys[i] = key(id)
		}
		vals, err := s.rdb.MGet(ctx, keys...).Result()
		if err != nil {
			return nil, s.fail(ctx, err)
		}
		for i, v := range vals {
			str, ok := v.(string)
			if !ok {
				stale, staleKeys = append(stale, batch[i]), append(staleKeys, keys[i])
				continue
			}
			rec, err := decode([]byte(str))
			if err != nil {
				return nil, fmt.Errorf("decode %s: %w", keys[i], err)
			}
			out = append(out, rec)
		}
	}
	if len(stale) > 0 {
		// Best effort: a member pruned twice is harmless, one left is pruned
		// next time. Only members whose record is still missing: one
		// deleted and created again since the MGET must stay indexed.
		args := make([]any, len(stale))
		for i, id := range stale {
			args[i] = id
		}
		_ = pruneScript.Run(ctx, s.rdb, append([]string{index}, staleKeys...), args...).Err()
	}
	return out, nil
}

// pruneScript removes ARGV[i] from the set KEYS[1] if its record KEYS[i+1]
// does not exist.
var pruneScript = goredis.NewScript(`
for i, id in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    redis.call('SREM', KEYS[1], id)
  end
end
return 0`)

// jobExpiry is the TTL a job is stored with: none while it may still run,
// so a long command's job cannot vanish under it.
func jobExpiry(j *api.Job) time.Duration {
	if j.Terminal() {
		return jobTTL
	}
	return 0
}

// CreateJob implements store.Store; an existing job with the id is replaced.
func (s *Store) CreateJob(ctx context.Context, j api.Job) error {
	b, err := json.Marshal(j)
	if err != nil {
		return err
	}
	_, err = s.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Set(ctx, s.jobKey(j.JobID), b, jobExpiry(&j))
		p.SAdd(ctx, s.jobsKey(), j.JobID)
		return nil
	})
	if err != nil {
		return s.fail(ctx, err)
	}
	s.recent.put(s.jobKey(j.JobID), b)
	return nil
}

// GetJob implements store.Store.
func (s *Store) GetJob(ctx context.Context, id string) (api.Job, error) {
	b, err := s.rdb.Get(ctx, s.jobKey(id)).Bytes()
	if errors.Is(err, goredis.Nil) {
		return api.Job{}, store.ErrJobNotFound(id)
	}
	if err != nil {
		return api.Job{}, s.fail(ctx, err)
	}
	var j api.Job
	if err := json.Unmarshal(b, &j); err != nil {
		return api.Job{}, fmt.Errorf("decode job %s: %w", id, err)
	}
	return j, nil
}

// UpdateJob implements store.Store like UpdateSandbox (fn may run more than
// once). A job that becomes terminal gets its 24 h expiry, refreshed by
// every later update; a job that is not terminal has none.
func (s *Store) UpdateJob(ctx context.Context, id string, fn func(*api.Job) error) (api.Job, error) {
	return s.updateJob(ctx, nil, id, fn)
}

// UpdateJobFenced implements store.Fenced.
func (s *Store) UpdateJobFenced(ctx context.Context, l store.Lease, id string, fn func(*api.Job) error) (api.Job, error) {
	rl, err := s.ownLease(l)
	if err != nil {
		return api.Job{}, err
	}
	return s.updateJob(ctx, rl, id, fn)
}

func (s *Store) updateJob(ctx context.Context, l *lease, id string, fn func(*api.Job) error) (api.Job, error) {
	var out api.Job
	err := s.casUpdate(ctx, l, s.jobKey(id), func() error { return store.ErrJobNotFound(id) },
		func(old []byte) ([]byte, time.Duration, error) {
			var j api.Job
			if err := json.Unmarshal(old, &j); err != nil {
				return nil, 0, fmt.Errorf("decode job %s: %w", id, err)
			}
			if err := fn(&j); err != nil {
				return nil, 0, err
			}
			j.JobID = id
			out = j
			b, err := json.Marshal(j)
			return b, jobExpiry(&j), err
		})
	if err != nil {
		return api.Job{}, err
	}
	return out, nil
}

// DeleteJob implements store.Store.
func (s *Store) DeleteJob(ctx context.Context, id string) error {
	s.recent.forget(s.jobKey(id))
	_, err := s.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Del(ctx, s.jobKey(id))
		p.SRem(ctx, s.jobsKey(), id)
		return nil
	})
	if err != nil {
		return s.fail(ctx, err)
	}
	return nil
}

// ListJobs implements store.Store, in job id order.
func (s *Store) ListJobs(ctx context.Context) ([]api.Job, error) {
	return listAll(ctx, s, s.jobsKey(), s.jobKey, func(b []byte) (api.Job, error) {
		var j api.Job
		err := json.Unmarshal(b, &j)
		return j, err
	})
}

// Publish implements store.Store over Redis pub/sub: every replica's
// subscribers of topic are woken.
func (s *Store) Publish(ctx context.Context, topic string) error {
	if err := s.rdb.Publish(ctx, s.channel(topic), "1").Err(); err != nil {
		return s.fail(ctx, err)
	}
	return nil
}

// Subscribe implements store.Store. The subscription is active on the
// Redis server when Subscribe returns, so a Publish made after that, by any
// replica, is delivered. All subscriptions of a Store share one connection.
// After that connection is lost and re-established every subscriber gets a
// value, since events published meanwhile were lost: a waiter re-checks
// the state it waits for.
func (s *Store) Subscribe(ctx context.Context, topic string) (<-chan struct{}, func(), error) {
	return s.sub.subscribe(ctx, s.channel(topic))
}
