package local

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/runtime/runtimetest"
)

// A state directory wiped by hand while its sandboxes ran, the server
// stopped: the next runtime on that directory finds the sandboxes it can
// no longer see by their agents' sockets and removes them, processes and
// cgroups; another state directory's sandbox under the same cgroup parent
// keeps running.
func TestStraysOfAWipedStateDirectoryRemoved(t *testing.T) {
	l1 := newLocal(t)
	other := newLocal(t)
	ids := []string{"stray-a", "stray-b"}
	pids := map[string]int{}
	for _, id := range ids {
		create(t, l1, runtime.Spec{ID: id, Image: "host"})
		pids[id] = l1.initPID(t, id)
	}
	kept := create(t, other, runtime.Spec{ID: "kept", Image: "host"})
	if err := l1.Close(); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{l1.boxRoot, l1.ctrRoot} {
		entries, err := os.ReadDir(root)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}

	l2, err := New(l1.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	for _, id := range ids {
		// This process started the agents and no longer watches them, so
		// it reaps them, as the host's init does for a server that is gone.
		// New returns once their cgroups are empty: they are zombies now.
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pids[id], &ws, unix.WNOHANG, nil); got != pids[id] || ws.Signal() != unix.SIGKILL {
			t.Errorf("%s: agent pid %d not killed (wait4: %d, %v, status %v)", id, pids[id], got, err, ws)
		}
		if !processGone(pids[id]) {
			t.Errorf("%s: agent pid %d still runs", id, pids[id])
		}
		checkGone(t, l2, id)
	}
	got, err := other.Inspect(context.Background(), "kept")
	if err != nil || !got.Alive {
		t.Fatalf("the other state directory's sandbox: %+v, %v", got, err)
	}
	if _, err := runtimetest.Health(context.Background(), kept.AgentAddr); err != nil {
		t.Errorf("the other state directory's sandbox stopped answering: %v", err)
	}
	if list, err := l2.List(context.Background()); err != nil || len(list) != 0 {
		t.Errorf("List after the wipe = %+v, %v; want none", list, err)
	}
	// Their disks too: the files, and the loop devices, which detach as
	// the sandboxes' mount namespaces end.
	for _, id := range ids {
		if f := diskFiles(l2, id); len(f) > 0 {
			t.Errorf("disk files left: %v", f)
		}
	}
	waitLoopsGone(t, l2)
}
