package local

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/internal/testing/testenv"
)

func TestMain(m *testing.M) {
	// libcontainer re-executes this test binary as "<exe> init" to become
	// a container's init (and to enter one, for execForTest).
	if len(os.Args) > 1 && os.Args[1] == "init" {
		Init()
	}
	goleak.VerifyTestMain(m)
}

// newLocal returns a Local over a fresh, short state dir (the agent socket
// path must fit in sockaddr_un), closed and removed at the end of the test.
func newLocal(t testing.TB, mod ...func(*Config)) *Local {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := os.Stat("/sys/fs/cgroup/pids")
	testenv.Require(t, "cgroups", err == nil || isCgroup2(), "no pids cgroup hierarchy")
	// The prefix the repository's leak check looks for.
	dir, err := os.MkdirTemp("", "orchard-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Only if nothing is mounted there any more: never remove through a
		// mount (a failed test may leave one; the leak checks report it).
		if !hasMountsUnder(dir) {
			_ = os.RemoveAll(dir)
		}
	})
	cfg := Config{
		StateDir:  dir,
		AgentPath: testenv.AgentBinary(t),
		// The path the server takes (scripts/dev.sh installs orchard-init).
		InitPath: initBinary(t),
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	}
	for _, f := range mod {
		f(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func isCgroup2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// execForTest runs a command inside a running sandbox (setns into its
// namespaces and cgroups) and returns its combined output and exit code.
func (l *Local) execForTest(t testing.TB, id string, args ...string) (string, int) {
	t.Helper()
	out, code, err := l.tryExecForTest(id, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out, code
}

// tryExecForTest is execForTest returning start failures (a full pids
// cgroup, ...) instead of failing the test.
func (l *Local) tryExecForTest(id string, args ...string) (string, int, error) {
	s, err := l.lookup(id)
	if err != nil || s == nil {
		return "", 0, fmt.Errorf("exec in %s: no such sandbox (%v)", id, err)
	}
	s.mu.Lock()
	c := s.container
	s.mu.Unlock()
	if c == nil {
		return "", 0, fmt.Errorf("exec in %s: no container", id)
	}
	var out bytes.Buffer
	p := &libcontainer.Process{
		Args:   args,
		Env:    []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
		Cwd:    "/",
		Stdout: &out,
		Stderr: &out,
	}
	if err := c.Run(p); err != nil {
		return "", 0, fmt.Errorf("exec %v in %s: %w", args, id, err)
	}
	st, err := p.Wait()
	if st == nil {
		return "", 0, fmt.Errorf("wait %v in %s: %w", args, id, err)
	}
	code := st.ExitCode()
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	return out.String(), code, nil
}

// initPID is the host pid of the sandbox's agent.
func (l *Local) initPID(t testing.TB, id string) int {
	t.Helper()
	s, err := l.lookup(id)
	if err != nil || s == nil {
		t.Fatalf("no sandbox %s", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watch == nil || s.watch.pid == 0 {
		t.Fatalf("sandbox %s has no running init", id)
	}
	return s.watch.pid
}

// checkGone asserts that nothing of sandbox id is left: no mounts under
// its directory, no cgroup in any hierarchy, no process in those cgroups,
// no container state, no directory.
func checkGone(t testing.TB, l *Local, id string) {
	t.Helper()
	dir := l.sandboxDir(id)
	if hasMountsUnder(dir) {
		t.Errorf("mounts left under %s:\n%s", dir, mountsUnder(dir))
	}
	for _, p := range cgroupDirs(l.cgroupPath(id)) {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("cgroup %s left", p)
		}
	}
	if pids := procsInCgroup(l.cgroupPath(id)); len(pids) > 0 {
		t.Errorf("processes left in cgroup %s: %v", l.cgroupPath(id), pids)
	}
	for _, p := range []string{dir, filepath.Join(l.ctrRoot, id)} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left (%v)", p, err)
		}
	}
	if f := diskFiles(l, id); len(f) > 0 {
		t.Errorf("disk files left: %v", f)
	}
	// A loop device detaches once the last mount of its filesystem, in
	// the sandbox's mount namespace, is gone.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []loopDevice
		for _, d := range loopDevices(l.disks.dir) {
			if got, _ := diskID(filepath.Base(d.backing)); got == id {
				left = append(left, d)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("loop devices left: %+v\n%s", left, loopHolders(left))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cgroupDirs lists where cgroup path would live in every mounted hierarchy.
func cgroupDirs(path string) []string {
	var out []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name(), path))
		}
	}
	return append(out, filepath.Join("/sys/fs/cgroup", path))
}

// procsInCgroup lists processes whose cgroup (in any hierarchy) is path.
func procsInCgroup(path string) []string {
	var out []string
	files, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasSuffix(line, ":"+path) || strings.Contains(line, ":"+path+"/") {
				out = append(out, filepath.Base(filepath.Dir(f)))
				break
			}
		}
	}
	return out
}

// mountsUnder lists the mounts at dir and below it; only below it when dir
// ends in a slash.
func mountsUnder(dir string) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	var b strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], strings.TrimSuffix(dir, "/")+"/")) {
			b.WriteString(sc.Text() + "\n")
		}
	}
	return b.String()
}

func hasMountsUnder(dir string) bool { return mountsUnder(dir) != "" }

// processGone reports whether pid no longer exists (not even as a zombie),
// waiting a little for the reaper.
func processGone(pid int) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// loopHolders lists the threads whose mount namespaces still mount a
// filesystem of the loop devices, and the threads of this process that
// are in a mount namespace of their own: a sandbox's, whose root overlay
// keeps the sandbox's disk (see mainthread.go).
func loopHolders(loops []loopDevice) string {
	var b strings.Builder
	// This thread's: /proc/self is the main thread, which may be the one
	// that joined a sandbox's.
	self, _ := os.Readlink("/proc/thread-self/ns/mnt")
	tasks, _ := filepath.Glob("/proc/self/task/[0-9]*")
	for _, task := range tasks {
		if ns, _ := os.Readlink(filepath.Join(task, "ns/mnt")); ns != "" && ns != self {
			fmt.Fprintf(&b, "thread %s of this process is in mount namespace %s\n", filepath.Base(task), ns)
		}
	}
	files, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*/mountinfo")
	for _, l := range loops {
		dev, err := os.ReadFile("/sys/block/" + filepath.Base(l.dev) + "/dev")
		if err != nil {
			continue
		}
		majmin := strings.TrimSpace(string(dev))
		seen := map[string]bool{}
		for _, f := range files {
			mi, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(mi), "\n") {
				if fields := strings.Fields(line); len(fields) > 4 && fields[2] == majmin {
					task := filepath.Dir(f)
					ns, _ := os.Readlink(filepath.Join(task, "ns/mnt"))
					if !seen[ns] {
						seen[ns] = true
						comm, _ := os.ReadFile(filepath.Join(task, "comm"))
						fmt.Fprintf(&b, "%s mounted at %s in %s of %s (%s)\n", l.dev, fields[4], ns, task, strings.TrimSpace(string(comm)))
					}
					break
				}
			}
		}
	}
	return b.String()
}
