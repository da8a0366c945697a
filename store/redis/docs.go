package redis

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/orchard/orchard/store"
)

// Documents (store.Docs), under the Store's prefix:
//
//	doc:<kind>:<id>  the document, expiring ttl after its last write
//	docs:<kind>      ZSET of ids scored by when their document expires (Unix ms; +inf for never)
//
// The index is pruned of expired members on every write and list, so it
// lists only what a GET would still find.

var _ store.Docs = (*Store)(nil)

func (s *Store) docKey(kind, id string) string { return s.prefix + "doc:" + kind + ":" + id }
func (s *Store) docsKey(kind string) string    { return s.prefix + "docs:" + kind }

// PutDoc implements store.Docs.
func (s *Store) PutDoc(ctx context.Context, kind, id string, doc []byte, ttl time.Duration) error {
	_, err := s.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		s.putDoc(ctx, p, kind, id, doc, ttl)
		return nil
	})
	if err != nil {
		return s.fail(ctx, err)
	}
	return nil
}

func (s *Store) putDoc(ctx context.Context, p goredis.Pipeliner, kind, id string, doc []byte, ttl time.Duration) {
	now := time.Now()
	expires := math.Inf(1)
	if ttl > 0 {
		expires = float64(now.Add(ttl).UnixMilli())
	}
	p.Set(ctx, s.docKey(kind, id), doc, max(ttl, 0))
	p.ZAdd(ctx, s.docsKey(kind), goredis.Z{Score: expires, Member: id})
	p.ZRemRangeByScore(ctx, s.docsKey(kind), "-inf", "("+strconv.FormatInt(now.UnixMilli(), 10))
}

// PutDocFenced implements store.Docs: the write is a transaction that
// watches the lock, so a lease lost between the check and the write aborts it.
func (s *Store) PutDocFenced(ctx context.Context, l store.Lease, kind, id string, doc []byte, ttl time.Duration) error {
	rl, err := s.ownLease(l)
	if err != nil {
		return err
	}
	body := func(tx *goredis.Tx) error {
		if err := s.checkLease(ctx, tx, rl); err != nil {
			return err
		}
		_, err := tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			s.putDoc(ctx, p, kind, id, doc, ttl)
			return nil
		})
		return err
	}
	return s.update(ctx, body, s.watched(rl, s.docKey(kind, id))...)
}

// GetDoc implements store.Docs.
func (s *Store) GetDoc(ctx context.Context, kind, id string) ([]byte, bool, error) {
	b, err := s.rdb.Get(ctx, s.docKey(kind, id)).Bytes()
	if errors.Is(err, goredis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, s.fail(ctx, err)
	}
	return b, true, nil
}

// DeleteDoc implements store.Docs.
func (s *Store) DeleteDoc(ctx context.Context, kind, id string) error {
	_, err := s.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Del(ctx, s.docKey(kind, id))
		p.ZRem(ctx, s.docsKey(kind), id)
		return nil
	})
	if err != nil {
		return s.fail(ctx, err)
	}
	return nil
}

// ListDocs implements store.Docs.
func (s *Store) ListDocs(ctx context.Context, kind string) (map[string][]byte, error) {
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	ids, err := s.rdb.ZRangeByScore(ctx, s.docsKey(kind), &goredis.ZRangeBy{Min: now, Max: "+inf"}).Result()
	if err != nil {
		return nil, s.fail(ctx, err)
	}
	out := make(map[string][]byte, len(ids))
	for start := 0; start < len(ids); start += mgetBatch {
		batch := ids[start:min(start+mgetBatch, len(ids))]
		keys := make([]string, len(batch))
		for i, id := range batch {
			keys[i] = s.docKey(kind, id)
		}
		vals, err := s.rdb.MGet(ctx, keys...).Result()
		if err != nil {
			return nil, s.fail(ctx, err)
		}
		for i, v := range vals {
			if str, ok := v.(string); ok { // nil: expired since the range
				out[batch[i]] = []byte(str)
			}
		}
	}
	return out, nil
}
