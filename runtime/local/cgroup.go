package local

import (
	"fmt"
	"slices"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
)

// sandboxControllers are the cgroup v1 hierarchies a sandbox gets a cgroup
// in: those its limits live in, and the freezer that teardown stops forks
// with. In the others (cpuset, cpuacct, blkio, name=systemd, the hybrid
// unified one, ...) Orchard sets nothing and reads nothing, and a cgroup
// there only costs a mkdir, an attach and an rmdir per sandbox.
var sandboxControllers = []string{"memory", "cpu", "pids", "devices", "freezer"}

// joinOnlySandboxControllers keeps c, a container not yet started, out of
// every cgroup v1 hierarchy but sandboxControllers. libcontainer takes no
// list of controllers: its v1 manager makes a cgroup in every mounted
// hierarchy, from a map of paths it hands out by reference through
// State().CgroupPaths. Deleting entries from that map before the first
// start is the one way to narrow it without patching libcontainer; the
// paths it keeps are saved in the container's state, so a server restart,
// exec (setns) and teardown use the same narrow set. It reports whether
// the set was narrowed: false when libcontainer stopped sharing the map, and
// sandboxes then get a cgroup everywhere, as before (slower, no less
// isolated).
func joinOnlySandboxControllers(c *libcontainer.Container) (bool, error) {
	if cgroups.IsCgroup2UnifiedMode() {
		return true, nil // one hierarchy
	}
	st, err := c.State()
	if err != nil {
		return false, fmt.Errorf("container state: %w", err)
	}
	for name := range st.CgroupPaths {
		if !slices.Contains(sandboxControllers, name) {
			delete(st.CgroupPaths, name)
		}
	}
	st, err = c.State()
	if err != nil {
		return false, fmt.Errorf("container state: %w", err)
	}
	return len(st.CgroupPaths) <= len(sandboxControllers), nil
}
