package local

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/cgroups"
)

// reapStrays tears down the sandboxes this state directory's runtime
// started and no longer has any record of: their state was removed while
// they ran (a state directory wiped by hand with the server stopped), so
// no later runtime could re-attach to them or delete them, and they would
// run until the machine stops.
//
// Every runtime's sandboxes share the cgroup parent, so a cgroup without
// state here may as well be another state directory's. A sandbox is this
// runtime's when its agent still holds the listening socket that a
// runtime of this state directory bound for that id: the kernel keeps the
// path a unix socket was bound to for as long as the socket lives, even
// once the file is gone. Sandboxes of other state directories, and
// cgroups without a process to ask, are left alone.
func (l *Local) reapStrays(ctx context.Context) {
	parent := pidsCgroup(l.cfg.CgroupParent)
	if parent == "" {
		return // no pids hierarchy mounted
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		return // no sandbox was ever made under this parent
	}
	var socks map[string]string // socket inode → bound path, read once
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !idPattern.MatchString(id) || l.recorded(id) {
			continue
		}
		if socks == nil {
			socks = unixSockets()
		}
		if !holdsSocket(filepath.Join(parent, id), socks, l.sockPath(id)) {
			continue
		}
		l.log.Warn("removing a sandbox of this state directory whose state is gone", "sandbox_id", id)
		s := &sandbox{id: id, dir: l.sandboxDir(id)}
		s.op.Lock()
		err := l.teardown(ctx, s)
		s.op.Unlock()
		if err != nil {
			l.log.Warn("remove stray sandbox", "sandbox_id", id, "err", err)
		}
	}
}

// recorded reports whether the state directory still has anything of
// sandbox id: then lookup re-attaches to it or Delete removes it.
func (l *Local) recorded(id string) bool {
	for _, p := range []string{l.sandboxDir(id), filepath.Join(l.ctrRoot, id)} {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	return false
}

// pidsCgroup is the directory of cgroup path in the pids hierarchy (every
// sandbox has a pids cgroup), or in the unified hierarchy on cgroup v2;
// found as memoryMount finds the memory hierarchy.
func pidsCgroup(path string) string {
	if cgroups.IsCgroup2UnifiedMode() {
		return filepath.Join("/sys/fs/cgroup", path)
	}
	mnt, err := cgroups.FindCgroupMountpoint("", "pids")
	if err != nil {
		return ""
	}
	return filepath.Join(mnt, path)
}

// unixSockets maps the inodes of this network namespace's unix sockets to
// the paths they were bound to.
func unixSockets() map[string]string {
	out := map[string]string{}
	f, err := os.Open("/proc/self/net/unix")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode [Path]
		fields := strings.Fields(sc.Text())
		if len(fields) >= 8 && strings.HasPrefix(fields[7], "/") {
			out[fields[6]] = fields[7]
		}
	}
	return out
}

// holdsSocket reports whether the init of the cgroup at dir (the
// sandbox's agent, pid 1 of its namespace) has a descriptor on the unix
// socket bound to path. Only init's descriptors are read: a sandbox may
// hold a thousand processes with thousands of files each.
func holdsSocket(dir string, socks map[string]string, path string) bool {
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return false
	}
	for _, pid := range strings.Fields(string(procs)) {
		if _, err := strconv.Atoi(pid); err != nil || !nsInit(pid) {
			continue
		}
		fdDir := filepath.Join("/proc", pid, "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			return false
		}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			ino, ok := strings.CutPrefix(target, "socket:[")
			if ok && socks[strings.TrimSuffix(ino, "]")] == path {
				return true
			}
		}
		return false
	}
	return false
}

// nsInit reports whether process pid is pid 1 of its own pid namespace.
func nsInit(pid string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			return len(f) > 1 && f[len(f)-1] == "1"
		}
	}
	return false
}
