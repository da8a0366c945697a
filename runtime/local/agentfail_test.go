package local

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/orchard/orchard/runtime"
)

// An agent that exits at once (a bad flag, a wrong binary) fails the create
// with a classified error and leaves nothing behind.
func TestAgentExitingAtStartLeavesNothing(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho 'flag provided but not defined' >&2\nexit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	l := newLocal(t, func(c *Config) { c.AgentPath = bad })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := l.Create(ctx, runtime.Spec{ID: "dies", Kind: "shell", Image: ImageHost, MemoryBytes: 128 << 20})
	if err == nil {
		t.Fatal("create with an agent that exits succeeded")
	}
	checkGone(t, l, "dies")
}
