package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/runtime/runtimetest"
)

func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime {
		l := newLocal(t)
		t.Cleanup(func() {
			// The suite's CheckGone runs per sandbox; this catches the rest
			// (below the state's own tmpfs, which Close unmounts).
			if out := mountsUnder(l.boxRoot + "/"); out != "" {
				t.Errorf("mounts left under %s:\n%s", l.boxRoot, out)
			}
		})
		return &checked{Local: l}
	}, runtimetest.Options{
		Spec: func(s *runtime.Spec) { s.MemoryBytes = 256 << 20; s.CPU = 1 },
		CheckGone: func(t *testing.T, id string) {
			// Each subtest has its own Local; find it through the id.
			for _, l := range liveLocals.Load().([]*Local) {
				checkGone(t, l, id)
			}
		},
	})
}

// liveLocals lets CheckGone (which only gets an id) reach the Locals of the
// conformance run.
var liveLocals atomic.Value

func init() { liveLocals.Store([]*Local(nil)) }

// checked registers its Local for CheckGone.
type checked struct{ *Local }

func (c *checked) Create(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	ls := liveLocals.Load().([]*Local)
	if !slices.Contains(ls, c.Local) {
		liveLocals.Store(append(slices.Clone(ls), c.Local))
	}
	return c.Local.Create(ctx, spec)
}

func create(t *testing.T, l *Local, spec runtime.Spec) runtime.Instance {
	t.Helper()
	inst, err := l.Create(ctxTimeout(t, 2*time.Minute), spec)
	if err != nil {
		t.Fatalf("Create %s: %v", spec.ID, err)
	}
	t.Cleanup(func() { _ = l.Delete(context.Background(), spec.ID) })
	return inst
}

func TestCreateSetsUpSandbox(t *testing.T) {
	l := newLocal(t)
	inst := create(t, l, runtime.Spec{ID: "setup", Env: map[string]string{"ORCHARD_X": "y"}})
	if want := "unix:" + l.sockPath("setup"); inst.AgentAddr != want {
		t.Errorf("AgentAddr = %s; want %s", inst.AgentAddr, want)
	}
	pid := l.initPID(t, "setup")
	env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	for _, kv := range []string{"ORCHARD_X=y", "HOME=/root", "WORKING_DIR=/workspace", "PATH="} {
		if !strings.Contains("\x00"+string(env), "\x00"+kv) {
			t.Errorf("agent env lacks %s: %q", kv, env)
		}
	}
	wantAdj := "0"
	if l.protectAgent {
		wantAdj = "-998"
	} else {
		t.Log("no CAP_SYS_RESOURCE here: the agent's OOM score cannot be lowered")
	}
	if adj, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); strings.TrimSpace(string(adj)) != wantAdj {
		t.Errorf("agent oom_score_adj = %q; want %s", adj, wantAdj)
	}
	if cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); cwd != "/workspace" {
		t.Errorf("agent cwd = %q; want /workspace", cwd)
	}
	out, code := l.execForTest(t, "setup", "sh", "-c", "hostname; grep -E '^(CapBnd|NoNewPrivs)' /proc/self/status; touch /workspace/f && echo ws-ok")
	if code != 0 || !strings.Contains(out, "sandbox-setup") || !strings.Contains(out, "ws-ok") ||
		!strings.Contains(out, "NoNewPrivs:\t1") || !strings.Contains(out, "CapBnd:\t00000000a80425fb") {
		t.Errorf("inside sandbox: code %d, output:\n%s", code, out)
	}
	out, code = l.execForTest(t, "setup", "sh", "-c", "cat /proc/kcore 2>&1 | wc -c; echo 1 > /proc/sys/kernel/panic 2>&1; mount -t tmpfs x /mnt 2>&1")
	if code == 0 {
		t.Errorf("mount inside sandbox succeeded: %s", out)
	}
	if !strings.Contains(out, "Read-only file system") {
		t.Errorf("/proc/sys writable inside sandbox: %s", out)
	}
}

