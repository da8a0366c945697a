package agent

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A spawn holds the reaper's mu from fork to registration. If the reap loop
// can take an orphan's status with wait4(-1) meanwhile and only then look
// the pid up, the spawn may get the pid just freed, register it, and the
// orphan's status is delivered to the new child: a wrong exit code, and an
// exec that "ends" while its command still runs. ns_last_pid makes the pid
// reuse deterministic; in a sandbox it takes pid wrap-around under load.
func TestReaperPidReuse(t *testing.T) {
	const nsLastPid = "/proc/sys/kernel/ns_last_pid"
	if f, err := os.OpenFile(nsLastPid, os.O_WRONLY, 0); err != nil {
		t.Skipf("cannot set ns_last_pid: %v", err)
	} else {
		f.Close()
	}
	r, attr := testReaper(t)

	// Play a spawn that holds mu while an orphan exits.
	r.mu.Lock()
	orphan, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "exit 7"}, attr)
	if err != nil {
		r.mu.Unlock()
		t.Fatal(err)
	}
	// Not registered, so an orphan to the reaper. Give the loop time to
	// take its status (its /proc entry goes once it is reaped).
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); err != nil {
			break
		}
	}
	// The spawn's fork, handed the orphan's pid if it is free.
	_ = os.WriteFile(nsLastPid, []byte(strconv.Itoa(orphan-1)), 0)
	pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "sleep 0.3; exit 0"}, attr)
	if err != nil {
		r.mu.Unlock()
		t.Fatal(err)
	}
	c := &child{pid: pid, done: make(chan struct{})}
	r.waiting[pid] = c
	r.mu.Unlock()

	start := time.Now()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("child %d never reaped", pid)
	}
	code, _ := c.exitCode()
	if code != 0 || time.Since(start) < 200*time.Millisecond {
		t.Fatalf("child %d (sleep 0.3; exit 0; orphan was %d) reported exit %d after %v: the orphan's status", pid, orphan, code, time.Since(start))
	}
}

// The reaper has no timed sweep: every exit must be seen through SIGCHLD
// alone, however many coalesce. In the first rounds, children registered
// through start exit all at once and nothing else happens after: every
// exit must arrive, with its own status. In the last, each child leaves
// an orphan that exits a little later and reparents to the subreaper;
// every orphan must be reaped.
func TestReaperSeesEveryExitWithoutSweep(t *testing.T) {
	r, attr := testReaper(t)
	pidFile := t.TempDir() + "/orphans"

	const n = 40
	for round, orphans := range []bool{false, false, false, true} {
		kids := make([]*child, n)
		for i := range n {
			script := "exit " + strconv.Itoa(i)
			if orphans {
				script = "sleep 0.05 & echo $! >> " + pidFile + "; " + script
			}
			c, err := r.start(func() (int, error) {
				return syscall.ForkExec("/bin/sh", []string{"sh", "-c", script}, attr)
			})
			if err != nil {
				t.Fatal(err)
			}
			kids[i] = c
		}
		deadline := time.After(10 * time.Second)
		for i, c := range kids {
			select {
			case <-c.done:
			case <-deadline:
				t.Fatalf("round %d: child %d (pid %d) never reported its exit", round, i, c.pid)
			}
			if code, _ := c.exitCode(); code != i {
				t.Fatalf("round %d: child %d exited %d, want %d", round, i, code, i)
			}
		}
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	orphans := strings.Fields(string(data))
	if len(orphans) != n {
		t.Fatalf("%d orphans recorded, want %d", len(orphans), n)
	}
	for _, p := range orphans {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			// A reaped orphan's /proc entry is gone; a zombie's stays.
			if _, err := os.Stat("/proc/" + p); err != nil {
				break
			}
			if time.Now().After(deadline) {
				st, _ := os.ReadFile("/proc/" + p + "/stat")
				t.Fatalf("orphan %s never reaped: %s", p, st)
			}
		}
	}
}

// testReaper acquires the process's reaper for the test, and the
// attributes of a child whose standard streams are /dev/null.
func testReaper(t *testing.T) (*reaper, *syscall.ProcAttr) {
	t.Helper()
	r := acquireReaper(testLogger)
	t.Cleanup(r.release)
	devnull, err := syscall.Open(os.DevNull, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(devnull) })
	return r, &syscall.ProcAttr{Files: []uintptr{uintptr(devnull), uintptr(devnull), uintptr(devnull)}}
}
