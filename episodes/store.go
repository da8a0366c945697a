package episodes

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/store"
)

// Persistence defaults, each with its reason.
const (
	// keep is how long an episode stays readable after its last call (or,
	// while running, after its deadline).
	keep = 24 * time.Hour
	// lockTTL bounds how long a replica that died mid-call blocks the
	// episode's next call; the holder refreshes it every third.
	lockTTL = 15 * time.Second
)

// Kinds of the episode documents in the store.
const (
	episodeDoc = "episode"
	screensDoc = "episode-screens" // apart, so listing episodes does not read images
	lockPrefix = "episode:"
)

// Store keeps episodes in a store.Docs under store.Locker locks. Episode
// state lives there, not in this process: each call takes the episode's
// lock (a Redis lease when replicas share Redis), loads the state, works
// and writes it back fenced by the lease, so any replica serves any call
// and a replica that lost the lock mid-step cannot overwrite its
// successor's state.
type Store struct {
	docs   store.Docs
	locker store.Locker
}

// ErrNoStore is returned by NewStore when the store given cannot keep
// episodes: there is no in-process fallback, which would split the
// episodes of several replicas without a word.
var ErrNoStore = errors.New("episodes: the store keeps no documents or locks")

// NewStore keeps episodes in st, which must hold documents (store.Docs)
// and locks (store.Locker); the memory and Redis stores do.
func NewStore(st store.Store) (*Store, error) {
	d, okD := st.(store.Docs)
	l, okL := st.(store.Locker)
	if st == nil || !okD || !okL {
		return nil, ErrNoStore
	}
	return &Store{docs: d, locker: l}, nil
}

// Docs is the document store the episodes live in, for the documents
// that go with them (task suites).
func (s *Store) Docs() store.Docs { return s.docs }

// ErrNotFound is the fault of a call on an unknown (or expired) episode.
func ErrNotFound(id string) error {
	return faults.Newf(faults.CodeEpisodeNotFound, faults.NotFound, faults.Client, "Episode %s not found", id)
}

// Lock takes the episode's lock for one call. The returned context ends
// when the lease is lost, so the call stops and its fenced save fails.
func (s *Store) Lock(ctx context.Context, id string) (context.Context, store.Lease, func(), error) {
	ctx, cancel := context.WithCancelCause(ctx)
	lease, release, err := store.Hold(ctx, s.locker, lockPrefix+id, lockTTL, cancel)
	if err != nil {
		cancel(nil)
		return nil, nil, nil, err
	}
	return ctx, lease, func() { release(); cancel(nil) }, nil
}

// Load reads the episode id, and its screenshots when withScreens. It
// takes no lock: the stored state is always a whole one.
func (s *Store) Load(ctx context.Context, id string, withScreens bool) (*Episode, error) {
	b, ok, err := s.docs.GetDoc(ctx, episodeDoc, id)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrNotFound(id)
	}
	var ep Episode
	if err := json.Unmarshal(b, &ep); err != nil {
		return nil, faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform, "decode episode "+id)
	}
	if withScreens {
		b, ok, err := s.docs.GetDoc(ctx, screensDoc, id)
		if err != nil {
			return nil, err
		}
		if ok {
			_ = json.Unmarshal(b, &ep.screens)
		}
	}
	return &ep, nil
}

// Acquire locks the episode id and loads it; release unlocks.
func (s *Store) Acquire(ctx context.Context, id string, withScreens bool) (context.Context, *Episode, store.Lease, func(), error) {
	ctx, lease, release, err := s.Lock(ctx, id)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ep, err := s.Load(ctx, id, withScreens)
	if err != nil {
		release()
		return nil, nil, nil, nil, err
	}
	return ctx, ep, lease, release, nil
}

// Save writes ep, fenced by lease.
func (s *Store) Save(ctx context.Context, lease store.Lease, ep *Episode) error {
	ttl := keep
	if !ep.Ended() {
		ttl += max(time.Until(ep.Deadline), 0)
	}
	if ep.screensDirty {
		b, err := json.Marshal(ep.screens)
		if err != nil {
			return err
		}
		if err := s.docs.PutDocFenced(ctx, lease, screensDoc, ep.EpisodeID, b, ttl); err != nil {
			return err
		}
		ep.screensDirty = false
	}
	b, err := json.Marshal(ep)
	if err != nil {
		return err
	}
	return s.docs.PutDocFenced(ctx, lease, episodeDoc, ep.EpisodeID, b, ttl)
}

// List returns every stored episode, newest first. One that does not
// decode is left out.
func (s *Store) List(ctx context.Context) ([]api.EpisodeSummary, error) {
	docs, err := s.docs.ListDocs(ctx, episodeDoc)
	if err != nil {
		return nil, err
	}
	list := make([]api.EpisodeSummary, 0, len(docs))
	for _, b := range docs {
		var v api.EpisodeStatus
		if json.Unmarshal(b, &v) == nil {
			list = append(list, api.EpisodeSummary{EpisodeID: v.EpisodeID, TaskID: v.TaskID, SandboxID: v.SandboxID, Kind: v.Kind,
				Status: v.Status, Steps: v.Steps, Outcome: v.Outcome, CreatedAt: v.CreatedAt})
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].CreatedAt.After(list[j].CreatedAt) })
	return list, nil
}

// Delete removes the episode id and its screenshots: a fork that could
// not make all its branches takes back those it made.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := s.docs.DeleteDoc(ctx, screensDoc, id); err != nil {
		return err
	}
	return s.docs.DeleteDoc(ctx, episodeDoc, id)
}
