package agent

import (
	"os"
	"strconv"
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
	r := acquireReaper(testLogger)
	defer r.release()
	devnull, err := syscall.Open(os.DevNull, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(devnull)
	attr := &syscall.ProcAttr{Files: []uintptr{uintptr(devnull), uintptr(devnull), uintptr(devnull)}}

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
