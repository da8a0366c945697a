package manager_test

import (
	"context"
	"strings"
	"testing"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store/memory"
	"github.com/orchard/orchard/store/redis"
)

// Replicas on one host, on one Redis: a second one given another state
// directory is refused at start, naming both directories; one given the
// same directory, or on another host, starts; a memory store has no peers
// to check.
func TestClaimHost(t *testing.T) {
	rs := testenv.StartRedis(t)
	ctx := context.Background()
	replica := func(id, host string) *manager.Manager {
		st, err := redis.New(ctx, redis.Config{URL: rs.URL(), Prefix: "hosts:"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return manager.New(manager.Config{ReplicaID: id, HostID: host}, nil, st, nil, nil)
	}
	if err := replica("a", "h1").ClaimHost(ctx, "/srv/orchard/runtime"); err != nil {
		t.Fatalf("first replica: %v", err)
	}
	err := replica("b", "h1").ClaimHost(ctx, "/tmp/other/runtime")
	if !faults.Is(err, faults.CodeMisconfigured) {
		t.Fatalf("second replica with another state directory = %v; want %s", err, faults.CodeMisconfigured)
	}
	for _, want := range []string{"/srv/orchard/runtime", "/tmp/other/runtime"} {
		if !strings.Contains(faults.Of(err).Message, want) {
			t.Errorf("the refusal does not name %s: %s", want, faults.Of(err).Message)
		}
	}
	if err := replica("c", "h1").ClaimHost(ctx, "/srv/orchard/runtime"); err != nil {
		t.Errorf("a replica with the same state directory: %v", err)
	}
	if err := replica("d", "h2").ClaimHost(ctx, "/tmp/other/runtime"); err != nil {
		t.Errorf("a replica on another host: %v", err)
	}
	if err := manager.New(manager.Config{ReplicaID: "e", HostID: "h1"}, nil, memory.New(), nil, nil).ClaimHost(ctx, "/x"); err != nil {
		t.Errorf("a memory store: %v", err)
	}
}
