package agent

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
)

// runBoth runs cmd as the agent would (the direct path when directCommand
// allows it) and through `bash -c`, and fails on any difference in stdout,
// stderr or exit. It returns whether the direct path was taken.
func runBoth(t *testing.T, s *Server, cmd string, env []string, dir string) bool {
	t.Helper()
	ctx := context.Background()
	direct := s.directCommand(ctx, cmd, env, dir)
	run := func(d *directCmd) (stdout, stderr []byte, exit api.ExecExit) {
		spec := runSpec{argv: shellArgv(cmd, false), dir: dir, env: env, timeout: 10 * time.Second, maxOutput: 1 << 20, direct: d}
		exit, err := s.run(ctx, spec, func(stream string, p []byte) {
			if stream == streamStdout {
				stdout = append(stdout, p...)
			} else {
				stderr = append(stderr, p...)
			}
		})
		if err != nil {
			t.Fatalf("run %q: %v", cmd, err)
		}
		return stdout, stderr, exit
	}
	so, se, ex := run(direct)
	bo, be, bx := run(nil)
	if !bytes.Equal(so, bo) {
		t.Errorf("%q stdout:\n direct %q\n bash   %q", cmd, so, bo)
	}
	if !bytes.Equal(se, be) {
		t.Errorf("%q stderr:\n direct %q\n bash   %q", cmd, se, be)
	}
	if ex != bx {
		t.Errorf("%q exit: direct %+v, bash %+v", cmd, ex, bx)
	}
	return direct != nil
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// TestDirectMatchesBash runs each command both ways. The programs print
// what they received: `env` its environment in order, `show` its argv and,
// on stderr, the environment its process was started with (read from
// /proc, so the script's own shell cannot touch it).
func TestDirectMatchesBash(t *testing.T) {
	t.Parallel()
	s := startAgent(t, nil).srv
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	sub := filepath.Join(dir, "sub")
	for _, d := range []string{bin, sub} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(sub, link); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(bin, "show"), "#!/bin/sh\nprintf '<%s>' \"$0\" \"$@\"\ncat /proc/$$/environ >&2\nexit ${CODE:-0}\n", 0o755)
	writeFile(t, filepath.Join(bin, "suicide"), "#!/bin/sh\nkill -9 $$\n", 0o755)
	writeFile(t, filepath.Join(bin, "noshebang"), "echo from a script without a shebang: $0\n", 0o755)
	writeFile(t, filepath.Join(bin, "badinterp"), "#!/no/such/interpreter\n", 0o755)
	writeFile(t, filepath.Join(bin, "noexec"), "#!/bin/sh\necho never\n", 0o644)
	// A non-executable show earlier in PATH: bash passes over it.
	shadow := filepath.Join(dir, "shadow")
	if err := os.Mkdir(shadow, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(shadow, "show"), "#!/bin/sh\necho shadowed\n", 0o644)

	path := "PATH=" + bin + ":/usr/local/bin:/usr/bin:/bin"
	base := []string{path, "HOME=/root", "LANG=C.UTF-8", "HOSTNAME=box", "TERM=xterm", "SHELL=/bin/bash"}
	with := func(extra ...string) []string { return append(append([]string(nil), base...), extra...) }

	tests := []struct {
		name   string
		cmd    string
		env    []string
		dir    string // default dir
		direct bool   // whether the direct path must be taken
	}{
		// Taken: these must come out exactly as bash's.
		{name: "environment order", cmd: "env", env: base, direct: true},
		{name: "absolute program", cmd: "/usr/bin/env", env: base, direct: true},
		{name: "arguments", cmd: "show a b=c d,e f:g h@i j%k l+m -n --o=p ./q", env: base, direct: true},
		{name: "blanks between words", cmd: " \tshow  a\t b ", env: base, direct: true},
		{name: "exit code", cmd: "show", env: with("CODE=3"), direct: true},
		{name: "killed by a signal", cmd: "suicide", env: base, direct: true},
		{name: "program's own error", cmd: "ls /no/such/file", env: base, direct: true},
		{name: "relative program", cmd: "bin/show x", env: base, direct: true},
		{name: "dot-slash program", cmd: "./bin/show x", env: base, direct: true},
		{name: "PATH entry with a trailing slash", cmd: "show", env: []string{"PATH=" + bin + "/:/usr/bin"}, direct: true},
		{name: "non-executable file earlier in PATH", cmd: "show", env: []string{"PATH=" + shadow + ":" + bin + ":/usr/bin:/bin"}, direct: true},
		{name: "inherited PWD of the same directory", cmd: "env", env: with("PWD=" + dir), direct: true},
		{name: "inherited PWD through a symlink", cmd: "env", env: with("PWD=" + link), dir: sub, direct: true},
		{name: "stale inherited PWD", cmd: "env", env: with("PWD=" + sub), direct: true},
		{name: "relative inherited PWD", cmd: "env", env: with("PWD=sub"), direct: true},
		{name: "directory reached through a symlink", cmd: "env", env: base, dir: link, direct: true},
		{name: "OLDPWD a directory", cmd: "env", env: with("OLDPWD=" + sub), direct: true},
		{name: "OLDPWD relative", cmd: "env", env: with("OLDPWD=sub"), direct: true},
		{name: "OLDPWD not a directory", cmd: "env", env: with("OLDPWD=/no/such/dir"), direct: true},
		{name: "SHLVL", cmd: "env", env: with("SHLVL=4"), direct: true},
		{name: "SHLVL zero", cmd: "env", env: with("SHLVL=0"), direct: true},
		{name: "SHLVL highest kept", cmd: "env", env: with("SHLVL=998"), direct: true},
		{name: "inherited underscore", cmd: "env", env: with("_=/x"), direct: true},
		{name: "names sharing a bucket", cmd: "env", env: with("DEI=3", "BKA=1", "AKY=x", "CLM=2", "ADZ=y", "PWD="+dir, "_=z", "SHLVL=2"), direct: true},
		{name: "empty value and odd bytes", cmd: "show", env: with("EMPTY=", "NL=a\nb", "UTF=\xff\xfe"), direct: true},

		// Not taken: what bash does itself, or what it would treat
		// differently from a plain exec.
		{name: "builtin", cmd: "true", env: base},
		{name: "builtin echo", cmd: "echo hi", env: base},
		{name: "builtin test", cmd: "[ -d / ]", env: base},
		{name: "builtin cd", cmd: "cd /", env: base},
		{name: "builtin dot", cmd: ". /dev/null", env: base},
		{name: "keyword", cmd: "while show", env: base},
		{name: "assignment first", cmd: "A=1 env", env: base},
		{name: "job spec", cmd: "%1", env: base},
		{name: "variable", cmd: "show $HOME", env: base},
		{name: "glob", cmd: "show " + bin + "/s*", env: base},
		{name: "tilde", cmd: "show ~", env: base},
		{name: "quotes", cmd: "show 'a b'", env: base},
		{name: "backslash", cmd: `show a\ b`, env: base},
		{name: "redirection", cmd: "show >/dev/null", env: base},
		{name: "list", cmd: "show; show", env: base},
		{name: "pipeline", cmd: "show | cat", env: base},
		{name: "newline", cmd: "show\nshow", env: base},
		{name: "comment", cmd: "show #x", env: base},
		{name: "braces", cmd: "show {a,b}", env: base},
		{name: "empty", cmd: "", env: base},
		{name: "not found", cmd: "no-such-program", env: base},
		{name: "not executable", cmd: "./bin/noexec", env: base},
		{name: "directory", cmd: bin, env: base},
		{name: "exported function", cmd: "show", env: with("BASH_FUNC_show%%=() {  echo function; }")},
		{name: "BASH_ENV", cmd: "show", env: with("BASH_ENV=/dev/null")},
		{name: "SHELLOPTS", cmd: "show", env: with("SHELLOPTS=xtrace")},
		{name: "SHLVL with a leading zero", cmd: "env", env: with("SHLVL=07")},
		{name: "SHLVL bash resets", cmd: "env", env: with("SHLVL=999")},
		{name: "SHLVL not a number", cmd: "env", env: with("SHLVL=x")},
		{name: "name that is not an identifier", cmd: "env", env: with("A-B=1")},
		{name: "duplicate name", cmd: "env", env: with("HOME=/other")},
		{name: "no PATH", cmd: "env", env: []string{"HOME=/"}},
		{name: "relative PATH entry before the program", cmd: "env", env: []string{"PATH=bin:/usr/bin"}},
		{name: "empty PATH entry before the program", cmd: "env", env: []string{"PATH=:/usr/bin"}},

		// Tried, but the program cannot be exec'd: bash runs it and
		// reports it as before.
		{name: "script without a shebang", cmd: "noshebang", env: base, direct: true},
		{name: "missing interpreter", cmd: "badinterp", env: base, direct: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := dir
			if tt.dir != "" {
				d = tt.dir
			}
			if got := runBoth(t, s, tt.cmd, tt.env, d); got != tt.direct {
				t.Errorf("direct path taken = %v, want %v", got, tt.direct)
			}
		})
	}
}

// TestDirectEnvironmentOrder checks the emulated export order against bash
// on random environments: enough names that many share a hash bucket.
func TestDirectEnvironmentOrder(t *testing.T) {
	t.Parallel()
	s := startAgent(t, nil).srv
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	const letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_0123456789"
	for round := range 20 {
		env := []string{"PATH=/usr/bin:/bin"}
		seen := map[string]bool{"PATH": true}
		for len(env) < 200 {
			n := 1 + rng.IntN(4)
			var b strings.Builder
			b.WriteByte(letters[rng.IntN(53)]) // not a digit
			for range n - 1 {
				b.WriteByte(letters[rng.IntN(len(letters))])
			}
			name := b.String()
			if seen[name] || shellOwnedEnv[name] || name == "_" || name == "SHLVL" || name == "PWD" || name == "OLDPWD" {
				continue
			}
			seen[name] = true
			env = append(env, fmt.Sprintf("%s=%d", name, len(env)))
		}
		if !runBoth(t, s, "env", env, dir) {
			t.Fatalf("round %d: direct path not taken", round)
		}
	}
}
