package local

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/agentclient"
	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/internal/testing/testenv"
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

// withoutPrecompiledSeccomp makes l's containers compile seccomp in their
// init, with libcontainer's code, as before compileSeccomp.
func withoutPrecompiledSeccomp(l *Local) {
	if l.seccompProg != nil {
		l.seccompProg.Close()
		l.seccompProg = nil
	}
}

// agentExecForTest runs command with bash through the sandbox's agent, as
// every command a sandbox runs, and returns its combined output and exit
// code.
func agentExecForTest(t testing.TB, l *Local, id, command string) (string, int) {
	t.Helper()
	c := agentclient.NewClient("unix:" + l.sockPath(id))
	defer c.Close()
	var out bytes.Buffer
	exit, err := c.Exec(ctxTimeout(t, time.Minute), api.AgentExecRequest{Command: command + " 2>&1", TimeoutSeconds: 60},
		func(ev api.ExecEvent) { out.Write(ev.Data) })
	if err != nil {
		t.Fatalf("exec %q in %s: %v", command, id, err)
	}
	return out.String(), exit.ExitCode
}

func TestSeccompInSandbox(t *testing.T) {
	requireSeccomp(t)
	for _, tc := range []struct {
		name string
		mod  func(*Local)
	}{
		{"Precompiled", func(*Local) {}},
		{"CompiledInInit", withoutPrecompiledSeccomp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLocal(t)
			if l.seccompProg == nil {
				t.Fatal("no precompiled seccomp program")
			}
			tc.mod(l)
			create(t, l, runtime.Spec{ID: "seccomp"})
			testSeccompInSandbox(t, l, "seccomp")
		})
	}
}

func testSeccompInSandbox(t *testing.T, l *Local, id string) {
	t.Run("Filtered", func(t *testing.T) {
		// The agent (the container's init) and what it runs are filtered,
		// by one filter: never both libcontainer's and the precompiled one.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", l.initPID(t, id)))
		if err != nil {
			t.Fatal(err)
		}
		checkFiltered(t, "agent", string(b))
		out, code := agentExecForTest(t, l, id, "cat /proc/self/status")
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
			out, code := agentExecForTest(t, l, id, cmd)
			if code == 0 || !strings.Contains(out, "Operation not permitted") {
				t.Errorf("%s: exit %d, output %q; want EPERM", cmd, code, out)
			}
		}
		if _, err := exec.LookPath("perl"); err != nil {
			t.Log("no perl: keyctl and the ENOSYS patch not checked")
			return
		}
		for _, c := range []struct {
			what, script, want string
		}{
			// keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0):
			// keyrings are not namespaced, so the profile denies the family.
			{"keyctl", fmt.Sprintf("syscall(%d, 0, -3, 0)", unix.SYS_KEYCTL), "errno=" + strconv.Itoa(int(unix.EPERM))},
			// A syscall number past every known one fails with ENOSYS, not
			// EPERM (runc's patch to the program), so that programs probing
			// for new syscalls fall back.
			{"unknown syscall", "syscall(1000, 0)", "errno=" + strconv.Itoa(int(unix.ENOSYS))},
		} {
			script := fmt.Sprintf(`my $r = %s; print $r < 0 ? "errno=".($!+0) : "ok", "\n"`, c.script)
			out, _ := agentExecForTest(t, l, id, "perl -e '"+script+"'")
			if strings.TrimSpace(out) != c.want {
				t.Errorf("%s in sandbox: %q; want %s", c.what, out, c.want)
			}
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
		out, code := agentExecForTest(t, l, id, script)
		if code != 0 || strings.TrimSpace(out) != "ok c sub" {
			t.Errorf("bash in sandbox: exit %d, output %q; want \"ok c sub\"", code, out)
		}
	})
}

// TestSeccompPrecompiledIsLibcontainers: the program every agent installs
// is, instruction for instruction, the one libcontainer loads in a
// container's init for the same profile.
func TestSeccompPrecompiledIsLibcontainers(t *testing.T) {
	requireSeccomp(t)
	l := newLocal(t)
	if l.seccompProg == nil {
		t.Fatal("no precompiled seccomp program")
	}
	st, err := l.seccompProg.Stat()
	if err != nil {
		t.Fatal(err)
	}
	pre := make([]byte, st.Size())
	if _, err := l.seccompProg.ReadAt(pre, 0); err != nil {
		t.Fatal(err)
	}
	withoutPrecompiledSeccomp(l)
	create(t, l, runtime.Spec{ID: "seccomp-lc"})
	lc, err := readFilterLocked(l.initPID(t, "seccomp-lc"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pre) < 8*100 || !bytes.Equal(pre, lc) {
		t.Errorf("precompiled program: %d instructions; libcontainer's in the sandbox: %d; want the same program",
			len(pre)/8, len(lc)/8)
	}
}

// readFilterLocked is readFilter from a locked OS thread, as ptrace needs.
func readFilterLocked(pid int) ([]byte, error) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	return readFilter(pid)
}

// checkFiltered fails unless status (a /proc/<pid>/status) shows seccomp in
// filter mode with exactly one filter of the sandbox's own.
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
	// One filter more than this process runs under: a sandbox must not
	// get both libcontainer's and the precompiled one.
	own := 0
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Seccomp_filters:"); ok {
				own, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
	}
	if n, err := strconv.Atoi(fields["Seccomp_filters"]); err != nil || n != own+1 {
		t.Errorf("%s: Seccomp_filters = %q; want %d", who, fields["Seccomp_filters"], own+1)
	}
}