func TestIsolation(t *testing.T) {
	testenv.RequireRoot(t)
	// Host-private data the sandbox must not see.
	secret := fmt.Sprintf("orchard-secret-%d", time.Now().UnixNano())
	var hostFiles []string
	for _, dir := range []string{"/root", "/tmp", "/var/tmp"} {
		p := filepath.Join(dir, secret)
		if err := os.WriteFile(p, []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
		hostFiles = append(hostFiles, p)
		t.Cleanup(func() { os.Remove(p) })
	}
	extra, err := os.MkdirTemp("/var/cache", "orchard-mask-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(extra) })
	if err := os.WriteFile(filepath.Join(extra, "private"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	l := newLocal(t, func(c *Config) { c.HostMasks = []string{extra} })

	create(t, l, runtime.Spec{ID: "iso-a"})
	create(t, l, runtime.Spec{ID: "iso-b"})

	t.Run("NoNetwork", func(t *testing.T) {
		out, _ := l.execForTest(t, "iso-a", "ls", "/sys/class/net")
		if strings.Fields(out)[0] != "lo" || len(strings.Fields(out)) != 1 {
			t.Errorf("interfaces = %q; want only lo", out)
		}
		start := time.Now()
		out, code := l.execForTest(t, "iso-a", "bash", "-c", "exec 3<>/dev/tcp/192.0.2.1/80")
		if code == 0 {
			t.Fatalf("connect to 192.0.2.1:80 succeeded")
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("connect failed after %v; want immediately (no route)", took)
		}
		if !strings.Contains(out, "unreachable") {
			t.Errorf("connect error = %q; want network unreachable", out)
		}
	})

	t.Run("HostPrivateMasked", func(t *testing.T) {
		args := []string{"sh", "-c", `for p in "$@"; do if [ -e "$p" ]; then echo "visible $p"; fi; done; echo checked`, "sh"}
		args = append(args, hostFiles...)
		args = append(args, l.cfg.StateDir, filepath.Join(extra, "private"), l.sandboxDir("iso-b"))
		out, _ := l.execForTest(t, "iso-a", args...)
		if strings.Contains(out, "visible") || !strings.Contains(out, "checked") {
			t.Errorf("host-private paths visible in sandbox:\n%s", out)
		}
		out, _ = l.execForTest(t, "iso-a", "sh", "-c", "cat /etc/shadow | wc -c; touch /tmp/t /root/t && echo writable")
		if !strings.HasPrefix(strings.TrimSpace(out), "0") || !strings.Contains(out, "writable") {
			t.Errorf("/etc/shadow readable or /tmp, /root not writable:\n%s", out)
		}
	})

	t.Run("MasksWithoutMounts", func(t *testing.T) {
		testenv.Require(t, "masks layer", l.masks != nil, "this kernel's overlayfs does not stack a detached layer")
		// The masks layer hides these: no mount of their own.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", l.initPID(t, "iso-a")))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 5 {
				continue
			}
			if p := f[4]; slices.Contains(l.hostMasks.writable, p) || slices.Contains(l.hostMasks.hidden, p) {
				t.Errorf("%s is a mount in the sandbox: %s", p, line)
			}
		}
		out, _ := l.execForTest(t, "iso-a", "sh", "-c", "stat -c '%n %a' /tmp /var/tmp /root; find /home /run -mindepth 1 | wc -l")
		if want := "/tmp 1777\n/var/tmp 1777\n/root 700\n0\n"; out != want {
			t.Errorf("masked folders:\n%s\nwant:\n%s", out, want)
		}
	})

	t.Run("HostRootUnchanged", func(t *testing.T) {
		marker := "/usr/local/orchard-sandbox-write-" + secret
		out, code := l.execForTest(t, "iso-a", "sh", "-c", "echo x > "+marker+" && echo wrote")
		if code != 0 || !strings.Contains(out, "wrote") {
			t.Fatalf("write in sandbox root: %d %s", code, out)
		}
		if _, err := os.Stat(marker); err == nil {
			os.Remove(marker)
			t.Fatalf("write inside the sandbox reached the host's %s", marker)
		}
	})

	t.Run("SandboxesSeparate", func(t *testing.T) {
		if out, code := l.execForTest(t, "iso-a", "sh", "-c", "echo a > /workspace/mine && sleep 30 >/dev/null 2>&1 &"); code != 0 {
			t.Fatalf("write in a: %s", out)
		}
		out, _ := l.execForTest(t, "iso-b", "sh", "-c", "test -e /workspace/mine && echo SEEN; ls /proc | grep -c '^[0-9]'; ps -e -o comm= 2>/dev/null | grep -c sleep")
		if strings.Contains(out, "SEEN") {
			t.Errorf("sandbox b sees a's /workspace file")
		}
		if f := strings.Fields(out); len(f) > 0 && f[len(f)-1] != "0" {
			t.Errorf("sandbox b sees a's processes:\n%s", out)
		}
	})
}

func TestMemoryLimit(t *testing.T) {
	_, err := exec.LookPath("awk")
	testenv.Require(t, "awk", err == nil, "awk allocates memory inside the sandbox")
	l := newLocal(t)
	inst := create(t, l, runtime.Spec{ID: "mem", MemoryBytes: 64 << 20})
	before, err := l.OOMKills("mem")
	if err != nil {
		t.Fatal(err)
	}
	// Doubles a string until the memory cgroup's OOM killer stops it.
	out, code := l.execForTest(t, "mem", "sh", "-c", `echo 0 > /proc/self/oom_score_adj; exec awk 'BEGIN { s = "x"; while (1) s = s s }'`)
	if code != 137 {
		t.Errorf("memory hog exit = %d; want 137 (SIGKILL by the OOM killer)\n%s", code, out)
	}
	after, err := l.OOMKills("mem")
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("OOMKills = %d after hog, %d before; want an increase", after, before)
	}
	got, err := l.Inspect(context.Background(), "mem")
	if err != nil || !got.Alive {
		t.Fatalf("sandbox after OOM: %+v, %v; want alive (agent spared)", got, err)
	}
	if _, err := runtimetest.Health(context.Background(), inst.AgentAddr); err != nil {
		t.Errorf("agent after OOM: %v", err)
	}
}

func TestPidsLimit(t *testing.T) {
	l := newLocal(t)
	inst := create(t, l, runtime.Spec{ID: "pids", PidsLimit: 32})
	out, _ := l.execForTest(t, "pids", "/bin/dash", "-c", "for i in $(seq 64); do sleep 1 & done; wait; echo done")
	if !strings.Contains(out, "fork") && !strings.Contains(out, "Resource temporarily unavailable") {
		t.Errorf("spawning 64 processes under a limit of 32 did not fail:\n%s", out)
	}
	// Usable again once the sleeps end.
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, code, err := l.tryExecForTest("pids", "echo", "alive")
		if err == nil && code == 0 && strings.Contains(out, "alive") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox unusable after hitting its pids limit: %d %s %v", code, out, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := runtimetest.Health(context.Background(), inst.AgentAddr); err != nil {
		t.Errorf("agent after pids limit: %v", err)
	}
}

