package server_test

import (
	"os"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testserver"
)

func TestIsolation(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	a := createReady(t, srv, map[string]any{"memory": "256Mi"})
	b := createReady(t, srv, map[string]any{"memory": "256Mi"})

	probe, err := os.CreateTemp("/root", "orchard-mask-probe-")
	if err != nil {
		t.Fatal(err)
	}
	probe.Close()
	t.Cleanup(func() { os.Remove(probe.Name()) })

	execWait(t, srv, a, map[string]any{"command": "echo secret > /workspace/secret; sleep 300 >/dev/null 2>&1 &"})

	cases := []struct {
		name, cmd string
		check     func(stdout string) bool
	}{
		{"no egress, fails at once", "timeout 3 bash -c 'echo > /dev/tcp/192.0.2.1/80' 2>&1; echo rc=$?",
			func(o string) bool { return strings.Contains(o, "rc=1") && strings.Contains(o, "unreachable") }},
		{"loopback only", "ls /sys/class/net", func(o string) bool { return strings.TrimSpace(o) == "lo" }},
		{"host /root masked", "ls -a /root", func(o string) bool { return !strings.Contains(o, "orchard-mask-probe") }},
		{"host /tmp masked", "ls -a /tmp | wc -l", func(o string) bool { return strings.TrimSpace(o) == "2" }},
		{"host TLS keys masked", "ls -A /etc/ssl/private 2>/dev/null | wc -l", func(o string) bool { return strings.TrimSpace(o) == "0" }},
		{"other sandbox's files invisible", "ls /workspace", func(o string) bool { return !strings.Contains(o, "secret") }},
		{"other sandbox's processes invisible", "ps -e -o comm= | sort -u | tr '\\n' ' '", func(o string) bool { return !strings.Contains(o, "sleep") }},
		{"own pid namespace", "cat /proc/1/cmdline | tr '\\0' ' '", func(o string) bool { return strings.Contains(o, "agent") }},
		{"hostname", "hostname", func(o string) bool { return strings.TrimSpace(o) == "sandbox-"+b }},
		{"root fs read-only below, writable above", "echo x > /usr/orchard-probe && rm /usr/orchard-probe && echo ok", func(o string) bool { return strings.TrimSpace(o) == "ok" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := execWait(t, srv, b, map[string]any{"command": tc.cmd})
			if !tc.check(j.Stdout) {
				t.Fatalf("%s: stdout %q stderr %q exit %v", tc.cmd, j.Stdout, j.Stderr, j.ExitCode)
			}
		})
	}
	// A write in a sandbox never reaches the host.
	if _, err := os.Stat("/usr/orchard-probe"); err == nil {
		t.Fatal("sandbox write reached the host root")
	}
}

func TestMemoryBombIsOOM(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "64Mi"})
	j := execWait(t, srv, id, map[string]any{"command": "x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo survived", "timeout_seconds": 60})
	if j.Status != "failed" || j.Fault == nil || j.Fault.Code != "sandbox.oom" {
		t.Fatalf("memory bomb: status=%s exit=%v fault=%+v stderr=%q", j.Status, j.ExitCode, j.Fault, j.Stderr)
	}
	// The sandbox stays usable.
	if j := execWait(t, srv, id, map[string]any{"command": "echo alive"}); j.Stdout != "alive\n" {
		t.Fatalf("after OOM: %+v", j)
	}
}

func TestForkBombContained(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "512Mi"})
	j := execWait(t, srv, id, map[string]any{"command": "bomb() { bomb | bomb; }; bomb", "timeout_seconds": 3})
	if j.Status != "failed" || j.ExitCode == nil || *j.ExitCode != 124 {
		t.Fatalf("fork bomb job: status=%s exit=%v", j.Status, j.ExitCode)
	}
	// Contained: the sandbox answers again once the group is killed.
	j = execWait(t, srv, id, map[string]any{"command": "echo alive", "timeout_seconds": 30})
	if j.Stdout != "alive\n" {
		t.Fatalf("after fork bomb: status=%s stdout=%q stderr=%q", j.Status, j.Stdout, j.Stderr)
	}
	// A bomb that detaches outlives its command and holds the pids limit:
	// the next command cannot start, and says so with a classified fault.
	execWait(t, srv, id, map[string]any{"command": "bomb() { bomb | bomb & }; bomb; sleep 2"})
	j = execWait(t, srv, id, map[string]any{"command": "echo alive"})
	if j.Status == "failed" && (j.Fault == nil || j.Fault.Code != "sandbox.pids_limit") {
		t.Fatalf("spawn under an exhausted pids limit: %+v fault=%+v", j, j.Fault)
	}
	// Deleting such a sandbox still removes everything.
	want(t, call(t, srv, "DELETE", "/sandboxes/"+id, nil), 200)
}

func TestRestartReattaches(t *testing.T) {
	dir := testserver.StateDir(t)
	first := testserver.Start(t, testserver.Options{StateDir: dir})
	id := createReady(t, first, map[string]any{"ephemeral_storage": "1Gi"})
	execWait(t, first, id, map[string]any{"command": "echo kept > /workspace/state"})
	r := call(t, first, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "sleep 60"})
	want(t, r, 200)
	first.Stop(t, false)

	second := testserver.Start(t, testserver.Options{StateDir: dir})
	g := call(t, second, "GET", "/sandboxes/"+id, nil)
	want(t, g, 200)
	if g.body["status"] != "ready" || g.body["ephemeral_storage"] != "1Gi" {
		t.Fatalf("after restart: %s", g.raw)
	}
	if j := execWait(t, second, id, map[string]any{"command": "cat /workspace/state"}); j.Stdout != "kept\n" {
		t.Fatalf("state after restart: %+v", j)
	}
	want(t, call(t, second, "DELETE", "/sandboxes/"+id, nil), 200)
}
