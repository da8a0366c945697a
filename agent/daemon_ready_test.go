package agent

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
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
	signalReady(ready)
	_ = http.Serve(ln, mux)
	os.Exit(0)
}

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
	// supervise stops the daemon (and its program, in its group) once ctx
	// ends: wait for that, so that nothing of the test outlives it.
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
