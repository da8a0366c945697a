package local

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fscommon"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"
)

// watcher follows a sandbox's init process through a pidfd registered with
// the Go netpoller (no thread blocked per sandbox), reaps it when it is our
// child, and records why it ended.
type watcher struct {
	pid  int
	file *os.File // the pidfd; closing it stops the watch
	done chan struct{}

	mu      sync.Mutex // guards reason and stopped
	reason  string
	stopped bool
}

// exited reports whether init has exited and why.
func (w *watcher) exited() (string, bool) {
	select {
	case <-w.done:
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.reason, !w.stopped
	default:
		return "", false
	}
}

// stop ends the watch without touching the process.
func (w *watcher) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	_ = w.file.Close()
}

// kill sends SIGKILL through the pidfd (immune to pid reuse) if the
// process is still watched.
func (w *watcher) kill() {
	if w.file == nil {
		return
	}
	rc, err := w.file.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.PidfdSendSignal(int(fd), unix.SIGKILL, nil, 0)
	})
}

// watchContainer starts watching c's init, a container this process may
// not have started. When init is not running (any more) the watcher it
// returns has already exited.
func (l *Local) watchContainer(id string, c *libcontainer.Container) *watcher {
	st, err := c.State()
	if err != nil || st.InitProcessPid <= 0 {
		return deadWatcher("exited")
	}
	pid := st.InitProcessPid
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return deadWatcher(l.exitReason(id, "exited"))
	}
	// The pid may have been reused between the state file and the pidfd:
	// trust the pidfd only if the process's start time is init's.
	if start, err := procStartTime(pid); err != nil || start != st.InitProcessStartTime {
		unix.Close(fd)
		return deadWatcher(l.exitReason(id, "exited"))
	}
	return l.watchPidfd(id, pid, fd)
}

// watchChild starts watching the init this process just started, by its
// pid: a child's pid cannot be reused before this process reaps it, so
// neither the container's state nor the start time is needed.
func (l *Local) watchChild(id string, pid int) *watcher {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return deadWatcher(l.exitReason(id, "exited"))
	}
	return l.watchPidfd(id, pid, fd)
}

// watchPidfd watches pid through fd, its pidfd, which it takes over.
func (l *Local) watchPidfd(id string, pid, fd int) *watcher {
	w := &watcher{pid: pid, file: os.NewFile(uintptr(fd), "pidfd"), done: make(chan struct{})}
	l.watchers.Add(1)
	go func() {
		defer l.watchers.Done()
		defer close(w.done)
		if !waitPidfd(w.file) {
			return // stopped
		}
		reason := "exited"
		var ws unix.WaitStatus
		// Reap init if it is our child; after a server restart it is not,
		// and its new parent reaps it.
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			switch {
			case ws.Exited():
				reason = fmt.Sprintf("exited: %d", ws.ExitStatus())
			case ws.Signaled():
				reason = fmt.Sprintf("exited: %d", 128+int(ws.Signal()))
			}
		}
		reason = l.exitReason(id, reason)
		w.mu.Lock()
		w.reason = reason
		w.mu.Unlock()
		_ = w.file.Close()
		l.log.Info("sandbox init exited", "sandbox_id", id, "reason", reason)
	}()
	return w
}

// exitReason is "oom" when the memory cgroup recorded an OOM kill.
func (l *Local) exitReason(id, reason string) string {
	if n, err := l.oomKills(id); err == nil && n > 0 {
		return "oom (" + reason + ")"
	}
	return reason
}

func deadWatcher(reason string) *watcher {
	w := &watcher{done: make(chan struct{}), reason: reason}
	close(w.done)
	return w
}

// waitPidfd blocks until the process behind the pidfd exits (true) or the
// file is closed (false).
func waitPidfd(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	exited := false
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, perr := unix.Poll(fds, 0)
		if perr != nil && !errors.Is(perr, unix.EINTR) {
			return true
		}
		exited = n > 0
		return exited
	})
	return err == nil && exited
}

// procStartTime is field 22 of /proc/<pid>/stat, as libcontainer records it.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	// After ") " come fields 3..; start time is field 22.
	if len(f) < 20 {
		return 0, errors.New("malformed stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// oomKills reads the kernel's OOM kill count of c's memory cgroup.
// oomKills reads the OOM-kill count of the sandbox's memory cgroup by its
// path, not through the container's state, which Delete may be changing.
func (l *Local) oomKills(id string) (uint64, error) {
	if cgroups.IsCgroup2UnifiedMode() {
		return fscommon.GetValueByKey(filepath.Join("/sys/fs/cgroup", l.cgroupPath(id)), "memory.events", "oom_kill")
	}
	mnt, err := memoryMount()
	if err != nil {
		return 0, err
	}
	return fs.OOMKillCount(filepath.Join(mnt, l.cgroupPath(id)))
}

// openOOMFile opens the file of the sandbox's memory cgroup that holds its
// OOM kill count: memory.events (v2) or memory.oom_control (v1).
func (l *Local) openOOMFile(id string) (*os.File, error) {
	var p string
	if cgroups.IsCgroup2UnifiedMode() {
		p = filepath.Join("/sys/fs/cgroup", l.cgroupPath(id), "memory.events")
	} else {
		mnt, err := memoryMount()
		if err != nil {
			return nil, err
		}
		p = filepath.Join(mnt, l.cgroupPath(id), "memory.oom_control")
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("open oom count: %w", err)
	}
	return f, nil
}

// readOOMKills reads the oom_kill line of an OOM count file from its start
// (cgroup files render anew on each read at offset 0); 0 without one, as
// fscommon.GetValueByKey.
func readOOMKills(f *os.File) (uint64, error) {
	var buf [512]byte
	n, err := f.ReadAt(buf[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	for line := range strings.SplitSeq(string(buf[:n]), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			c, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s: %q: %w", f.Name(), line, err)
			}
			return c, nil
		}
	}
	return 0, nil // a kernel too old to count OOM kills
}

// memoryMount is the v1 memory hierarchy's mountpoint, found once: finding
// it parses /proc/self/mountinfo, and OOMKills runs around every exec.
var memoryMount = sync.OnceValues(func() (string, error) {
	return cgroups.FindCgroupMountpoint("", "memory")
})
