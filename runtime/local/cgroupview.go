package local

import (
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// cgroupFS is where a sandbox sees its own cgroups, as in any container.
const cgroupFS = "/sys/fs/cgroup"

// cgroupHierarchy is one cgroup v1 hierarchy a sandbox sees: the host's
// mount point of it and the name the sandbox sees it by.
type cgroupHierarchy struct {
	mountpoint string // on the host, e.g. /sys/fs/cgroup/memory
	name       string // under cgroupFS in the sandbox, e.g. memory or cpu,cpuacct
}

// cgroupHierarchies are the host's v1 hierarchies that hold a sandbox
// controller, read once: mounts do not move while the server runs. Nil on
// a v2 host.
func cgroupHierarchies() []cgroupHierarchy {
	if cgroups.IsCgroup2UnifiedMode() {
		return nil
	}
	mounts, err := cgroups.GetCgroupMounts(false)
	if err != nil {
		return nil
	}
	var hs []cgroupHierarchy
	for _, m := range mounts {
		if !slices.ContainsFunc(m.Subsystems, func(s string) bool { return slices.Contains(sandboxControllers, s) }) {
			continue
		}
		hs = append(hs, cgroupHierarchy{mountpoint: m.Mountpoint, name: filepath.Base(m.Mountpoint)})
	}
	slices.SortFunc(hs, func(a, b cgroupHierarchy) int { return strings.Compare(a.name, b.name) })
	return hs
}

// cgroupMounts show a sandbox its own cgroups read-only at /sys/fs/cgroup,
// so programs that size themselves from their limits (Go's GOMAXPROCS, the
// JVM, Node, build tools choosing -j) see the sandbox's, not the host's.
//
// On v2, libcontainer mounts cgroup2 inside the sandbox's cgroup namespace:
// its root is the sandbox's cgroup. On v1 it would mount every host
// hierarchy, and in those where the sandbox has no cgroup of its own
// (sandboxControllers) the namespace's root is the host's: so only the
// sandbox's own hierarchies are bound, each from its cgroup directory on
// the host. Inside the cgroup namespace the kernel shows such a bind's root
// as "/", as for a cgroup mounted there, which is what runtimes match
// /proc/self/cgroup against. The tmpfs holding them is made read-only by
// readonlyCgroupPaths, after the binds are in it.
func cgroupMounts(hs []cgroupHierarchy, cgroupPath string) []*configs.Mount {
	const flags = unix.MS_NOEXEC | unix.MS_NOSUID | unix.MS_NODEV
	if cgroups.IsCgroup2UnifiedMode() {
		return []*configs.Mount{{Source: "cgroup", Destination: cgroupFS, Device: "cgroup", Flags: flags | unix.MS_RDONLY}}
	}
	if len(hs) == 0 {
		return nil
	}
	ms := []*configs.Mount{{Source: "tmpfs", Destination: cgroupFS, Device: "tmpfs", Flags: flags, Data: "mode=755,size=64k"}}
	for _, h := range hs {
		ms = append(ms, &configs.Mount{
			Source:      filepath.Join(h.mountpoint, cgroupPath),
			Destination: filepath.Join(cgroupFS, h.name),
			Device:      "bind",
			Flags:       unix.MS_BIND | unix.MS_RDONLY | flags,
		})
	}
	return ms
}
