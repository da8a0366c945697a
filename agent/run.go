package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

const (
	// exitDrain is how long output is still collected after a command has
	// exited or been killed. Only processes that outlive the command (a
	// background job holding the pipe) keep a pipe open past its exit; we
	// give them a moment and then stop listening instead of hanging until
	// they end, which is what Orchard does.
	exitDrain = time.Second

	// readChunk is the pipe read size: large enough for throughput, small
	// enough that output reaches the client as it is produced.
	readChunk = 32 << 10

	// loginPrelude is what Orchard's login shell runs before the command
	// (ORCHARD_COMPAT §0 fact 6): bash --login -i does not read ~/.bashrc
	// itself.
	// It also adds the sandbox's harness folders (ORCHARD_HARNESS_PATH,
	// set by the runtime) to PATH again: the profile sets PATH afresh.
	loginPrelude = "if [ -f ~/.bashrc ]; then . ~/.bashrc; fi; " +
		`if [ -n "$ORCHARD_HARNESS_PATH" ]; then PATH="$PATH:$ORCHARD_HARNESS_PATH"; fi; `
)

// Stream names of api.ExecEvent.
const (
	streamStdout = "stdout"
	streamStderr = "stderr"
)

// strippedEnv are removed from the agent's environment before it is given to
// commands: the agent's own interpreter settings must not leak into the
// user's Python (ORCHARD_COMPAT §4).
var strippedEnv = []string{"PYTHONHOME", "PYTHONPATH", "LD_LIBRARY_PATH"}

// runSpec is one command for run.
type runSpec struct {
	argv      []string
	dir       string
	env       []string
	timeout   time.Duration
	maxOutput int64
	// loginFilter applies the login-shell stderr filter.
	loginFilter bool
	// direct, when set, is tried first: the program argv's bash would
	// exec, started without it. If it cannot be started (a script
	// without #!, a missing interpreter) argv runs instead, so that bash
	// handles or reports it as it always does.
	direct *directCmd
}

// shellArgv is the argv of an exec request (ORCHARD_COMPAT §0 fact 6).
func shellArgv(cmd string, login bool) []string {
	if login {
		return []string{"bash", "--login", "-i", "-c", loginPrelude + cmd}
	}
	return []string{"bash", "-c", cmd}
}

// imageShell is argv, a bash command line, run by the image's sh when
// the image has no bash but has sh (busybox, Alpine, the harness store's
// launchers need nothing more): `sh -l -i -c` for `bash --login -i -c`.
// With neither, argv stays as it is, and fails as it always did.
func imageShell(argv []string, env []string, dir string) []string {
	if len(argv) == 0 || argv[0] != "bash" {
		return argv
	}
	if _, err := lookPath("bash", env, dir); err == nil {
		return argv
	}
	if _, err := lookPath("sh", env, dir); err != nil {
		return argv
	}
	out := []string{"sh"}
	for _, a := range argv[1:] {
		if a == "--login" {
			a = "-l"
		}
		out = append(out, a)
	}
	return out
}

// commandEnv is base minus strippedEnv, overlaid with extra.
func commandEnv(base []string, extra map[string]string) []string {
	env := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(strippedEnv, k) {
			continue
		}
		if _, over := extra[k]; over {
			continue
		}
		env = append(env, kv)
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}

// withHarnessPath appends the sandbox's harness folders
// (ORCHARD_HARNESS_PATH, set by the runtime: a pod's image decides its
// PATH) to env's PATH, unless PATH ends with them already.
func withHarnessPath(env []string) []string {
	dirs, ok := envValue(env, "ORCHARD_HARNESS_PATH")
	if !ok || dirs == "" {
		return env
	}
	path, _ := envValue(env, "PATH")
	if strings.HasSuffix(path, dirs) {
		return env
	}
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "PATH=") })
	return append(out, "PATH="+path+":"+dirs)
}

// envValue is the last value of key in env, as execve would see it.
func envValue(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// commandDir is the directory a command runs in: dir, else the default.
// The default (WORKING_DIR, /workspace) becomes "/" when the image has no
// such directory, as in Orchard Env. An explicit dir must be a directory:
// Orchard Env falls back to "/" for it too (ORCHARD_COMPAT §4), which runs
// a command meant for one directory in another and reports success — with
// a mistyped cwd, `rm -rf *` at the root. It is checked here, when the
// command starts, not when the request arrives: a job queued behind the
// one that creates the directory finds it.
func commandDir(dir, def string) (string, error) {
	if dir == "" {
		if fi, err := os.Stat(def); err != nil || !fi.IsDir() {
			return "/", nil
		}
		return def, nil
	}
	fi, err := os.Stat(dir)
	switch {
	case err != nil:
		return "", fileFault(err, dir, faults.New(faults.CodePathNotFound, faults.NotFound, faults.Client, "Working directory not found: "+dir))
	case !fi.IsDir():
		return "", faults.New(faults.CodeNotDirectory, faults.InvalidRequest, faults.Client, "Working directory is not a directory: "+dir)
	}
	return dir, nil
}

// lookPath finds file the way execvp would for a child with env and working
// directory dir: the child's PATH counts, not the agent's.
func lookPath(file string, env []string, dir string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := isExecutable(p); err != nil {
			return "", &exec.Error{Name: file, Err: err}
		}
		return p, nil
	}
	pathEnv, _ := envValue(env, "PATH")
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, file)
		if isExecutable(p) == nil {
			return p, nil
		}
	}
	return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
}

func isExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return syscall.EACCES // what execve reports for either
	}
	return nil
}

// spawnExitCode is the shell's convention for a command that could not be
// started: 127 not found, 126 found but not executable.
func spawnExitCode(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, syscall.ENOENT) {
		return 127
	}
	return 126
}

// chunk is one read from a command's output pipe; eof marks the end of a
// stream.
type chunk struct {
	stream string
	data   []byte
	eof    bool
}

// outputCap enforces the per-stream output limit.
type outputCap struct {
	max       int64
	n         int64
	truncated bool
}

// take returns the part of p that fits, and whether this call crossed the
// limit (so that the marker is emitted exactly once).
func (c *outputCap) take(p []byte) (keep []byte, crossed bool) {
	if c.truncated {
		return nil, false
	}
	if room := c.max - c.n; int64(len(p)) > room {
		c.n = c.max
		c.truncated = true
		return p[:runeCut(p, int(room))], true
	}
	c.n += int64(len(p))
	return p, false
}

// runeCut moves the cut at p[:cut] back to the start of a UTF-8 character
// that the cut would split, so that the kept output does not end in a lone
// lead byte that decodes as a U+FFFD the command never wrote. Bytes that do
// not form a valid character are cut where they are.
func runeCut(p []byte, cut int) int {
	if cut >= len(p) || utf8.RuneStart(p[cut]) {
		return cut
	}
	for i := cut - 1; i >= 0 && i > cut-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if r, size := utf8.DecodeRune(p[i:]); r != utf8.RuneError && i+size > cut {
				return i
			}
			break
		}
	}
	return cut
}

// truncationMarker is emitted once on a stream that hit its cap.
func truncationMarker(max int64) []byte {
	return fmt.Appendf(nil, "\n[orchard: output truncated after %d bytes]\n", max)
}

// timeoutNote is appended to stderr after a timeout (ORCHARD_COMPAT §0 fact 5).
func timeoutNote(d time.Duration) []byte {
	return fmt.Appendf(nil, "\nCommand timed out after %ds and was killed", int(d/time.Second))
}

