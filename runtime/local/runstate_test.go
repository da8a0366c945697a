package local

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/orchard/orchard/runtime"
)

// TestStateOnTmpfs: live sandboxes' state is on a tmpfs that outlives the
// Local while sandboxes are in it or another Local uses it, and is gone
// once neither holds.
func TestStateOnTmpfs(t *testing.T) {
	l1 := newLocal(t)
	onTmpfs := func(want bool) {
		t.Helper()
		for _, d := range []string{l1.ctrRoot, l1.boxRoot} {
			if got := mounted(d) && isTmpfs(d); got != want {
				t.Errorf("%s a tmpfs mount: %v; want %v", d, got, want)
			}
		}
	}
	onTmpfs(true)
	create(t, l1, runtime.Spec{ID: "kept"})
	if !isTmpfs(l1.sandboxDir("kept")) || !isTmpfs(filepath.Join(l1.ctrRoot, "kept")) {
		t.Errorf("sandbox state not on the tmpfs")
	}
	// Closed with a live sandbox: the state stays for the next Local.
	if err := l1.Close(); err != nil {
		t.Fatal(err)
	}
	onTmpfs(true)
	l2, err := New(l1.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if inst, err := l2.Inspect(context.Background(), "kept"); err != nil || !inst.Alive {
		t.Fatalf("re-attached: %+v, %v", inst, err)
	}
	if err := l2.Delete(context.Background(), "kept"); err != nil {
		t.Fatal(err)
	}
	// Empty, but another Local still uses it.
	l3, err := New(l1.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	onTmpfs(true)
	create(t, l3, runtime.Spec{ID: "later"})
	if err := l3.Delete(context.Background(), "later"); err != nil {
		t.Fatal(err)
	}
	if err := l3.Close(); err != nil {
		t.Fatal(err)
	}
	onTmpfs(false)
}

// TestStateLeftOnDisk: a sandboxes folder that already holds something (an
// earlier version kept state on disk) is used as it is.
func TestStateLeftOnDisk(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sandboxes", "old"), 0o700); err != nil {
		t.Fatal(err)
	}
	l := newLocal(t, func(c *Config) { c.StateDir = dir })
	if mounted(l.boxRoot) {
		t.Errorf("a tmpfs hides %s, which held a sandbox", l.boxRoot)
	}
	if !mounted(l.ctrRoot) {
		t.Errorf("%s, empty, is not a tmpfs mount", l.ctrRoot)
	}
	if list, err := l.List(context.Background()); err != nil || len(list) != 1 || list[0].ID != "old" {
		t.Errorf("List = %+v, %v; want the sandbox left on disk", list, err)
	}
	if err := l.Delete(context.Background(), "old"); err != nil {
		t.Fatal(err)
	}
}
