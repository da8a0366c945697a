package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
)

// HostSandbox is a sandbox found on this host by its cgroup, whatever
// state directory it came from.
type HostSandbox struct {
	ID string `json:"id"`
	// PID is its init (the agent) on the host; 0 when the cgroup holds no
	// process of its own namespace.
	PID int `json:"pid,omitempty"`
	// StateDir is the state directory of the server that started it, read
	// from the path its agent's socket was bound to; empty when unknown.
	StateDir string    `json:"state_dir,omitempty"`
	Started  time.Time `json:"started"`
	// Owner is why it is kept, or empty for an orphan.
	Owner string `json:"owner,omitempty"`
	// Orphan says why no server can reach it any more.
	Orphan string `json:"orphan,omitempty"`
}

// Orphaned reports whether no server, running or started later, can
// reach or delete s.
func (s HostSandbox) Orphaned() bool { return s.Orphan != "" }

// DefaultCgroupParent is the cgroup every local runtime's sandboxes are
// made under unless configured otherwise.
const DefaultCgroupParent = "orchard"

// HostSandboxes lists every sandbox under cgroupParent on this host and
// says which are orphans. A sandbox is kept while a live process (a
// server) holds its state directory's lock, even one whose directory was
// wiped under it, or while its state directory still records it (a server
// started there re-attaches it); one younger than grace is kept too (it may
// be being created). The rest no server can ever reach: orphans.
func HostSandboxes(cgroupParent string, grace time.Duration) ([]HostSandbox, error) {
	if cgroupParent == "" {
		cgroupParent = DefaultCgroupParent
	}
	parent := pidsCgroup("/" + strings.Trim(filepath.Clean("/"+cgroupParent), "/"))
	if parent == "" {
		return nil, errors.New("no pids cgroup hierarchy is mounted")
	}
	entries, err := os.ReadDir(parent)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // no sandbox was ever made under this parent
	}
	if err != nil {
		return nil, err
	}
	socks := unixSockets()
	locks := lockHolders()
	boot := bootTime()
	var out []HostSandbox
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !idPattern.MatchString(id) {
			continue
		}
		dir := filepath.Join(parent, id)
		s := HostSandbox{ID: id}
		if fi, err := e.Info(); err == nil {
			s.Started = fi.ModTime()
		}
		if pid, sock := agentSocket(dir, socks); pid > 0 {
			s.PID = pid
			if t, ok := startTime(pid, boot); ok {
				s.Started = t
			}
			if d, ok := strings.CutSuffix(sock, "/sandboxes/"+id+"/agent.sock"); ok {
				s.StateDir = d
			}
		}
		switch {
		case time.Since(s.Started) < grace:
			s.Owner = "new: may be being created"
		case s.StateDir != "" && lockHolder(locks, s.StateDir) != 0:
			s.Owner = fmt.Sprintf("a live server (pid %d)", lockHolder(locks, s.StateDir))
		case s.StateDir != "" && pathExists(filepath.Join(s.StateDir, "sandboxes", id)):
			s.Owner = "recorded in its state directory: a server started there re-attaches it"
		case s.PID == 0 && cgroupTasks(dir) != 0:
			// Processes this process cannot see: another pid namespace's.
			s.Owner = "unknown: its processes are in another pid namespace"
		case s.PID == 0:
			s.Orphan = "no process: a cgroup left behind"
		case s.StateDir == "":
			// Its socket is in another network namespace, or it has none:
			// without its origin, nothing says no server owns it.
			s.Owner = "unknown: no agent socket in this network namespace"
		case !pathExists(s.StateDir):
			s.Orphan = "its state directory is gone"
		default:
			s.Orphan = "its state directory no longer records it"
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b HostSandbox) int { return a.Started.Compare(b.Started) })
	return out, nil
}

// RemoveHostSandbox kills an orphan's processes and removes its cgroups.
// Its mounts were in its own mount namespace and go with it; its writable
// layer's loop device detaches once the last of them is gone.
func RemoveHostSandbox(ctx context.Context, cgroupParent string, s HostSandbox) error {
	if cgroupParent == "" {
		cgroupParent = DefaultCgroupParent
	}
	if !idPattern.MatchString(s.ID) || s.ID == "." || s.ID == ".." {
		return fmt.Errorf("invalid sandbox id %q", s.ID)
	}
	ctx, cancel := context.WithTimeout(ctx, teardownTimeout)
	defer cancel()
	path := "/" + strings.Trim(filepath.Clean("/"+cgroupParent), "/") + "/" + s.ID
	cm, err := manager.New(&cgroups.Cgroup{Path: path, Resources: &cgroups.Resources{}})
	if err != nil {
		return fmt.Errorf("cgroup manager of %s: %w", s.ID, err)
	}
	var errs []error
	if err := thawAndKill(ctx, cm); err != nil {
		errs = append(errs, err)
	}
	if err := deleteLink(hostLinkName(s.ID)); err != nil {
		errs = append(errs, fmt.Errorf("remove veth: %w", err))
	}
	if err := cm.Destroy(); err != nil {
		errs = append(errs, fmt.Errorf("remove cgroups: %w", err))
	}
	return errors.Join(errs...)
}