func TestDeleteLeavesNothing(t *testing.T) {
	l := newLocal(t)
	create(t, l, runtime.Spec{ID: "gone", MemoryBytes: 128 << 20, CPU: 0.5})
	pid := l.initPID(t, "gone")
	// A child that would outlive a careless kill.
	if out, code := l.execForTest(t, "gone", "sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 < /dev/null &"); code != 0 {
		t.Fatalf("start background child: %s", out)
	}
	if err := l.Delete(context.Background(), "gone"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	checkGone(t, l, "gone")
	if !processGone(pid) {
		t.Errorf("agent pid %d still exists after Delete", pid)
	}
	if err := l.Delete(context.Background(), "gone"); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

func TestAgentDeathReported(t *testing.T) {
	l := newLocal(t)
	create(t, l, runtime.Spec{ID: "dies"})
	pid := l.initPID(t, "dies")
	if err := syscallKill(pid); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		inst, err := l.Inspect(context.Background(), "dies")
		if err != nil {
			t.Fatal(err)
		}
		if !inst.Alive {
			if inst.Reason != "exited: 137" {
				t.Errorf("Reason = %q; want exited: 137", inst.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sandbox still alive after its agent was killed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := l.Delete(context.Background(), "dies"); err != nil {
		t.Fatal(err)
	}
	checkGone(t, l, "dies")
}

func TestReattachAfterRestart(t *testing.T) {
	l1 := newLocal(t)
	spec := runtime.Spec{ID: "survivor", Image: "host", MemoryBytes: 64 << 20, Env: map[string]string{"A": "b"}, MemoryQuantity: "64Mi", TTLSeconds: 60}
	inst := create(t, l1, spec)
	pid := l1.initPID(t, "survivor")
	if err := l1.Close(); err != nil {
		t.Fatal(err)
	}

	l2, err := New(l1.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l2.Close() })
	got, err := l2.Inspect(context.Background(), "survivor")
	if err != nil {
		t.Fatalf("Inspect through a new Local: %v", err)
	}
	if !got.Alive || got.AgentAddr != inst.AgentAddr || got.Image != "host" || !got.CreatedAt.Equal(inst.CreatedAt) {
		t.Errorf("re-attached = %+v; want alive %+v", got, inst)
	}
	if !reflect.DeepEqual(got.Spec, spec) {
		t.Errorf("re-attached Spec = %+v; want %+v", got.Spec, spec)
	}
	list, err := l2.List(context.Background())
	if err != nil || len(list) != 1 || list[0].ID != "survivor" {
		t.Errorf("List = %+v, %v; want [survivor]", list, err)
	}
	if _, err := runtimetest.Health(context.Background(), got.AgentAddr); err != nil {
		t.Errorf("health after re-attach: %v", err)
	}
	if _, err := l2.Create(context.Background(), runtime.Spec{ID: "survivor"}); !faults.Is(err, faults.CodeSandboxExists) {
		t.Errorf("Create over a re-attached sandbox = %v; want %s", err, faults.CodeSandboxExists)
	}
	if err := l2.Delete(context.Background(), "survivor"); err != nil {
		t.Fatalf("Delete through a new Local: %v", err)
	}
	checkGone(t, l2, "survivor")
	if !processGone(pid) {
		t.Errorf("agent pid %d still exists", pid)
	}
}

func TestListAndDeleteIncomplete(t *testing.T) {
	l := newLocal(t)
	// What a crash between making the directory and starting the container
	// leaves behind.
	if err := os.MkdirAll(filepath.Join(l.sandboxDir("half"), "upper"), 0o700); err != nil {
		t.Fatal(err)
	}
	list, err := l.List(context.Background())
	if err != nil || len(list) != 1 || list[0].ID != "half" || list[0].Alive || list[0].Reason == "" {
		t.Fatalf("List = %+v, %v; want one dead sandbox with a reason", list, err)
	}
	if err := l.Delete(context.Background(), "half"); err != nil {
		t.Fatal(err)
	}
	checkGone(t, l, "half")
	if list, _ := l.List(context.Background()); len(list) != 0 {
		t.Errorf("List after Delete = %+v", list)
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	l := newLocal(t)
	// An agent that exits at once: Create must fail classified and clean up.
	bad := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho agent broke >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	l.cfg.AgentPath = bad
	_, err := l.Create(ctxTimeout(t, time.Minute), runtime.Spec{ID: "broken"})
	if !faults.Is(err, faults.CodeCreateFailed) {
		t.Fatalf("Create with a dying agent = %v; want %s", err, faults.CodeCreateFailed)
	}
	if !strings.Contains(err.Error(), "agent broke") {
		t.Errorf("error lacks the agent's log: %v", err)
	}
	checkGone(t, l, "broken")

	// A deadline that expires while waiting for the agent.
	l.cfg.AgentPath = testenv.AgentBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := l.Create(ctx, runtime.Spec{ID: "late"}); faults.Of(err).Category != faults.Timeout {
		t.Fatalf("Create with a 1ms deadline = %v; want a timeout", err)
	}
	checkGone(t, l, "late")

	for _, id := range []string{"", "../x", "a/b", strings.Repeat("x", 65)} {
		if _, err := l.Create(context.Background(), runtime.Spec{ID: id}); faults.Of(err).Category != faults.InvalidRequest {
			t.Errorf("Create(id %q) = %v; want invalid_request", id, err)
		}
	}
}

func syscallKill(pid int) error { return unix.Kill(pid, unix.SIGKILL) }

// BenchmarkCreateDelete creates and deletes sandboxes one at a time,
// alternating between a runtime that keeps writable layers on disk (the
// default) and one that keeps them in memory, so that both see the same
// load: one op is one create and delete of each. create-p50-ms and
// create-p90-ms are the default's; disk/memory is the ratio of the
// medians of create (and of delete).
func BenchmarkCreateDelete(b *testing.B) {
	modes := []struct {
		l               *Local
		creates, delets []time.Duration
	}{
		{l: newLocal(b)},
		{l: newLocal(b, func(c *Config) { c.WritableInMemory = true })},
	}
	if !modes[0].l.onDisk {
		b.Fatalf("writable layers are in memory on this host: %v", modes[0].l.disks.usable())
	}
	i := 0
	for b.Loop() {
		for m := range modes {
			id := fmt.Sprintf("bench-%d", i)
			i++
			start := time.Now()
			if _, err := modes[m].l.Create(context.Background(), runtime.Spec{ID: id, MemoryBytes: 512 << 20, CPU: 1}); err != nil {
				b.Fatal(err)
			}
			created := time.Now()
			if err := modes[m].l.Delete(context.Background(), id); err != nil {
				b.Fatal(err)
			}
			modes[m].creates = append(modes[m].creates, created.Sub(start))
			modes[m].delets = append(modes[m].delets, time.Since(created))
		}
	}
	p := func(d []time.Duration, q float64) float64 {
		slices.Sort(d)
		return float64(d[int(float64(len(d))*q)].Microseconds()) / 1000
	}
	disk, mem := modes[0], modes[1]
	b.ReportMetric(p(disk.creates, 0.5), "create-p50-ms")
	b.ReportMetric(p(disk.creates, 0.9), "create-p90-ms")
	b.ReportMetric(p(mem.creates, 0.5), "memory-create-p50-ms")
	b.ReportMetric(p(disk.creates, 0.5)/p(mem.creates, 0.5), "disk/memory-create")
	b.ReportMetric(p(disk.delets, 0.5), "delete-p50-ms")
	b.ReportMetric(p(disk.delets, 0.5)/p(mem.delets, 0.5), "disk/memory-delete")
}
