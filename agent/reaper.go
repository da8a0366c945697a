package agent

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>; the
// syscall package does not export it and the agent stays free of x/sys.
const prSetChildSubreaper = 36

// reaper owns every wait on the process's children. As PID 1 (or a
// subreaper) the agent inherits orphans and must reap them, and the only way
// to reap unknown children is wait4(-1); once something calls that, no other
// code may wait on a specific child, because the status would be stolen.
// So all children are started through reaper.start and their exit is
// delivered by the reaper; exec.Cmd.Wait and os.Process.Wait are never used.
//
// There is one reaper per process (see acquireReaper): two would steal each
// other's statuses.
type reaper struct {
	log *slog.Logger

	// mu guards waiting. It is held across a child's spawn and its
	// registration, and the reap loop holds it from its wait4 to the pid's
	// lookup, so a status can never be looked up before its child is
	// registered, nor a freed pid reused by a spawn in between.
	mu      sync.Mutex
	waiting map[int]*child

	refs int // guarded by reaperMu
	stop chan struct{}
	done chan struct{}
}

// child is a process started through the reaper.
type child struct {
	pid int
	// done is closed by the reaper once the child has been reaped; status is
	// valid after that.
	done   chan struct{}
	status syscall.WaitStatus
}

// signalGroup sends sig to the child's process group. Every child is started
// in its own session, so its pgid is its pid and the group holds the child and
// whatever it spawned; Linux keeps a pgid from being reused while the group
// has members, so this cannot hit an unrelated process while it matters.
func (c *child) signalGroup(sig syscall.Signal) error {
	err := syscall.Kill(-c.pid, sig)
	if err == syscall.ESRCH {
		return nil // the group is already gone
	}
	return err
}

// killGroup SIGKILLs the group until it is empty (or the bound passes): a
// group that is still forking (a fork bomb) gains members between one kill
// and the next, and one kill would leave survivors that hold the pids limit.
func (c *child) killGroup() error {
	const (
		bound = 2 * time.Second
		pause = 5 * time.Millisecond
	)
	deadline := time.Now().Add(bound)
	for {
		err := syscall.Kill(-c.pid, syscall.SIGKILL)
		if err == syscall.ESRCH {
			return nil
		}
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process group %d still alive after %v of kills", c.pid, bound)
		}
		time.Sleep(pause)
	}
}

// exitCode is the Orchard exit code of a reaped child: its status, or the
// negative signal number when a signal killed it.
func (c *child) exitCode() (code, sig int) {
	switch {
	case c.status.Exited():
		return c.status.ExitStatus(), 0
	case c.status.Signaled():
		s := int(c.status.Signal())
		return -s, s
	}
	return -1, 0
}

var (
	reaperMu  sync.Mutex // guards theReaper and its refs
	theReaper *reaper
)

// acquireReaper returns the process's reaper, starting it on first use. The
// process-wide singleton is deliberate: wait4(-1) reaps every child of the
// process, so servers sharing a process (tests run several) must share the
// reaper too. Each acquire is paired with a release; the last release stops
// the loop so that tests end without stray goroutines.
func acquireReaper(log *slog.Logger) *reaper {
	reaperMu.Lock()
	defer reaperMu.Unlock()
	if theReaper != nil {
		theReaper.refs++
		return theReaper
	}
	// Orphans reparent to the nearest subreaper; as PID 1 the agent is one
	// anyway, elsewhere (tests, a plain process) this makes the double-forked
	// grandchildren of commands ours to reap just the same.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		log.Warn("set child subreaper", "err", errno)
	}
	r := &reaper{
		log:     log,
		waiting: make(map[int]*child),
		refs:    1,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	go r.loop(sigs)
	theReaper = r
	return r
}

// release drops one reference; the last one stops the loop.
func (r *reaper) release() {
	reaperMu.Lock()
	defer reaperMu.Unlock()
	r.refs--
	if r.refs > 0 {
		return
	}
	close(r.stop)
	<-r.done
	theReaper = nil
}

// loop reaps on every SIGCHLD, and only then: no exit goes unnoticed
// without a timed sweep. Children that died before the handler was
// installed are reaped by the first pass. A signal that arrives while the
// channel is full is dropped, but the one in the channel starts a pass
// that comes after it; one that arrives during a pass fills the emptied
// channel and starts the next. Orphans reparented here send SIGCHLD too.
// A sweep would cost every idle sandbox a wake-up: once a second it cost
// 500 idle agents 7 % of this two-core machine, and kept each sandbox's
// CPU cgroup on the scheduler's list of loads to decay at every tick.
func (r *reaper) loop(sigs chan os.Signal) {
	defer close(r.done)
	defer signal.Stop(sigs)
	for {
		r.reapAll()
		select {
		case <-r.stop:
			return
		case <-sigs:
		}
	}
}

// reapAll reaps every child that has exited. SIGCHLDs coalesce, so one
// signal may stand for many exits: loop until wait4 reports none.
func (r *reaper) reapAll() {
	for {
		// wait4 frees the pid: under mu, so that no spawn (which holds mu
		// from fork to registration) can be given it and registered before
		// the lookup below hands it this status.
		var ws syscall.WaitStatus
		r.mu.Lock()
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			r.mu.Unlock()
			continue
		}
		if err != nil || pid <= 0 {
			r.mu.Unlock()
			return // ECHILD: no children at all; 0: none has exited
		}
		c, ok := r.waiting[pid]
		delete(r.waiting, pid)
		r.mu.Unlock()
		if !ok {
			// An orphan that reparented to us, or a child whose start
			// failed after the fork. Its status is dropped on purpose:
			// keeping it for a later registration would hand it to an
			// unrelated new child that reuses the pid, and registration
			// cannot race with this lookup (see mu).
			r.log.Debug("reaped orphan", "pid", pid, "status", int(ws))
			continue
		}
		c.status = ws
		close(c.done)
	}
}

// start spawns a child with the registry locked and registers it before the
// lock is released. spawn returns the child's pid: the child is tracked by
// pid (signals go to its group), and its exit arrives on child.done.
func (r *reaper) start(spawn func() (int, error)) (*child, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := spawn()
	if err != nil {
		return nil, err
	}
	c := &child{pid: pid, done: make(chan struct{})}
	r.waiting[pid] = c
	return c, nil
}

// startProcess is start for a spawn that returns an os.Process, which is
// released at once.
func (r *reaper) startProcess(spawn func() (*os.Process, error)) (*child, error) {
	return r.start(func() (int, error) {
		p, err := spawn()
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		_ = p.Release()
		return pid, nil
	})
}

// reapNow reaps c if it has exited, without waiting for the loop. The lock
// keeps it from racing the loop's lookup: whichever of the two wait4 calls
// gets the status delivers it, and c.done is closed once.
func (r *reaper) reapNow(c *child) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting[c.pid] != c {
		return // the loop has it
	}
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(c.pid, &ws, syscall.WNOHANG, nil)
	for err == syscall.EINTR {
		pid, err = syscall.Wait4(c.pid, &ws, syscall.WNOHANG, nil)
	}
	if err != nil || pid != c.pid {
		return // still running, or the loop's wait4 took it first
	}
	delete(r.waiting, c.pid)
	c.status = ws
	close(c.done)
}
