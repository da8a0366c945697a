package agent

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/retry"
)

// fakeDaemonEnv makes the test binary, started as a daemon by
// startDaemon, run fakeDaemon instead of the tests.
const fakeDaemonEnv = "ORCHARD_AGENT_TEST_DAEMON"

// fakeDaemon is a daemon as browserd's and desktopd's mains are: it starts
// a program of its own (as they start Chromium or Xvfb), listens, serves
// /health and says it is ready on its pipe. It reports the fds its program
// holds at /fds.
func fakeDaemon(args []string) {
	fs := flag.NewFlagSet("fake", flag.ExitOnError)
	sock := fs.String("socket", "", "")
	readyFD := fs.Int("ready-fd", -1, "")
	_ = fs.Parse(args)
	ready := readyPipe(*readyFD)
	prog := exec.Command("sleep", "60")
	if err := prog.Start(); err != nil {
		os.Exit(2)
	}
	time.Sleep(200 * time.Millisecond) // a launch takes a while
	_ = os.Remove(*sock)               // an earlier daemon's, as browserd's main does
	ln, err := net.Listen("unix", *sock)
	if err != nil {
		os.Exit(3)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/fds", func(w http.ResponseWriter, _ *http.Request) {
		ents, _ := os.ReadDir("/proc/" + strconv.Itoa(prog.Process.Pid) + "/fd")
		var targets []string
		for _, e := range ents {
			l, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(prog.Process.Pid), "fd", e.Name()))
			targets = append(targets, e.Name()+"="+l)
		}
		_, _ = w.Write([]byte(strings.Join(targets, "\n")))
	})
	// POST /act echoes its body; when the test has left a file named as
	// its query's "die" in fakeDaemonDirEnv, it takes the file and answers
	// that the browser died, then exits as browserd does: "before" says
	// the call was not run (headerNotRun), "during" that it was.
	mux.HandleFunc("POST /act", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		die := r.URL.Query().Get("die")
		if die == "" || os.Remove(filepath.Join(os.Getenv(fakeDaemonDirEnv), die)) != nil {
			_, _ = w.Write(body)
			return
		}
		if die == "before" {
			w.Header().Set(headerNotRun, "1")
		}
		writeFault(w, faults.New(faults.CodeBrowserCrashed, faults.Unavailable, faults.Browser, "the browser process exited"))
		go func() {
			time.Sleep(50 * time.Millisecond)
			os.Exit(1)
		}()
	})
	signalReady(ready)
	_ = http.Serve(ln, mux)
	os.Exit(0)
}

// fakeDaemonDirEnv names the folder where a test tells fakeDaemon to die.
const fakeDaemonDirEnv = "ORCHARD_AGENT_TEST_DAEMON_DIR"

// A daemon is seen ready when it says so on its pipe, not at the next
// health check (here an hour away), and the programs it starts do not
// inherit the pipe.
func TestDaemonSaysItIsReady(t *testing.T) {
	t.Setenv(fakeDaemonEnv, "1")
	old := readyPoll
	readyPoll = retry.Policy{Initial: time.Hour, Max: time.Hour}
	t.Cleanup(func() { readyPoll = old })
	a := startAgent(t, nil)
	dir, err := os.MkdirTemp("", "daemon")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "fake.sock")
	kind := daemonKind{name: "fake", code: faults.CodeBrowserCrashed, launch: faults.CodeBrowserLaunch, source: faults.Browser,
		args: func(exe, sock, _ string) []string { return []string{exe, "--socket", sock} }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	p, err := a.srv.startDaemon(ctx, kind, sock, "{}")
	if err != nil {
		cancel()
		t.Fatalf("startDaemon: %v", err)
	}
	hc := &http.Client{Transport: p.proxy.Transport}
	resp, err := hc.Get("http://fake/fds")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	hc.CloseIdleConnections()
	// The ready pipe is the daemon's fd 3; inherited, it would be the
	// program's fd 3 too. (Whatever the test's own parent left open is
	// inherited by everything here and is not the daemon's to close.)
	if fds := strings.Split(string(body), "\n"); !slices.Contains(fds, "0=/dev/null") || slices.ContainsFunc(fds, func(fd string) bool {
		return strings.HasPrefix(fd, "3=pipe:")
	}) {
		t.Errorf("the daemon's program holds %q; want no pipe at fd 3", body)
	}
	cancel()
	waitDaemonGone(t, sock)
}

// waitDaemonGone waits until the daemon at sock no longer serves:
// supervise stops it (and its program, in its group) once its context
// ends, and nothing of the test may outlive it.
func waitDaemonGone(t *testing.T, sock string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
	t.Error("the daemon still serves after its context ended")
}

// A call the daemon turned away because its browser was dead already is
// run again, body and all, once the daemon is back; one the browser died
// under answers the crash, since part of it may have happened.
func TestCallNotRunIsRunAfterRestart(t *testing.T) {
	t.Setenv(fakeDaemonEnv, "1")
	dir := t.TempDir()
	t.Setenv(fakeDaemonDirEnv, dir)
	a := startAgent(t, nil)
	sock := filepath.Join(dir, "fake.sock")
	kind := daemonKind{name: "fake", code: faults.CodeBrowserCrashed, launch: faults.CodeBrowserLaunch, source: faults.Browser,
		args: func(exe, sock, _ string) []string { return []string{exe, "--socket", sock} }}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := a.srv.startDaemon(ctx, kind, sock, "{}")
	if err != nil {
		t.Fatalf("startDaemon: %v", err)
	}
	act := func(die string) *httptest.ResponseRecorder {
		t.Helper()
		if die != "" {
			if err := os.WriteFile(filepath.Join(dir, die), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		w := httptest.NewRecorder()
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/act?die="+die, strings.NewReader("step 1"))
		p.ServeHTTP(w, r)
		return w
	}
	for _, tc := range []struct {
		die       string
		status    int
		body      string
		restarted string
	}{
		{"", 200, "step 1", ""},
		{"before", 200, "step 1", "1"},
		{"during", 503, `"code":"browser.crashed"`, ""},
	} {
		w := act(tc.die)
		if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.body) || w.Header().Get(HeaderRestarted) != tc.restarted {
			t.Errorf("die=%q: %d %q (restarted %q); want %d with %q (restarted %q)",
				tc.die, w.Code, w.Body, w.Header().Get(HeaderRestarted), tc.status, tc.body, tc.restarted)
		}
		if w.Header().Get(headerNotRun) != "" {
			t.Errorf("die=%q: the daemon's %s reached the caller", tc.die, headerNotRun)
		}
	}
	// The daemon that answered "during" is restarted too.
	for deadline := time.Now().Add(10 * time.Second); p.restartCount() < 2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := p.restartCount(); n != 2 {
		t.Errorf("%d restarts, want 2", n)
	}
	if w := act(""); w.Code != 200 || w.Body.String() != "step 1" {
		t.Errorf("after the restarts: %d %q", w.Code, w.Body)
	}
	cancel()
	waitDaemonGone(t, sock)
}
