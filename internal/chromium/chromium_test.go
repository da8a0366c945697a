package chromium

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// fakeInstall puts executables named like Chromium's binaries in a folder,
// makes it the only PATH and the only shell location, and restores both.
func fakeInstall(t *testing.T, shellAt string, onPath ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range onPath {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
	old := shellPaths
	shellPaths = nil
	if shellAt != "" {
		p := filepath.Join(t.TempDir(), shellAt)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		shellPaths = []string{p}
	}
	t.Cleanup(func() { shellPaths = old })
	return dir
}

func TestFind(t *testing.T) {
	cases := []struct {
		name     string
		shellAt  string
		onPath   []string
		engine   string
		headless bool
		want     string // base name; "" when an error is expected
		notFound bool
	}{
		{"auto headless prefers the shell", "chromium-headless-shell", []string{"chromium"}, Auto, true, "chromium-headless-shell", false},
		{"auto headless, shell on PATH", "", []string{"chromium", "chrome-headless-shell"}, Auto, true, "chrome-headless-shell", false},
		{"auto headless, no shell", "", []string{"chromium"}, Auto, true, "chromium", false},
		{"auto headed takes the browser", "chromium-headless-shell", []string{"chromium"}, Auto, false, "chromium", false},
		{"browser asked for", "chromium-headless-shell", []string{"chromium-browser"}, Browser, true, "chromium-browser", false},
		{"shell asked for", "chromium-headless-shell", []string{"chromium"}, HeadlessShell, true, "chromium-headless-shell", false},
		{"shell asked for, none", "", []string{"chromium"}, HeadlessShell, true, "", true},
		{"shell cannot be headed", "chromium-headless-shell", nil, HeadlessShell, false, "", false},
		{"nothing installed", "", nil, Auto, true, "", true},
		{"unknown engine", "", []string{"chromium"}, "firefox", true, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fakeInstall(t, c.shellAt, c.onPath...)
			got, err := Find(c.engine, c.headless)
			if c.want == "" {
				if err == nil {
					t.Fatalf("Find = %q, want an error", got)
				}
				if errors.Is(err, ErrNotFound) != c.notFound {
					t.Errorf("error %v: not-found %v, want %v", err, errors.Is(err, ErrNotFound), c.notFound)
				}
				return
			}
			if err != nil || filepath.Base(got) != c.want {
				t.Fatalf("Find = %q, %v; want %s", got, err, c.want)
			}
		})
	}
}

func TestIsHeadlessShell(t *testing.T) {
	for path, want := range map[string]bool{
		"/usr/lib/chromium/chromium-headless-shell": true,
		"/opt/chrome/chrome-headless-shell":         true,
		"/x/headless_shell":                         true,
		"/usr/bin/chromium":                         false,
		"/usr/lib/chromium/chromium":                false,
		"/headless-shell-dir/chromium":              false,
	} {
		if got := IsHeadlessShell(path); got != want {
			t.Errorf("IsHeadlessShell(%q) = %v, want %v", path, got, want)
		}
	}
}
