package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/internal/testing/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// cliTimeout bounds one command of the tests.
const cliTimeout = 2 * time.Minute

// cli runs the orchard command line against one test server. The commands
// write to os.Stdout and os.Stderr, which the tests swap, so CLI tests do
// not run in parallel.
type cli struct {
	t   *testing.T
	env map[string]string
	srv *testserver.Server
}

func newCLI(t *testing.T) *cli {
	srv := testserver.Start(t, testserver.Options{})
	return &cli{t: t, env: map[string]string{"ORCHARD_URL": srv.URL, "ORCHARD_API_KEY": srv.APIKey}, srv: srv}
}

// run runs the command with stdin as its standard input and returns what
// it wrote and its error.
func (c *cli) run(stdin string, args ...string) (stdout, stderr string, err error) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	return c.runCtx(ctx, stdin, args...)
}

// runCtx is run under ctx: its end is the interrupt main delivers on
// SIGINT.
func (c *cli) runCtx(ctx context.Context, stdin string, args ...string) (stdout, stderr string, err error) {
	c.t.Helper()
	dir := c.t.TempDir()
	files := make([]*os.File, 3)
	for i, name := range []string{"stdin", "stdout", "stderr"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			c.t.Fatal(err)
		}
		defer f.Close()
		files[i] = f
	}
	if _, err := io.WriteString(files[0], stdin); err != nil {
		c.t.Fatal(err)
	}
	if _, err := files[0].Seek(0, io.SeekStart); err != nil {
		c.t.Fatal(err)
	}
	oldIn, oldOut, oldErr := os.Stdin, os.Stdout, os.Stderr
	os.Stdin, os.Stdout, os.Stderr = files[0], files[1], files[2]
	err = run(ctx, args, func(k string) string { return c.env[k] })
	os.Stdin, os.Stdout, os.Stderr = oldIn, oldOut, oldErr
	out, _ := os.ReadFile(files[1].Name())
	errOut, _ := os.ReadFile(files[2].Name())
	return string(out), string(errOut), err
}

// mustRun runs a command that must succeed and returns its stdout.
func (c *cli) mustRun(args ...string) string {
	c.t.Helper()
	out, errOut, err := c.run("", args...)
	if err != nil {
		c.t.Fatalf("orchard %s: %v (stderr %q)", strings.Join(args, " "), err, errOut)
	}
	return out
}

func exitCodeOf(err error) int {
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	return -1
}