// ReapOrphans removes the orphaned sandboxes of this host (see
// HostSandboxes), older than grace: those of servers whose state
// directory was wiped, which no server can reach any more.
func (l *Local) ReapOrphans(ctx context.Context, grace time.Duration) (removed int) {
	all, err := HostSandboxes(l.cfg.CgroupParent, grace)
	if err != nil {
		l.log.Warn("look for orphaned sandboxes", "err", err)
		return 0
	}
	for _, s := range all {
		if !s.Orphaned() {
			continue
		}
		l.log.Warn("removing an orphaned sandbox", "sandbox_id", s.ID, "origin", s.StateDir, "why", s.Orphan, "age", time.Since(s.Started).Round(time.Second))
		if err := RemoveHostSandbox(ctx, l.cfg.CgroupParent, s); err != nil {
			l.log.Warn("remove orphaned sandbox", "sandbox_id", s.ID, "err", err)
			continue
		}
		removed++
	}
	return removed
}

// agentSocket finds the init of the cgroup at dir (pid 1 of its
// namespace: the agent) and the path of the unix socket it listens on.
func agentSocket(dir string, socks map[string]string) (int, string) {
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return 0, ""
	}
	for _, p := range strings.Fields(string(procs)) {
		pid, err := strconv.Atoi(p)
		if err != nil || !nsInit(p) {
			continue
		}
		fdDir := filepath.Join("/proc", p, "fd")
		fds, _ := os.ReadDir(fdDir)
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			if ino, ok := strings.CutPrefix(target, "socket:["); ok {
				if path := socks[strings.TrimSuffix(ino, "]")]; strings.HasSuffix(path, "/agent.sock") {
					return pid, path
				}
			}
		}
		return pid, ""
	}
	return 0, ""
}

// lockHolders maps the paths of state lock files that some process holds
// open (a live server's runtime holds its own until it closes) to one such
// process. A lock file deleted with its directory still counts: the
// kernel names it "<path> (deleted)".
func lockHolders() map[string]int {
	out := map[string]int{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join("/proc", p.Name(), "fd")
		fds, _ := os.ReadDir(fdDir)
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			target = strings.TrimSuffix(target, " (deleted)")
			if filepath.Base(target) == stateLockFile {
				out[target] = pid
			}
		}
	}
	return out
}

// cgroupTasks counts the tasks in the pids cgroup at dir, whichever pid
// namespace they are in (cgroup.procs lists only those this process can
// see); -1 when unknown.
func cgroupTasks(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "pids.current"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

// lockHolder is a process holding the state lock of stateDir open, by the
// path its socket was bound to or that path with symlinks resolved (what
// the kernel names an open file by), or 0.
func lockHolder(locks map[string]int, stateDir string) int {
	if pid := locks[filepath.Join(stateDir, stateLockFile)]; pid != 0 {
		return pid
	}
	if real, err := filepath.EvalSymlinks(stateDir); err == nil {
		return locks[filepath.Join(real, stateLockFile)]
	}
	return 0
}

// bootTime is when this host booted (btime in /proc/stat).
func bootTime() time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
}

// clockTicks is USER_HZ, which /proc/<pid>/stat counts start times in: 100
// on every Linux architecture Go supports.
const clockTicks = 100

// startTime is when process pid started.
func startTime(pid int, boot time.Time) (time.Time, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil || boot.IsZero() {
		return time.Time{}, false
	}
	// The command name may hold spaces and parentheses: fields count from
	// the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return time.Time{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	const startField = 22 - 3 // starttime is field 22; f starts at field 3
	if len(f) <= startField {
		return time.Time{}, false
	}
	ticks, err := strconv.ParseInt(f[startField], 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return boot.Add(time.Duration(ticks) * time.Second / clockTicks), true
}

func pathExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// Reaches reports whether addr, a sandbox's agent address, is one of this
// runtime's: a socket under its state directory. Another state
// directory's sandbox (another replica's) is out of its reach.
func (l *Local) Reaches(addr string) bool {
	sock, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return false
	}
	if strings.HasPrefix(sock, l.boxRoot+"/") {
		return true
	}
	// The same directory by another path (a symlink, a server restarted
	// with the state directory named otherwise).
	dir, err := filepath.EvalSymlinks(filepath.Dir(filepath.Dir(sock)))
	if err != nil {
		return false
	}
	root, err := filepath.EvalSymlinks(l.boxRoot)
	return err == nil && dir == root
}
