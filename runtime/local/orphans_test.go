package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/runtime"
)

// A server killed and its state directory removed leaves sandboxes no
// server can reach. The host-wide look finds them by cgroup and agent,
// names their origin, and removes only them: never a live server's
// sandbox, nor one a server started on its state directory would
// re-attach.
func TestHostSandboxesFindsAndRemovesOrphans(t *testing.T) {
	parent := "orchard-test-orphans"
	own := func(c *Config) { c.CgroupParent = parent }
	t.Cleanup(func() {
		for _, p := range cgroupDirs("/" + parent) {
			_ = os.Remove(p) // the parent, once empty
		}
	})
	wiped, live, idle := newLocal(t, own), newLocal(t, own), newLocal(t, own)
	create(t, wiped, runtime.Spec{ID: "orph-a", Image: "host"})
	orphanPID := wiped.initPID(t, "orph-a")
	create(t, live, runtime.Spec{ID: "live-b", Image: "host"})
	create(t, idle, runtime.Spec{ID: "idle-c", Image: "host"})
	idlePID := idle.initPID(t, "idle-c")

	// The server of "wiped" is killed and its directory removed; "idle"'s
	// server stops, its directory intact.
	wipedDir := wiped.cfg.StateDir
	for _, l := range []*Local{wiped, idle} {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(mountsUnder(wipedDir+"/")), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			_ = unix.Unmount(f[4], unix.MNT_DETACH)
		}
	}
	if err := os.RemoveAll(wipedDir); err != nil {
		t.Fatal(err)
	}

	found, err := HostSandboxes(parent, 0)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]HostSandbox{}
	for _, s := range found {
		byID[s.ID] = s
	}
	cases := []struct {
		id, origin, owner, orphan string
	}{
		{"orph-a", wipedDir, "", "state directory is gone"},
		{"live-b", live.cfg.StateDir, "live server", ""},
		{"idle-c", idle.cfg.StateDir, "re-attaches", ""},
	}
	for _, tc := range cases {
		s, ok := byID[tc.id]
		switch {
		case !ok:
			t.Errorf("%s not found among %+v", tc.id, found)
			continue
		case s.StateDir != tc.origin:
			t.Errorf("%s: origin %q; want %q", tc.id, s.StateDir, tc.origin)
		case s.Orphaned() != (tc.orphan != ""):
			t.Errorf("%s: orphaned = %v (%+v)", tc.id, s.Orphaned(), s)
		case !strings.Contains(s.Owner, tc.owner) || !strings.Contains(s.Orphan, tc.orphan):
			t.Errorf("%s: owner %q, orphan %q; want %q, %q", tc.id, s.Owner, s.Orphan, tc.owner, tc.orphan)
		}
		if s.PID == 0 || time.Since(s.Started) > time.Hour || time.Since(s.Started) < 0 {
			t.Errorf("%s: pid %d, started %v", tc.id, s.PID, s.Started)
		}
	}

	// A grace longer than their age keeps every one of them.
	if n := live.ReapOrphans(context.Background(), time.Hour); n != 0 {
		t.Errorf("ReapOrphans within the grace period removed %d", n)
	}
	if n := live.ReapOrphans(context.Background(), 0); n != 1 {
		t.Errorf("ReapOrphans removed %d; want 1", n)
	}
	var ws unix.WaitStatus
	if got, err := unix.Wait4(orphanPID, &ws, 0, nil); got != orphanPID || ws.Signal() != unix.SIGKILL {
		t.Errorf("orphan's agent not killed (wait4: %d, %v, %v)", got, err, ws)
	}
	for _, p := range cgroupDirs("/" + parent + "/orph-a") {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("orphan's cgroup %s left", p)
		}
	}
	if out, code := live.execForTest(t, "live-b", "/bin/true"); code != 0 {
		t.Errorf("the live server's sandbox stopped: %d %s", code, out)
	}
	if unix.Kill(idlePID, 0) != nil {
		t.Error("the stopped server's recorded sandbox was killed")
	}
	if after, _ := HostSandboxes(parent, 0); len(after) != 2 {
		t.Errorf("after the reap: %+v", after)
	}

	// The idle sandbox goes as a server on its directory deletes it.
	again, err := New(idle.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := again.Delete(context.Background(), "idle-c"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(idle.cfg.StateDir, "sandboxes", "idle-c")); err == nil {
		t.Error("idle-c's state left")
	}
}