func TestCLI(t *testing.T) {
	c := newCLI(t)
	id := strings.TrimSpace(c.mustRun("sandbox", "create", "--wait", "--label", "suite=cli", "--label", "n=1"))
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("create printed %q, want an id", id)
	}

	t.Run("sandbox", func(t *testing.T) {
		out := c.mustRun("sandbox", "list", "--label", "suite=cli")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "ID STATUS IMAGE AGE" {
			t.Fatalf("list table:\n%s", out)
		}
		if f := strings.Fields(lines[1]); len(f) != 4 || f[0] != id || f[1] != api.StatusReady || f[2] != "host" {
			t.Fatalf("list row %q", lines[1])
		}
		if out := c.mustRun("sandbox", "list", "--label", "suite=other"); strings.Contains(out, id) {
			t.Fatalf("label filter ignored:\n%s", out)
		}
		var list []api.Sandbox
		if err := json.Unmarshal([]byte(c.mustRun("sandbox", "list", "--json")), &list); err != nil || len(list) != 1 || list[0].SandboxID != id {
			t.Fatalf("list --json = %+v, %v", list, err)
		}
		var sb api.Sandbox
		if err := json.Unmarshal([]byte(c.mustRun("sandbox", "get", id)), &sb); err != nil || sb.SandboxID != id || sb.Labels["n"] != "1" {
			t.Fatalf("get = %+v, %v", sb, err)
		}
		_, _, err := c.run("", "sandbox", "get", "nosuch")
		if err == nil || err.Error() != "Sandbox nosuch not found (sandbox.not_found)" {
			t.Fatalf("get unknown: %v; want the message with its code", err)
		}
	})

	t.Run("exec", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			args   []string
			code   int
			stdout string
			stderr string // substring
		}{
			{"stdout", []string{"--", "echo hi"}, 0, "hi\n", ""},
			{"stderr", []string{"--", "echo err >&2"}, 0, "", "err"},
			{"exit code", []string{"--", "exit 3"}, 3, "", ""},
			{"argv is quoted", []string{"printf", `%s|`, "a b", "it's"}, 0, "a b|it's|", ""},
			{"no dash dash", []string{"echo", "-n", "x"}, 0, "x", ""},
			{"env and cwd", []string{"--env", "A=1", "--env", "B=two words", "--cwd", "/tmp", "--", `echo "$A $B $(pwd)"`}, 0, "1 two words /tmp\n", ""},
			{"timeout", []string{"--timeout", "1", "--", "sleep 30"}, 124, "", "timed out"},
			{"signal", []string{"--", "kill -9 $$"}, 137, "", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var args []string
				if tc.args[0] == "--env" || tc.args[0] == "--timeout" {
					// flags come before the sandbox
					i := 0
					for i < len(tc.args) && tc.args[i] != "--" {
						i++
					}
					args = append(append(append([]string{"exec"}, tc.args[:i]...), id), tc.args[i:]...)
				} else {
					args = append([]string{"exec", id}, tc.args...)
				}
				out, errOut, err := c.run("", args...)
				if code := exitCodeOf(err); code != tc.code {
					t.Fatalf("exit %d (err %v, stderr %q), want %d", code, err, errOut, tc.code)
				}
				if out != tc.stdout || !strings.Contains(errOut, tc.stderr) {
					t.Fatalf("stdout %q stderr %q; want stdout %q, stderr containing %q", out, errOut, tc.stdout, tc.stderr)
				}
			})
		}
		t.Run("unknown sandbox", func(t *testing.T) {
			_, _, err := c.run("", "exec", "nosuch", "--", "true")
			if err == nil || !strings.HasSuffix(err.Error(), "(sandbox.not_found)") {
				t.Fatalf("err = %v", err)
			}
		})
	})

	t.Run("exec streams", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		oldOut := os.Stdout
		os.Stdout = w
		first := make(chan time.Time, 1)
		go func() {
			line, _ := bufio.NewReader(r).ReadString('\n')
			if line == "first\n" {
				first <- time.Now()
			}
			close(first)
			_, _ = io.Copy(io.Discard, r)
		}()
		start := time.Now()
		err = run(context.Background(), []string{"exec", id, "--", "echo first; sleep 3; echo second"},
			func(k string) string { return c.env[k] })
		end := time.Now()
		os.Stdout = oldOut
		w.Close()
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		at, ok := <-first
		if !ok {
			t.Fatal("first line never printed")
		}
		if end.Sub(at) < time.Second {
			t.Fatalf("first line printed %s after start, %s before the end: output is not streamed", at.Sub(start), end.Sub(at))
		}
	})

	t.Run("cp", func(t *testing.T) {
		dir := t.TempDir()
		data := make([]byte, 100_000)
		for i := range data {
			data[i] = byte(i * 7)
		}
		src := filepath.Join(dir, "src.bin")
		if err := os.WriteFile(src, data, 0o644); err != nil {
			t.Fatal(err)
		}
		c.mustRun("cp", src, id+":/workspace/in/src.bin")
		back := filepath.Join(dir, "back.bin")
		c.mustRun("cp", id+":/workspace/in/src.bin", back)
		if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
			t.Fatalf("round trip changed the bytes (%d back of %d)", len(got), len(data))
		}
		// A remote directory path takes the local name; a local directory
		// takes the remote one.
		c.mustRun("cp", src, id+":/tmp/")
		into := filepath.Join(dir, "into")
		if err := os.Mkdir(into, 0o755); err != nil {
			t.Fatal(err)
		}
		c.mustRun("cp", id+":/tmp/src.bin", into)
		if got, _ := os.ReadFile(filepath.Join(into, "src.bin")); !bytes.Equal(got, data) {
			t.Fatal("directory targets: bytes differ")
		}
		// - is stdin and stdout.
		if _, errOut, err := c.run("piped\x00bytes\n", "cp", "-", id+":/workspace/piped"); err != nil {
			t.Fatalf("cp from stdin: %v %s", err, errOut)
		}
		if out := c.mustRun("cp", id+":/workspace/piped", "-"); out != "piped\x00bytes\n" {
			t.Fatalf("cp to stdout = %q", out)
		}
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"cp", id + ":/workspace/nosuch", filepath.Join(dir, "x")}, "(file.not_found)"},
			{[]string{"cp", src, filepath.Join(dir, "y")}, "exactly one of"},
			{[]string{"cp", id + ":/a", id + ":/b"}, "exactly one of"},
		} {
			if _, _, err := c.run("", tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("orchard %s: err %v, want %q", strings.Join(tc.args, " "), err, tc.want)
			}
		}
	})

	t.Run("shell", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			stdin string
			args  []string
			code  int
			out   string
		}{
			{"exit code", "", []string{"--", "sh", "-c", "exit 5"}, 5, ""},
			{"stdin through cat", "hello pty\n", []string{"--", "cat"}, 0, "hello pty"},
			{"partial last line", "no newline", []string{"--", "cat"}, 0, "no newline"},
			{"default login shell", "echo $0 in $(pwd)\nexit 4\n", nil, 4, "bash in /workspace"},
			{"killed", "", []string{"--", "sh", "-c", "kill -9 $$"}, 137, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				out, errOut, err := c.run(tc.stdin, append([]string{"shell", id}, tc.args...)...)
				if code := exitCodeOf(err); code != tc.code {
					t.Fatalf("exit %d (err %v, stderr %q, output %q), want %d", code, err, errOut, out, tc.code)
				}
				if !strings.Contains(out, tc.out) {
					t.Fatalf("output %q, want it to contain %q", out, tc.out)
				}
			})
		}
	})

	t.Run("rm", func(t *testing.T) {
		if out := c.mustRun("sandbox", "rm", id); strings.TrimSpace(out) != id {
			t.Fatalf("rm printed %q", out)
		}
		if _, _, err := c.run("", "sandbox", "get", id); err == nil || !strings.Contains(err.Error(), "sandbox.not_found") {
			t.Fatalf("get after rm: %v", err)
		}
	})
}

