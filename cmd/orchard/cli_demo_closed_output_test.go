package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// demoExitTimeout bounds the demo's end once its output is gone: the
// episode under way ends at its next step, then its sandbox is deleted.
const demoExitTimeout = 2 * time.Minute

var embeddedRE = regexp.MustCompile(`embedded server on http://\S+ \(state in (\S+)\)`)

// `orchard demo 2>&1 | head -1`: the reader leaves while a sandbox runs.
// The demo's next write fails; it must then end its run, delete its
// sandboxes and state and exit, not die of that write's SIGPIPE with its
// containers left running. The real binary runs, as the signal handling
// is main's.
func TestDemoClosedOutput(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireChromium(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(testenv.OrchardBinary(t), "demo", "--tasks", "1", "--out", filepath.Join(t.TempDir(), "replays"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "ORCHARD_AGENT=" + testenv.AgentBinary(t)}
	cmd.Stdout, cmd.Stderr = w, w
	// As in testserver.StartProcess: the demo dies with the test process,
	// whose starting thread stays with the goroutine that reaps it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	exited := make(chan struct{}) // closed once the demo has been reaped
	var waitErr error             // its exit; read after exited is closed
	go func() {
		goruntime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waitErr = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	// Read up to the line that names the state directory, then wait for
	// a sandbox in it before leaving.
	var state string
	var seen []string
	lines := bufio.NewScanner(r)
	for state == "" && lines.Scan() {
		seen = append(seen, lines.Text())
		if m := embeddedRE.FindStringSubmatch(lines.Text()); m != nil {
			state = m[1]
		}
	}
	if state == "" {
		t.Fatalf("no embedded server announced; the demo wrote:\n%s", strings.Join(seen, "\n"))
	}
	// Whatever happens, nothing of the demo outlives the test.
	t.Cleanup(func() {
		if _, err := os.Stat(state); err == nil {
			testserver.RemoveSandboxes(t, filepath.Join(state, "runtime"))
			_ = os.RemoveAll(state)
		}
	})
	sandboxes := filepath.Join(state, "runtime", "sandboxes")
	deadline := time.Now().Add(demoExitTimeout)
	var ids []string
	for len(ids) == 0 {
		ents, _ := os.ReadDir(sandboxes)
		for _, e := range ents {
			ids = append(ids, e.Name())
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sandbox in %s within %s", sandboxes, demoExitTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Close()
	closed := time.Now()

	select {
	case <-exited:
	case <-time.After(demoExitTimeout):
		t.Fatalf("demo still running %s after its output closed", demoExitTimeout)
	}
	t.Logf("demo ended (%v) %.1fs after its output closed, with sandboxes %v", waitErr, time.Since(closed).Seconds(), ids)
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signaled() {
		t.Errorf("demo ended by %v, want an exit", waitErr)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state directory %s left behind (%v)", state, err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, state) {
			t.Errorf("mount left: %s", line)
		}
	}
	for _, id := range ids {
		for _, pat := range []string{"/sys/fs/cgroup/*/orchard/" + id, "/sys/fs/cgroup/orchard/" + id} {
			left, _ := filepath.Glob(pat)
			for _, d := range left {
				t.Errorf("cgroup of sandbox %s left: %s", id, d)
			}
		}
	}
}