// run executes spec and calls emit, from the calling goroutine only, with
// each piece of output as it arrives, then returns how the command ended.
// A command that exits non-zero, times out or cannot be started is a result;
// the error is for failures of the agent itself (no pipes, no fork). When ctx
// ends (client gone, agent shutting down) the process group is killed.
func (s *Server) run(ctx context.Context, spec runSpec, emit func(stream string, p []byte)) (api.ExecExit, error) {
	caps := map[string]*outputCap{
		streamStdout: {max: spec.maxOutput},
		streamStderr: {max: spec.maxOutput},
	}
	var filter *stderrFilter
	if spec.loginFilter {
		filter = &stderrFilter{}
	}
	out := func(stream string, p []byte) {
		if stream == streamStderr && filter != nil {
			p = filter.write(p)
		}
		if len(p) == 0 {
			return
		}
		keep, crossed := caps[stream].take(p)
		if len(keep) > 0 {
			emit(stream, keep)
		}
		if crossed {
			emit(stream, truncationMarker(spec.maxOutput))
		}
	}
	finish := func(exit api.ExecExit, timedOut bool) api.ExecExit {
		if filter != nil {
			if rest := filter.flush(); len(rest) > 0 {
				keep, crossed := caps[streamStderr].take(rest)
				if len(keep) > 0 {
					emit(streamStderr, keep)
				}
				if crossed {
					emit(streamStderr, truncationMarker(spec.maxOutput))
				}
			}
		}
		if timedOut {
			// Outside the cap: the note must survive truncation.
			emit(streamStderr, timeoutNote(spec.timeout))
		}
		exit.Truncated = caps[streamStdout].truncated || caps[streamStderr].truncated
		return exit
	}

	pipeFailed := func(what string, err error) (api.ExecExit, error) {
		return api.ExecExit{}, faults.Wrap(fmt.Errorf("%s pipe: %w", what, err), faults.CodeSpawnFailed, faults.Internal, faults.Sandbox, "cannot start command")
	}
	outR, outW, err := outputPipe()
	if err != nil {
		return pipeFailed("stdout", err)
	}
	defer outR.Close()
	defer outW.close()
	errR, errW, err := outputPipe()
	if err != nil {
		return pipeFailed("stderr", err)
	}
	defer errR.Close()
	defer errW.close()

	start := func(path string, argv, env []string) (*child, error) {
		return s.reaper.start(func() (int, error) {
			pid, _, err := syscall.StartProcess(path, argv, &syscall.ProcAttr{
				Dir:   spec.dir,
				Env:   env,
				Files: []uintptr{uintptr(s.devnull), uintptr(outW), uintptr(errW)},
				// A session of its own: the command's process group is
				// separate from the agent's, so killing it on timeout
				// kills the command and its background jobs, never the
				// agent.
				Sys: &syscall.SysProcAttr{Setsid: true},
			})
			if err != nil {
				return 0, &os.PathError{Op: "fork/exec", Path: path, Err: err}
			}
			return pid, nil
		})
	}
	var c *child
	if d := spec.direct; d != nil {
		if c, err = start(d.path, d.argv, d.env); err != nil {
			s.log.Debug("direct start failed, running bash", "path", d.path, "err", err)
		}
	}
	if c == nil {
		var path string
		if path, err = lookPath(spec.argv[0], spec.env, spec.dir); err != nil {
			msg := err.Error()
			emit(streamStderr, []byte(msg))
			return api.ExecExit{ExitCode: spawnExitCode(err), SpawnError: msg}, nil
		}
		c, err = start(path, spec.argv, spec.env)
	}
	if err != nil {
		msg := err.Error()
		emit(streamStderr, []byte(msg))
		return api.ExecExit{ExitCode: spawnExitCode(err), SpawnError: msg}, nil
	}
	// Our copies of the write ends must go, or the pipes never reach EOF.
	outW.close()
	errW.close()

	chunks := make(chan chunk)
	go readPipe(outR, streamStdout, chunks)
	go readPipe(errR, streamStderr, chunks)

	timer := time.NewTimer(spec.timeout)
	defer timer.Stop()
	var (
		open     = 2
		exited   bool
		killed   bool // the group was killed (timeout or ctx)
		timedOut bool
		drain    <-chan time.Time
		gaveUp   bool // stopped waiting for a killed child that will not die
		ctxDone  = ctx.Done()
		childEnd = c.done
	)
	kill := func(why string) {
		if killed {
			return
		}
		killed = true
		go func() {
			if err := c.killGroup(); err != nil {
				s.log.Warn("kill process group", "pid", c.pid, "why", why, "err", err)
			}
		}()
		drain = time.After(exitDrain)
	}
	for open > 0 || (!exited && !gaveUp) {
		select {
		case ch := <-chunks:
			if ch.eof {
				open--
				if open == 0 && !exited {
					// A command closes its output as it exits; reaping
					// it now saves the SIGCHLD's trip through the
					// reaper on most commands.
					s.reaper.reapNow(c)
				}
			} else {
				out(ch.stream, ch.data)
			}
		case <-childEnd:
			exited = true
			childEnd = nil
			timer.Stop()
			if drain == nil {
				drain = time.After(exitDrain)
			}
		case <-timer.C:
			timedOut = true
			kill("timeout")
		case <-ctxDone:
			ctxDone = nil
			kill("canceled")
		case <-drain:
			drain = nil
			// Closing the read ends makes the readers return at once;
			// whoever still holds the write ends gets EPIPE.
			outR.Close()
			errR.Close()
			if !exited {
				gaveUp = true
				s.log.Warn("killed command did not exit", "pid", c.pid)
			}
		}
	}

	switch {
	case timedOut:
		return finish(api.ExecExit{ExitCode: 124, TimedOut: true}, true), nil
	case !exited:
		return finish(api.ExecExit{ExitCode: -int(syscall.SIGKILL), Signal: int(syscall.SIGKILL)}, false), nil
	}
	code, sig := c.exitCode()
	return finish(api.ExecExit{ExitCode: code, Signal: sig}, false), nil
}

// writeEnd is the write end of an output pipe, a bare descriptor: the
// child gets it as its stdout or stderr and the agent only closes it.
type writeEnd int

// close closes the descriptor once; later calls do nothing.
func (w *writeEnd) close() {
	if *w >= 0 {
		_ = syscall.Close(int(*w))
		*w = -1
	}
}

// outputPipe is a pipe for one output stream. Only the read end is an
// os.File, registered with the poller; os.Pipe would register the child's
// end too and switch its mode back and forth, syscalls every exec paid for
// nothing.
func outputPipe() (*os.File, writeEnd, error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		return nil, -1, err
	}
	// The child's end must block: O_NONBLOCK belongs to the open file,
	// which the child shares.
	if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(p[1]), syscall.F_SETFL, 0); e != 0 {
		syscall.Close(p[0])
		syscall.Close(p[1])
		return nil, -1, e
	}
	return os.NewFile(uintptr(p[0]), "|0"), writeEnd(p[1]), nil
}

// readPipe sends what it reads from f to chunks, then an eof chunk. The
// receiver always drains chunks until both streams sent eof, so the sends
// never block forever.
func readPipe(f *os.File, stream string, chunks chan<- chunk) {
	buf := make([]byte, readChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			chunks <- chunk{stream: stream, data: slices.Clone(buf[:n])}
		}
		if err != nil {
			// EOF, our own close after the drain, or an I/O error: all
			// end the stream, and none is worth reporting to the client.
			chunks <- chunk{stream: stream, eof: true}
			return
		}
	}
}