func TestCLIConnection(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		ok   bool
	}{
		{"orchard names", map[string]string{"ORCHARD_URL": srv.URL, "ORCHARD_API_KEY": srv.APIKey}, nil, true},
		{"sdk names", map[string]string{"SANDBOX_BASE_URL": srv.URL + "/", "SANDBOX_API_KEY": srv.APIKey}, nil, true},
		{"orchard names win", map[string]string{"ORCHARD_URL": srv.URL, "ORCHARD_API_KEY": srv.APIKey, "SANDBOX_BASE_URL": "http://127.0.0.1:1", "SANDBOX_API_KEY": "bad"}, nil, true},
		{"flags win", map[string]string{"ORCHARD_URL": "http://127.0.0.1:1", "ORCHARD_API_KEY": "bad"}, []string{"--url", srv.URL, "--api-key", srv.APIKey}, true},
		{"no key", map[string]string{"ORCHARD_URL": srv.URL}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &cli{t: t, env: tc.env}
			_, _, err := c.run("", append([]string{"sandbox", "list"}, tc.args...)...)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok && !strings.HasSuffix(err.Error(), "(client.missing_api_key)") {
				t.Fatalf("err = %v, want the missing key code", err)
			}
		})
	}
	t.Run("default URL", func(t *testing.T) {
		conn := &connection{getenv: func(string) string { return "" }}
		if got := conn.client().BaseURL(); got != defaultURL {
			t.Fatalf("default URL %q, want %q", got, defaultURL)
		}
	})
}

func TestCommandLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"ls -la | wc -l"}, "ls -la | wc -l"},
		{[]string{"ls", "-la", "/tmp"}, "ls -la /tmp"},
		{[]string{"echo", "a b", "it's", ""}, `echo 'a b' 'it'\''s' ''`},
		{[]string{"echo", "$HOME", "*"}, `echo '$HOME' '*'`},
	} {
		if got := commandLine(tc.argv); got != tc.want {
			t.Errorf("commandLine(%q) = %s, want %s", tc.argv, got, tc.want)
		}
	}
}

func TestSplitRemote(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		arg, id, path string
		remote        bool
	}{
		{"sb1:/workspace/x", "sb1", "/workspace/x", true},
		{"sb1:rel", "sb1", "rel", true},
		{"./a:b", "", "", false},
		{"/abs/a:b", "", "", false},
		{"plain", "", "", false},
		{"-", "", "", false},
		{":x", "", "", false},
		{"sb1:", "", "", false},
	} {
		id, p, remote := splitRemote(tc.arg)
		if id != tc.id || p != tc.path || remote != tc.remote {
			t.Errorf("splitRemote(%q) = %q, %q, %v", tc.arg, id, p, remote)
		}
	}
}

func TestEmit(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	p := emit(&b, "ab", "", false)
	p = emit(&b, "abc\uFFFD", p, false) // a character cut in half: held back
	p = emit(&b, "abcé", p, false)
	p = emit(&b, "abcé\uFFFD", p, true) // a real replacement at the end: printed
	if b.String() != "abcé\uFFFD" || p != "abcé\uFFFD" {
		t.Fatalf("emitted %q (%q)", b.String(), p)
	}
	// A login shell's stderr, re-joined at the end.
	b.Reset()
	p = emit(&b, "a\r\nb\r\n", "", false)
	emit(&b, "a\nb\ntail", p, true)
	if b.String() != "a\r\nb\r\ntail" {
		t.Fatalf("login stderr emitted as %q", b.String())
	}
}

func TestAge(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 5 * time.Second: "5s", 3 * time.Minute: "3m", 5 * time.Hour: "5h", 72 * time.Hour: "3d",
	} {
		if got := age(d); got != want {
			t.Errorf("age(%s) = %s, want %s", d, got, want)
		}
	}
}
