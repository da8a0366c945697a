package redis

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/orchard/orchard/sitehealth"
)

// SiteHealth is the sitehealth.Backend of a Store: every replica using the
// same Redis and prefix shares each host's breaker and rate limit. Keys,
// under the Store's prefix:
//
//	site:<host>  the host's record (JSON, owned by sitehealth), expiring when idle
//	sites        ZSET of hosts scored by when their record expires (Unix ms), for List
//
// Updates are optimistic transactions (WATCH/MULTI) on the host's key, so
// the breaker's logic stays in Go, once, and Redis only stores it.
type SiteHealth struct{ s *Store }

var _ sitehealth.Backend = (*SiteHealth)(nil)

// SiteHealth returns the store's sitehealth.Backend.
func (s *Store) SiteHealth() *SiteHealth { return &SiteHealth{s: s} }

func (h *SiteHealth) key(host string) string { return h.s.prefix + "site:" + host }
func (h *SiteHealth) index() string          { return h.s.prefix + "sites" }

// Update implements sitehealth.Backend. fn runs again each time another
// writer changes the record first. Redis failures are
// platform.store_unavailable; an error of fn is returned unchanged.
func (h *SiteHealth) Update(ctx context.Context, host string, ttl time.Duration, fn func(rec []byte) ([]byte, error)) error {
	key, index := h.key(host), h.index()
	body := func(tx *goredis.Tx) error {
		old, err := tx.Get(ctx, key).Bytes()
		if errors.Is(err, goredis.Nil) {
			old, err = nil, nil
		}
		if err != nil {
			return err
		}
		b, err := fn(old)
		if err != nil {
			return abortError{err}
		}
		// The index is not watched: adding a member and pruning expired
		// ones commute with any other writer's.
		now := time.Now()
		expires := math.Inf(1)
		if ttl > 0 {
			expires = float64(now.Add(ttl).UnixMilli())
		}
		_, err = tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			p.Set(ctx, key, b, max(ttl, 0))
			p.ZAdd(ctx, index, goredis.Z{Score: expires, Member: host})
			p.ZRemRangeByScore(ctx, index, "-inf", "("+strconv.FormatInt(now.UnixMilli(), 10))
			if ttl > 0 {
				// Refreshed by every write, so the index outlives the
				// records it lists (all written with the Tracker's one
				// TTL) and leaves with the last of them.
				p.PExpire(ctx, index, ttl)
			} else {
				p.Persist(ctx, index)
			}
			return nil
		})
		return err
	}
	return h.s.update(ctx, body, key)
}

// List implements sitehealth.Backend.
func (h *SiteHealth) List(ctx context.Context) (map[string][]byte, error) {
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	hosts, err := h.s.rdb.ZRangeByScore(ctx, h.index(), &goredis.ZRangeBy{Min: now, Max: "+inf"}).Result()
	if err != nil {
		return nil, h.s.fail(ctx, err)
	}
	out := make(map[string][]byte, len(hosts))
	for len(hosts) > 0 {
		batch := hosts[:min(len(hosts), mgetBatch)]
		hosts = hosts[len(batch):]
		keys := make([]string, len(batch))
		for i, host := range batch {
			keys[i] = h.key(host)
		}
		vals, err := h.s.rdb.MGet(ctx, keys...).Result()
		if err != nil {
			return nil, h.s.fail(ctx, err)
		}
		for i, v := range vals {
			if str, ok := v.(string); ok { // nil: expired since the index was read
				out[batch[i]] = []byte(str)
			}
		}
	}
	return out, nil
}
