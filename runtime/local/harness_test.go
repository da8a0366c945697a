package local

import (
	"slices"
	"testing"
)

// The harnesses' bin folders go at the end of PATH (the image's programs
// win) and into ORCHARD_HARNESS_PATH; no harnesses change nothing.
func TestHarnessEnv(t *testing.T) {
	env := []string{"HOME=/root", "PATH=/usr/bin:/bin"}
	got := withHarnessPath(slices.Clone(env), []string{"claude", "codex"})
	want := []string{"HOME=/root", "PATH=/usr/bin:/bin:/.orchard/harnesses/claude/bin:/.orchard/harnesses/codex/bin",
		"ORCHARD_HARNESS_PATH=/.orchard/harnesses/claude/bin:/.orchard/harnesses/codex/bin"}
	if !slices.Equal(got, want) {
		t.Errorf("withHarnessPath = %q, want %q", got, want)
	}
	if got := withHarnessPath(slices.Clone(env), nil); !slices.Equal(got, env) {
		t.Errorf("withHarnessPath without harnesses = %q", got)
	}
}
