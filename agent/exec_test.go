package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

func TestExec(t *testing.T) {
	t.Parallel()
	cwd := t.TempDir()
	a := startAgent(t, func(c *Config) {
		c.Cwd = cwd
		c.Env = append(os.Environ(), "PYTHONPATH=/agent/lib", "LD_LIBRARY_PATH=/agent/so", "AGENT_VAR=kept")
	})
	other := t.TempDir()

	tests := []struct {
		name       string
		req        api.AgentExecRequest
		stdout     string
		stderr     string
		code       int
		signal     int
		truncated  bool
		wantEvents int // at least
	}{
		{name: "stdout and stderr apart", req: api.AgentExecRequest{Command: "echo out; echo err >&2"}, stdout: "out\n", stderr: "err\n"},
		{name: "exit code", req: api.AgentExecRequest{Command: "echo x; exit 3"}, stdout: "x\n", code: 3},
		{name: "killed by signal", req: api.AgentExecRequest{Command: "kill -9 $$"}, code: -9, signal: 9},
		{name: "bash turns a child's signal into 128+n", req: api.AgentExecRequest{Command: "sh -c 'kill -15 $$'; exit $?"}, stderr: "Terminated\n", code: 143},
		{name: "default cwd", req: api.AgentExecRequest{Command: "pwd"}, stdout: cwd + "\n"},
		{name: "explicit cwd", req: api.AgentExecRequest{Command: "pwd", Cwd: other}, stdout: other + "\n"},
		{
			name:   "env overlaid, interpreter vars stripped",
			req:    api.AgentExecRequest{Command: `echo "$FOO|${PYTHONPATH-unset}|${LD_LIBRARY_PATH-unset}|$AGENT_VAR"`, Env: map[string]string{"FOO": "bar baz"}},
			stdout: "bar baz|unset|unset|kept\n",
		},
		{
			name:   "request env may set a stripped var",
			req:    api.AgentExecRequest{Command: `echo "$PYTHONPATH"`, Env: map[string]string{"PYTHONPATH": "/mine"}},
			stdout: "/mine\n",
		},
		{name: "stdin is empty", req: api.AgentExecRequest{Command: "cat; echo end"}, stdout: "end\n"},
		{name: "invalid UTF-8 passes raw", req: api.AgentExecRequest{Command: `printf '\xff\xfe\x00ok'; printf '\xc3' >&2`}, stdout: "\xff\xfe\x00ok", stderr: "\xc3"},
		{
			name:      "truncation marker",
			req:       api.AgentExecRequest{Command: "head -c 5000 /dev/zero | tr '\\0' a; echo tail >&2", MaxOutputBytes: 1000},
			stdout:    strings.Repeat("a", 1000) + "\n[orchard: output truncated after 1000 bytes]\n",
			stderr:    "tail\n",
			truncated: true,
		},
		{
			name:   "login shell filters tty noise",
			req:    api.AgentExecRequest{Command: "echo hi; echo real >&2", LoginShell: true},
			stdout: "hi\n",
			stderr: "real\n",
		},
		{
			name:   "login shell drops import tracebacks",
			req:    api.AgentExecRequest{LoginShell: true, Command: `printf 'Traceback (most recent call last):\n  File "x", line 1\nModuleNotFoundError: No module named y\nafter\n' >&2`},
			stderr: "after\n",
		},
		{
			name:   "non-login stderr is verbatim",
			req:    api.AgentExecRequest{Command: `echo 'bash: no job control in this shell' >&2`},
			stderr: "bash: no job control in this shell\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := a.exec(t, tt.req)
			if string(r.stdout) != tt.stdout {
				t.Errorf("stdout = %q, want %q", r.stdout, tt.stdout)
			}
			if string(r.stderr) != tt.stderr {
				t.Errorf("stderr = %q, want %q", r.stderr, tt.stderr)
			}
			want := api.ExecExit{ExitCode: tt.code, Signal: tt.signal, Truncated: tt.truncated}
			if r.exit != want {
				t.Errorf("exit = %+v, want %+v", r.exit, want)
			}
		})
	}
}

// An explicit cwd that is not a directory fails the request before the
// command starts (Orchard Env would run the command in "/"); a default one
// that the image lacks still becomes "/".
func TestExecCwd(t *testing.T) {
	t.Parallel()
	other := t.TempDir()
	notDir := filepath.Join(other, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(other, "ran")
	a := startAgent(t, nil)
	noDefault := startAgent(t, func(c *Config) { c.Cwd = filepath.Join(other, "absent") })

	tests := []struct {
		name   string
		a      *testAgent
		cwd    string
		status int
		cat    faults.Category
		code   string
		msg    string
	}{
		{"missing", a, "/no/such/dir", 404, faults.NotFound, faults.CodePathNotFound, "Working directory not found: /no/such/dir"},
		{"a file", a, notDir, 400, faults.InvalidRequest, faults.CodeNotDirectory, "Working directory is not a directory: " + notDir},
		{"under a file", a, notDir + "/sub", 404, faults.NotFound, faults.CodePathNotFound, "Working directory not found: " + notDir + "/sub"},
		{"missing, with a default that is missing too", noDefault, "/no/such/dir", 404, faults.NotFound, faults.CodePathNotFound, "Working directory not found: /no/such/dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.a.Exec(context.Background(), api.AgentExecRequest{Command: "touch " + marker, Cwd: tt.cwd}, nil)
			f := wantFault(t, err, tt.status, tt.cat, tt.code)
			if f.Message != tt.msg {
				t.Errorf("message %q, want %q", f.Message, tt.msg)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the command ran")
			}
		})
	}
	if r := noDefault.exec(t, api.AgentExecRequest{Command: "pwd"}); string(r.stdout) != "/\n" {
		t.Errorf("a missing default cwd: pwd = %q, want /", r.stdout)
	}
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	start := time.Now()
	r := a.exec(t, api.AgentExecRequest{
		Command:        "sleep 30 & echo bg=$!; echo partial; echo progress >&2; sleep 30",
		TimeoutSeconds: 1,
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("timeout took %v", d)
	}
	if r.exit != (api.ExecExit{ExitCode: 124, TimedOut: true}) {
		t.Errorf("exit = %+v", r.exit)
	}
	if !strings.Contains(string(r.stdout), "partial\n") {
		t.Errorf("partial stdout lost: %q", r.stdout)
	}
	if want := "progress\n\nCommand timed out after 1s and was killed"; string(r.stderr) != want {
		t.Errorf("stderr = %q, want %q", r.stderr, want)
	}
	m := regexp.MustCompile(`bg=(\d+)`).FindSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no background pid in %q", r.stdout)
	}
	pid, _ := strconv.Atoi(string(m[1]))
	processGone(t, pid, 3*time.Second)
}

