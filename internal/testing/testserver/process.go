package testserver

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"syscall"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// processStartTimeout bounds a server process's start: re-exec sealed,
// recover, listen. Generous because CI machines run several at once.
const processStartTimeout = 30 * time.Second

// Process is a real `orchard serve` process, for tests of what only the
// binary does: its main (signals, flags, environment), exits, replicas.
type Process struct {
	// URL is where it serves (http://127.0.0.1:port); APIKey the key it
	// accepts, unless ProcessOptions.Env sets API_KEYS.
	URL, APIKey string
	// Log is the file that holds its standard output and error.
	Log string

	cmd     *exec.Cmd
	exited  chan struct{} // closed once the process has been reaped
	waitErr error         // the exit; read after exited is closed
}

// ProcessOptions adjust StartProcess.
type ProcessOptions struct {
	// StateDir is the server's state directory (from StateDir, whose
	// cleanup removes the sandboxes left in it); empty = a fresh one.
	StateDir string
	// Env is added to what the server runs with (PATH, TMPDIR,
	// ORCHARD_AGENT, API_KEYS=APIKey, LOG_LEVEL=WARN); a name set here
	// wins.
	Env []string
}

// servingRE finds the address in the line `orchard serve` prints once it
// listens.
var servingRE = regexp.MustCompile(`serving on (http://[0-9.:]+)`)

// StartProcess runs `orchard serve` (testenv.OrchardBinary) on a free
// loopback port, its output in a file, and waits until /health answers.
// The process is killed at cleanup if still running, and its log shown if
// the test failed; the sandboxes it leaves go with its state directory.
func StartProcess(t testing.TB, opts ProcessOptions) *Process {
	t.Helper()
	testenv.RequireRoot(t)
	bin := testenv.OrchardBinary(t)
	dir := opts.StateDir
	if dir == "" {
		dir = StateDir(t)
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"ORCHARD_AGENT=" + testenv.AgentBinary(t),
		"API_KEYS=" + APIKey,
		"LOG_LEVEL=WARN",
	}
	if d := os.Getenv("TMPDIR"); d != "" {
		env = append(env, "TMPDIR="+d)
	}
	log := filepath.Join(t.TempDir(), "orchard-serve.log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--state-dir", dir)
	// exec keeps the last value of a name that appears twice.
	cmd.Env = append(env, opts.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	// The server dies with the test process even when that is killed
	// before its cleanups run; the signal comes when the starting thread
	// ends, so that thread stays with the goroutine that reaps the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &Process{APIKey: APIKey, Log: log, cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		t.Fatalf("start orchard serve: %v", err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("log of orchard serve (%s):\n%s", p.URL, p.Output(4000))
		}
	})
	if err := p.waitServing(); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitServing waits for the address in the log, then for /health.
func (p *Process) waitServing() error {
	deadline := time.Now().Add(processStartTimeout)
	for {
		if p.URL == "" {
			if m := servingRE.FindStringSubmatch(p.Output(0)); m != nil {
				p.URL = m[1]
			}
		}
		if p.URL != "" {
			if res, err := http.Get(p.URL + "/health"); err == nil {
				res.Body.Close()
				if res.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		if err := p.Alive(); err != nil {
			return fmt.Errorf("orchard serve exited before serving: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("orchard serve: no /health within %s:\n%s", processStartTimeout, p.Output(4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Output returns what the process has written, its last n bytes when n
// is positive.
func (p *Process) Output(n int) string {
	b, _ := os.ReadFile(p.Log)
	if n > 0 && len(b) > n {
		return "…" + string(b[len(b)-n:])
	}
	return string(b)
}

// Alive returns nil while the process runs, or how it ended and the end
// of its log.
func (p *Process) Alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("orchard serve exited (%v); its log ends:\n%s", p.waitErr, p.Output(2000))
	default:
		return nil
	}
}

// Stop sends SIGTERM and waits up to timeout for a clean exit.
func (p *Process) Stop(timeout time.Duration) error {
	if err := p.Alive(); err != nil {
		return err
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	select {
	case <-p.exited:
		if p.waitErr != nil {
			return fmt.Errorf("exit after SIGTERM: %w", p.waitErr)
		}
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("still running %s after SIGTERM", timeout)
	}
}

// Kill SIGKILLs the process, as a crash would, and reaps it.
func (p *Process) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}
