package server_test

import (
	"errors"
	"testing"

	"github.com/orchard/orchard/episodes"
	"github.com/orchard/orchard/server"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/memory"
)

// sandboxesOnly is a store that keeps sandboxes and jobs but no documents
// or locks.
type sandboxesOnly struct{ store.Store }

// A server whose store cannot keep episodes does not start: it would
// otherwise keep them in its own memory, apart from its replicas'.
func TestNewNeedsAnEpisodeStore(t *testing.T) {
	mgr := manager.New(manager.Config{}, nil, sandboxesOnly{memory.New()}, nil, nil)
	if _, err := server.New(server.Config{}, mgr, nil); !errors.Is(err, episodes.ErrNoStore) {
		t.Fatalf("New = %v, want %v", err, episodes.ErrNoStore)
	}
	if _, err := server.New(server.Config{}, manager.New(manager.Config{}, nil, memory.New(), nil, nil), nil); err != nil {
		t.Fatalf("New with the memory store: %v", err)
	}
}
