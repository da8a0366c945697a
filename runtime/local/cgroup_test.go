package local

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/runtime"
)

// TestCgroupsOnlySandboxControllers checks a live sandbox's cgroup files:
// its limits and device rules are written, its agent is in each cgroup it
// needs, and it has no cgroup in the hierarchies Orchard does not use.
func TestCgroupsOnlySandboxControllers(t *testing.T) {
	testenv.Require(t, "cgroup v1", !isCgroup2(), "the v1 hierarchies are what this checks")
	l := newLocal(t)
	create(t, l, runtime.Spec{ID: "cg", MemoryBytes: 96 << 20, CPU: 0.5, PidsLimit: 77})
	pid := strconv.Itoa(l.initPID(t, "cg"))
	dir := func(ctrl string) string { return filepath.Join("/sys/fs/cgroup", ctrl, l.cgroupPath("cg")) }

	cases := []struct {
		ctrl, file string
		check      func(content string) bool
	}{
		{"memory", "memory.limit_in_bytes", func(c string) bool { return c == strconv.Itoa(96<<20) }},
		{"cpu", "cpu.cfs_quota_us", func(c string) bool { return c == "50000" }},
		{"cpu", "cpu.cfs_period_us", func(c string) bool { return c == "100000" }},
		{"pids", "pids.max", func(c string) bool { return c == "77" }},
		// Only the allowed devices: /dev/null (c 1:3) yes, everything no.
		{"devices", "devices.list", func(c string) bool {
			lines := strings.Split(c, "\n")
			return slices.Contains(lines, "c 1:3 rwm") && !slices.Contains(lines, "a *:* rwm")
		}},
		{"freezer", "freezer.state", func(c string) bool { return c == "THAWED" }},
	}
	for _, tc := range cases {
		t.Run(tc.ctrl+"/"+tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(dir(tc.ctrl), tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if c := strings.TrimSpace(string(b)); !tc.check(c) {
				t.Errorf("%s = %q", tc.file, c)
			}
			procs, err := os.ReadFile(filepath.Join(dir(tc.ctrl), "cgroup.procs"))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(strings.Fields(string(procs)), pid) {
				t.Errorf("agent (pid %s) not in the %s cgroup: %q", pid, tc.ctrl, procs)
			}
		})
	}

	entries, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		// Co-mounted controllers ("cpu,cpuacct") are used through their
		// directory, which the symlinks beside it ("cpuacct") point to.
		used := slices.ContainsFunc(strings.Split(e.Name(), ","), func(c string) bool {
			return slices.Contains(sandboxControllers, c)
		})
		if used || e.Type()&os.ModeSymlink != 0 {
			continue
		}
		if _, err := os.Stat(dir(e.Name())); err == nil {
			t.Errorf("sandbox has a cgroup in the %s hierarchy", e.Name())
		}
	}
}
