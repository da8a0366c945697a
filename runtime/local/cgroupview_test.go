package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/orchard/orchard/runtime"
)

// TestSandboxSeesItsOwnCgroup reads, from inside sandboxes of several
// sizes, what a program sizing itself from its cgroup reads: its own
// limits at the usual paths, nothing of the host's or another sandbox's
// cgroups, and no way to write them.
func TestSandboxSeesItsOwnCgroup(t *testing.T) {
	gomaxprocs := buildGOMAXPROCS(t)
	l := newLocal(t, func(c *Config) { c.HostExpose = []string{filepath.Dir(gomaxprocs)} })
	cases := []struct {
		id     string
		memory int64
		cpu    float64
		pids   int64
	}{
		{"cg-small", 256 << 20, 0.5, 64},
		{"cg-one", 1 << 30, 1, 300},
		{"cg-big", 2 << 30, 4, 1000},
	}
	for _, tc := range cases {
		create(t, l, runtime.Spec{ID: tc.id, MemoryBytes: tc.memory, CPU: tc.cpu, PidsLimit: tc.pids})
	}
	read := func(t *testing.T, id, path string) string {
		t.Helper()
		out, code := l.execForTest(t, id, "/bin/cat", path)
		if code != 0 {
			t.Fatalf("cat %s: exit %d: %s", path, code, out)
		}
		return strings.TrimSpace(out)
	}
	for _, tc := range cases {
		t.Run(tc.id, func(t *testing.T) {
			var files map[string]string
			if isCgroup2() {
				files = map[string]string{
					"memory.max": strconv.FormatInt(tc.memory, 10),
					"cpu.max":    strconv.Itoa(int(tc.cpu*cpuPeriod)) + " " + strconv.Itoa(cpuPeriod),
					"pids.max":   strconv.FormatInt(tc.pids, 10),
				}
			} else {
				files = map[string]string{
					"memory/memory.limit_in_bytes": strconv.FormatInt(tc.memory, 10),
					"cpu/cpu.cfs_quota_us":         strconv.Itoa(int(tc.cpu * cpuPeriod)),
					"cpu/cpu.cfs_period_us":        strconv.Itoa(cpuPeriod),
					"pids/pids.max":                strconv.FormatInt(tc.pids, 10),
				}
			}
			for f, want := range files {
				if got := read(t, tc.id, filepath.Join(cgroupFS, f)); got != want {
					t.Errorf("%s = %q; want %q", f, got, want)
				}
			}

			// Nothing below the sandbox's own cgroup: no other sandbox,
			// nothing of the host.
			out, code := l.execForTest(t, tc.id, "/usr/bin/find", cgroupFS, "-mindepth", "1", "-type", "d")
			if code != 0 {
				t.Fatalf("find: exit %d: %s", code, out)
			}
			for _, d := range strings.Fields(out) {
				if strings.Count(strings.TrimPrefix(d, cgroupFS+"/"), "/") > 0 || isCgroup2() {
					t.Errorf("sandbox sees a cgroup below its own: %s", d)
				}
				for _, other := range cases {
					if other.id != tc.id && strings.Contains(d, other.id) {
						t.Errorf("sandbox %s sees %s's cgroup: %s", tc.id, other.id, d)
					}
				}
			}
			if !isCgroup2() {
				for _, ctrl := range []string{"blkio", "cpuset", "systemd"} {
					if _, code := l.execForTest(t, tc.id, "/usr/bin/test", "-e", filepath.Join(cgroupFS, ctrl)); code == 0 {
						t.Errorf("sandbox sees the host's %s hierarchy", ctrl)
					}
				}
			}

			// Read-only, even for root in the sandbox.
			limit := "memory/memory.limit_in_bytes"
			if isCgroup2() {
				limit = "memory.max"
			}
			for _, script := range []string{
				"echo 9999999999 > " + filepath.Join(cgroupFS, limit),
				"mkdir " + filepath.Join(cgroupFS, "x"),
				"mount -o remount,rw " + cgroupFS,
			} {
				if out, code := l.execForTest(t, tc.id, "/bin/sh", "-c", script); code == 0 {
					t.Errorf("%q succeeded: %s", script, out)
				}
			}
			if got := read(t, tc.id, filepath.Join(cgroupFS, limit)); got != strconv.FormatInt(tc.memory, 10) {
				t.Errorf("limit after the write attempt = %s", got)
			}

			// Runtimes find their cgroup by matching /proc/self/cgroup against
			// the cgroup mounts' roots in mountinfo: both must be "/".
			if !isCgroup2() {
				self := read(t, tc.id, "/proc/self/cgroup")
				if !strings.Contains(self, ":cpu:/\n") && !strings.HasSuffix(self, ":cpu:/") {
					t.Errorf("/proc/self/cgroup: %s", self)
				}
				mi := read(t, tc.id, "/proc/self/mountinfo")
				var root string
				for _, line := range strings.Split(mi, "\n") {
					if f := strings.Fields(line); len(f) > 4 && f[4] == filepath.Join(cgroupFS, "cpu") {
						root = f[3]
					}
				}
				if root != "/" {
					t.Errorf("the cpu cgroup mount's root in mountinfo = %q; want /", root)
				}
			}

			// What Go makes of it: the CPU limit rounded up, at least 2 (Go's
			// own floor), at most the host's CPUs.
			want := min(max(int(tc.cpu+0.999), 2), hostCPUs(t))
			out, code = l.execForTest(t, tc.id, gomaxprocs)
			if got := strings.TrimSpace(out); code != 0 || got != strconv.Itoa(want) {
				t.Errorf("GOMAXPROCS = %q (exit %d); want %d", got, code, want)
			}
		})
	}
}

// buildGOMAXPROCS builds a static program printing its default GOMAXPROCS.
func buildGOMAXPROCS(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	prog := "package main\n\nimport (\n\t\"fmt\"\n\t\"runtime\"\n)\n\nfunc main() { fmt.Println(runtime.GOMAXPROCS(0)) }\n"
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "gomaxprocs")
	cmd := exec.Command("go", "build", "-o", bin, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GO111MODULE=off")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func hostCPUs(t *testing.T) int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
