package local

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/runtime/runtimetest"
)

// requireDisks skips (or fails under ORCHARD_TEST_REQUIRE=all) where
// writable layers cannot be on disk.
func requireDisks(t *testing.T, l *Local) {
	t.Helper()
	if !l.onDisk {
		t.Fatalf("writable layers are in memory on this host: %v", l.disks.usable())
	}
}

// A sandbox that writes more than its ephemeral storage gets ENOSPC in the
// writer, not an OOM kill of the sandbox: the layer is on disk, and the
// sandbox, its agent and later execs carry on.
func TestWritableLayerFullIsENOSPC(t *testing.T) {
	l := newLocal(t)
	requireDisks(t, l)
	const limit = 64 << 20
	inst := create(t, l, runtime.Spec{ID: "full", MemoryBytes: 256 << 20, EphemeralStorageBytes: limit})
	pid := l.initPID(t, "full")

	out, code := l.execForTest(t, "full", "sh", "-c", "head -c 1G /dev/zero > /workspace/big")
	if code == 0 || !strings.Contains(out, "No space left on device") {
		t.Fatalf("writing 1 GiB with a 64 MiB limit: exit %d, want a failure with ENOSPC:\n%s", code, out)
	}
	if n, err := l.OOMKills("full"); err != nil || n != 0 {
		t.Errorf("OOMKills = %d, %v; want 0", n, err)
	}
	if got, err := l.Inspect(context.Background(), "full"); err != nil || !got.Alive {
		t.Fatalf("sandbox after ENOSPC: %+v, %v; want alive", got, err)
	}
	if got := l.initPID(t, "full"); got != pid {
		t.Errorf("agent pid %d, was %d: the agent was restarted", got, pid)
	}
	if _, err := runtimetest.Health(context.Background(), inst.AgentAddr); err != nil {
		t.Errorf("agent after ENOSPC: %v", err)
	}
	// df shows the limit; space freed is writable again.
	out, code = l.execForTest(t, "full", "sh", "-c", "df -B1 --output=size / /workspace | tail -n +2; rm /workspace/big && head -c 8M /dev/zero > /workspace/again && echo rewritten")
	if f := strings.Fields(out); code != 0 || len(f) != 3 || f[0] != strconv.Itoa(limit) || f[1] != strconv.Itoa(limit) || f[2] != "rewritten" {
		t.Errorf("df and rewrite after ENOSPC: exit %d, want sizes %d and a rewrite:\n%s", code, limit, out)
	}
}

// What a sandbox writes is not charged to its memory limit: 512 MiB fit in
// a sandbox of 256 MiB of memory, on the runtime's default limit.
func TestWritableLayerNotCountedAsMemory(t *testing.T) {
	l := newLocal(t, func(c *Config) { c.WritableBytes = 1 << 30 })
	requireDisks(t, l)
	inst := create(t, l, runtime.Spec{ID: "big", MemoryBytes: 256 << 20})
	out, code := l.execForTest(t, "big", "sh", "-c",
		"head -c 512M /dev/zero > /workspace/big && stat -c %s /workspace/big && df -B1 --output=size /workspace | tail -n +2")
	if f := strings.Fields(out); code != 0 || len(f) != 2 || f[0] != strconv.Itoa(512<<20) || f[1] != strconv.Itoa(1<<30) {
		t.Fatalf("writing 512 MiB with 256 MiB of memory and the 1 GiB default: exit %d, want a 512 MiB file on 1 GiB:\n%s", code, out)
	}
	if n, err := l.OOMKills("big"); err != nil || n != 0 {
		t.Errorf("OOMKills = %d, %v; want 0", n, err)
	}
	if _, err := runtimetest.Health(context.Background(), inst.AgentAddr); err != nil {
		t.Errorf("agent after the write: %v", err)
	}
}

// A live sandbox's disk is a file of the state directory, unlinked, on a
// loop device; Delete leaves no device, file or mount.
func TestDiskTeardownLeavesNothing(t *testing.T) {
	l := newLocal(t)
	requireDisks(t, l)
	create(t, l, runtime.Spec{ID: "disk", EphemeralStorageBytes: 32 << 20})
	if files := diskFiles(l, "disk"); len(files) != 0 {
		t.Errorf("disk files of a live sandbox: %v; want none (unlinked once mounted)", files)
	}
	loops := loopDevices(l.disks.dir)
	if len(loops) != 1 {
		t.Fatalf("loop devices of a live sandbox: %+v; want one", loops)
	}
	if id, _ := diskID(filepath.Base(loops[0].backing)); id != "disk" {
		t.Errorf("loop device on %s; want the sandbox's disk", loops[0].backing)
	}
	size, err := os.ReadFile("/sys/block/" + filepath.Base(loops[0].dev) + "/size")
	if err != nil || strings.TrimSpace(string(size)) != strconv.Itoa(32<<20/512) {
		t.Errorf("%s holds %s sectors (%v); want 32 MiB", loops[0].dev, size, err)
	}
	if err := l.Delete(context.Background(), "disk"); err != nil {
		t.Fatal(err)
	}
	checkGone(t, l, "disk")
}

// Crash recovery: a disk whose sandbox has no record (its state wiped, or
// a process killed mid-create), and a loop device still attached to one
// that will not detach itself, are removed by the next runtime on the
// state directory.
func TestStrayDisksRemoved(t *testing.T) {
	l1 := newLocal(t)
	requireDisks(t, l1)
	// A disk attached without autoclear, as an older kernel's two-step
	// attach left it.
	name := filepath.Join(l1.disks.dir, diskName("lost-a"))
	if err := os.WriteFile(name, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(name, 16<<20); err != nil {
		t.Fatal(err)
	}
	dev := attachForTest(t, name)
	if err := os.WriteFile(filepath.Join(l1.disks.dir, diskName("lost-b")), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l1.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := New(l1.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	for _, id := range []string{"lost-a", "lost-b"} {
		if f := diskFiles(l2, id); len(f) > 0 {
			t.Errorf("stray disks left: %v", f)
		}
	}
	waitLoopsGone(t, l2)
	if _, err := os.Stat("/sys/block/" + filepath.Base(dev) + "/loop"); err == nil {
		t.Errorf("%s still attached", dev)
	}
}

// attachForTest attaches file to a free loop device without autoclear and
// detaches it at the end of the test if it still is.
func attachForTest(t *testing.T, file string) string {
	t.Helper()
	f, err := attachLoop(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	info.Flags &^= unix.LO_FLAGS_AUTOCLEAR
	if err := unix.IoctlLoopSetStatus64(int(f.Fd()), info); err != nil {
		t.Fatal(err)
	}
	dev := f.Name()
	t.Cleanup(func() { _ = detachLoop(dev) })
	return dev
}

// diskFiles lists the disk files of sandbox id, as loop devices name them.
func diskFiles(l *Local, id string) []string {
	entries, _ := os.ReadDir(l.disks.dir)
	var out []string
	for _, e := range entries {
		if got, ok := diskID(e.Name()); ok && got == id {
			out = append(out, filepath.Join(l.disks.dir, e.Name()))
		}
	}
	return out
}

// waitLoopsGone waits for the loop devices of l's disks to detach: they do
// once their filesystem's last mount is gone, as the sandbox's mount
// namespace ends with its last process.
func waitLoopsGone(t testing.TB, l *Local) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		loops := loopDevices(l.disks.dir)
		if len(loops) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("loop devices left on %s: %+v", l.disks.dir, loops)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
