package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// Install copies the running binary, executable, creating the folder; a
// second install replaces the first.
func TestInstall(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "bin", "orchard-agent")
	for range 2 {
		if err := Install(dst); err != nil {
			t.Fatal(err)
		}
	}
	self, _ := os.Executable()
	want, _ := os.ReadFile(self)
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("installed copy differs from the binary (%d bytes, want %d): %v", len(got), len(want), err)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), ".orchard-agent-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// A network listener is refused without a token: it would serve anyone
// who reaches the sandbox.
func TestMainListenNeedsToken(t *testing.T) {
	err := Main(t.Context(), []string{"--listen", "127.0.0.1:0"}, func(string) string { return "" })
	if err == nil || err.Error() != "--listen needs --token-sha256" {
		t.Fatalf("Main = %v", err)
	}
	err = Main(t.Context(), []string{"--listen", "127.0.0.1:0", "--token-sha256", "abcd"}, func(string) string { return "" })
	if err == nil {
		t.Fatal("a short hash was accepted")
	}
}
