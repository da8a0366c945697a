package local

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/internal/testenv"
	"github.com/orchard/orchard/runtime"
)

// requireSeccomp skips (or fails, see testenv.Require) unless this test
// binary was built with seccomp support.
func requireSeccomp(t *testing.T) {
	t.Helper()
	testenv.Require(t, "seccomp", seccompEnabled,
		"built without seccomp support: use -tags seccomp, cgo and libseccomp-dev")
}

func TestNewReportsMissingSeccomp(t *testing.T) {
	agent := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agent, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	l, err := New(Config{StateDir: t.TempDir(), AgentPath: agent, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	warned := strings.Contains(logs.String(), "without a syscall filter")
	if seccompEnabled && (l.seccomp == nil || warned) {
		t.Errorf("seccomp compiled in: filter %v, warning logged %v; want a filter and no warning", l.seccomp != nil, warned)
	}
	if !seccompEnabled && (l.seccomp != nil || !warned) {
		t.Errorf("seccomp not compiled in: filter %v, warning logged %v; want no filter and a warning", l.seccomp != nil, warned)
	}
}

func TestSeccompProfile(t *testing.T) {
	requireSeccomp(t)
	p, err := sandboxSeccomp()
	if err != nil {
		t.Fatal(err)
	}
	if p.DefaultAction != configs.Errno || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != uint(unix.EPERM) {
		t.Errorf("default action = %v (errno %v); want errno EPERM", p.DefaultAction, p.DefaultErrnoRet)
	}
	// Names allowed whatever their arguments.
	allowed := map[string]bool{}
	for _, s := range p.Syscalls {
		if s.Action == configs.Allow && len(s.Args) == 0 {
			allowed[s.Name] = true
		}
	}
	// chroot needs CAP_SYS_CHROOT, which sandboxes have; the rest need
	// capabilities they lack (mount, unshare, setns: CAP_SYS_ADMIN) or are
	// denied to every container (keyrings are not namespaced).
	for name, want := range map[string]bool{
		"read": true, "execve": true, "clone": false, "chroot": true,
		"mount": false, "unshare": false, "setns": false, "bpf": false,
		"keyctl": false, "add_key": false, "reboot": false, "init_module": false,
	} {
		if allowed[name] != want {
			t.Errorf("%s allowed = %v; want %v", name, allowed[name], want)
		}
	}
}

func TestSeccompInSandbox(t *testing.T) {
	requireSeccomp(t)
	l := newLocal(t)
	create(t, l, runtime.Spec{ID: "seccomp"})

	t.Run("Filtered", func(t *testing.T) {
		// The agent (the container's init) and a process entering the
		// sandbox from outside both run in filter mode.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", l.initPID(t, "seccomp")))
		if err != nil {
			t.Fatal(err)
		}
		checkFiltered(t, "agent", string(b))
		out, code := l.execForTest(t, "seccomp", "cat", "/proc/self/status")
		if code != 0 {
			t.Fatalf("cat /proc/self/status: %d %s", code, out)
		}
		checkFiltered(t, "process in sandbox", out)
	})

	t.Run("Denied", func(t *testing.T) {
		// Each is allowed by the kernel without any capability (it works
		// in a sandbox without seccomp), so only the filter stops it.
		for _, cmd := range []string{
			"unshare --user true",                            // unshare(CLONE_NEWUSER)
			"unshare --user --map-root-user true",            // the same, then uid maps
			`setarch "$(uname -m)" --addr-no-randomize true`, // personality(ADDR_NO_RANDOMIZE)
		} {
			out, code := l.execForTest(t, "seccomp", "sh", "-c", cmd+" 2>&1")
			if code == 0 || !strings.Contains(out, "Operation not permitted") {
				t.Errorf("%s: exit %d, output %q; want EPERM", cmd, code, out)
			}
		}
		// keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0): keyrings
		// are not namespaced, so the profile denies the whole family.
		if _, err := exec.LookPath("perl"); err != nil {
			t.Log("no perl: keyctl not checked")
			return
		}
		script := fmt.Sprintf(`my $r = syscall(%d, 0, -3, 0); print $r < 0 ? "errno=".($!+0) : "ok", "\n"`, unix.SYS_KEYCTL)
		out, _ := l.execForTest(t, "seccomp", "perl", "-e", script)
		if want := "errno=" + strconv.Itoa(int(unix.EPERM)); strings.TrimSpace(out) != want {
			t.Errorf("keyctl in sandbox: %q; want %s", out, want)
		}
	})

	t.Run("NormalWorkRuns", func(t *testing.T) {
		// Forks, a pipe, a subshell, background jobs, file I/O and the
		// syscalls the profile allows only with arguments (clone flags,
		// personality) all in one shell session.
		script := `set -e
ls / >/dev/null
n=$(printf 'a\nb\nc\n' | sort -r | head -n 1)
(echo sub > /tmp/f) && read -r line < /tmp/f
sleep 0.01 & wait $!
setarch "$(uname -m)" true
echo "ok $n $line"`
		out, code := l.execForTest(t, "seccomp", "bash", "-c", script)
		if code != 0 || strings.TrimSpace(out) != "ok c sub" {
			t.Errorf("bash in sandbox: exit %d, output %q; want \"ok c sub\"", code, out)
		}
	})
}

// checkFiltered fails unless status (a /proc/<pid>/status) shows seccomp in
// filter mode with at least one filter.
func checkFiltered(t *testing.T, who, status string) {
	t.Helper()
	fields := map[string]string{}
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	if fields["Seccomp"] != "2" {
		t.Errorf("%s: Seccomp = %q; want 2 (filter mode)", who, fields["Seccomp"])
	}
	if n, err := strconv.Atoi(fields["Seccomp_filters"]); err != nil || n < 1 {
		t.Errorf("%s: Seccomp_filters = %q; want 1 or more", who, fields["Seccomp_filters"])
	}
}
