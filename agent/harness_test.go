package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The harness folders go on PATH once, replacing PATH rather than adding
// a second entry (getenv reads the first); without ORCHARD_HARNESS_PATH
// the environment stays as it is.
func TestHarnessPath(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		path string
	}{
		{[]string{"PATH=/bin", "ORCHARD_HARNESS_PATH=/h/codex/bin"}, "/bin:/h/codex/bin"},
		{[]string{"PATH=/bin:/h/codex/bin", "ORCHARD_HARNESS_PATH=/h/codex/bin"}, "/bin:/h/codex/bin"},
		{[]string{"PATH=/bin"}, "/bin"},
	} {
		got := withHarnessPath(tc.env)
		n := 0
		for _, kv := range got {
			if len(kv) > 5 && kv[:5] == "PATH=" {
				n++
			}
		}
		if p, _ := envValue(got, "PATH"); p != tc.path || n != 1 {
			t.Errorf("withHarnessPath(%q) = %q, want one PATH=%s", tc.env, got, tc.path)
		}
	}
}

// An image without bash runs commands with its sh; one with bash, or
// with neither, keeps bash.
func TestHarnessImageShell(t *testing.T) {
	withSh, withBash, empty := t.TempDir(), t.TempDir(), t.TempDir()
	for _, f := range []string{filepath.Join(withSh, "sh"), filepath.Join(withBash, "sh"), filepath.Join(withBash, "bash")} {
		if err := os.WriteFile(f, []byte("#!/bin/true\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	login := []string{"bash", "--login", "-i", "-c", "x"}
	for _, tc := range []struct {
		dir  string
		want []string
	}{
		{withSh, []string{"sh", "-l", "-i", "-c", "x"}},
		{withBash, login},
		{empty, login},
	} {
		if got := imageShell(login, []string{"PATH=" + tc.dir}, "/"); !slices.Equal(got, tc.want) {
			t.Errorf("imageShell with PATH=%s: %q, want %q", tc.dir, got, tc.want)
		}
	}
}