func TestExecDisconnectKillsGroup(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pids := make(chan int, 1)
	_, err := a.Exec(ctx, api.AgentExecRequest{Command: "sleep 30 & echo $!; wait"}, func(ev api.ExecEvent) {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(ev.Data))); err == nil {
			pids <- pid
			cancel()
		}
	})
	if err == nil {
		t.Fatal("Exec after cancel returned no error")
	}
	processGone(t, <-pids, 3*time.Second)
}

func TestExecStreams(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	start := time.Now()
	var first time.Duration
	exit, err := a.Exec(context.Background(), api.AgentExecRequest{Command: "echo first; sleep 1; echo second"}, func(ev api.ExecEvent) {
		if first == 0 {
			first = time.Since(start)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	total := time.Since(start)
	if exit.ExitCode != 0 || total-first < 700*time.Millisecond {
		t.Fatalf("first output after %v, exit %+v after %v: output was not streamed", first, exit, total)
	}
}

// A background job that keeps the pipes open must not hold the request
// until it ends.
func TestExecBackgroundJobDoesNotHold(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	start := time.Now()
	r := a.exec(t, api.AgentExecRequest{Command: "sleep 5 & echo $!"})
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("exec took %v", d)
	}
	if r.exit.ExitCode != 0 {
		t.Errorf("exit = %+v", r.exit)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
	if pid > 0 {
		// Not ours to kill, but do not leave it behind the test.
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func TestExecBashMissing(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) { c.Env = []string{"PATH=" + t.TempDir()} })
	r := a.exec(t, api.AgentExecRequest{Command: "echo hi"})
	if r.exit.ExitCode != 127 || r.exit.SpawnError == "" {
		t.Fatalf("exit = %+v", r.exit)
	}
	if !strings.Contains(string(r.stderr), "bash") || string(r.stderr) != r.exit.SpawnError {
		t.Fatalf("stderr = %q, spawn error %q", r.stderr, r.exit.SpawnError)
	}
}

// Many short commands at once: every exit status must reach its request
// (none stolen by the reaper or lost to a registration race).
func TestExecConcurrentExits(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			exit, err := a.Exec(context.Background(), api.AgentExecRequest{Command: fmt.Sprintf("exit %d", i%7)}, nil)
			if err != nil {
				t.Error(err)
				return
			}
			if exit.ExitCode != i%7 {
				t.Errorf("command %d: exit %d", i, exit.ExitCode)
			}
		})
	}
	wg.Wait()
}

// A command that double-forks leaves an orphan that reparents to the agent
// (PID 1 or subreaper); once it ends it must be reaped, not left a zombie.
func TestReaperNoZombie(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	r := a.exec(t, api.AgentExecRequest{Command: "(sleep 0.3 >/dev/null 2>&1 & echo $!)"})
	pid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
	if err != nil {
		t.Fatalf("stdout %q: %v", r.stdout, err)
	}
	// While it runs, its parent must be us: that is what makes it ours to reap.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] != strconv.Itoa(os.Getpid()) {
			t.Errorf("orphan's parent is %s, want %d", f[1], os.Getpid())
		}
	}
	processGone(t, pid, 3*time.Second)
}

func TestStderrFilter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   []string // chunks
		want string
	}{
		{"plain", []string{"a\nb\n"}, "a\nb\n"},
		{"noise dropped", []string{"bash: cannot set terminal process group (-1): Inappropriate ioctl\nbash: no job control in this shell\nreal\n"}, "real\n"},
		{"noise split across chunks", []string{"bash: no job con", "trol in this shell\nx", "y\n"}, "xy\n"},
		{"last line without newline", []string{"a\nb"}, "a\nb"},
		{"import traceback dropped", []string{"Traceback (most recent call last):\n  File \"a\", line 1\n    import q\nImportError: no q\nok\n"}, "ok\n"},
		{"other traceback kept", []string{"Traceback (most recent call last):\n  File \"a\"\nValueError: v\nok\n"}, "Traceback (most recent call last):\n  File \"a\"\nValueError: v\nok\n"},
		{"unfinished traceback kept", []string{"Traceback (most recent call last):\n  File \"a\"\n"}, "Traceback (most recent call last):\n  File \"a\"\n"},
		{"long line passes", []string{strings.Repeat("x", maxFilterLine+10), "y\n"}, strings.Repeat("x", maxFilterLine+10) + "y\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var f stderrFilter
			var out []byte
			for _, c := range tt.in {
				out = append(out, f.write([]byte(c))...)
			}
			out = append(out, f.flush()...)
			if string(out) != tt.want {
				t.Fatalf("filtered = %q, want %q", out, tt.want)
			}
		})
	}
}
