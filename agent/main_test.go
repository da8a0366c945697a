package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/orchard/orchard/agentclient"
	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeDaemonEnv) == "1" {
		fakeDaemon(os.Args[1:])
	}
	goleak.VerifyTestMain(m)
}

// testLogger writes warnings to stderr. It is not t.Output: the reaper is
// shared by every test of the process and may log after one test is over.
var testLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// testAgent is an agent served in-process on a real unix socket.
type testAgent struct {
	*agentclient.Client
	srv  *Server
	root string // Config.Root on the host
}

// startAgent serves an agent whose root is a fresh temporary directory;
// edit adjusts the config first.
func startAgent(t testing.TB, edit func(*Config)) *testAgent {
	t.Helper()
	// Commands get a HOME of their own: a login shell would otherwise run
	// the host user's dotfiles (pyenv's rehash among them, which fails
	// when parallel tests run it at once).
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "HOME=") })
	cfg := Config{Root: t.TempDir(), Env: append(env, "HOME="+t.TempDir()), Logger: testLogger}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// Socket paths are limited to 108 bytes; t.TempDir's can be longer.
	sockDir, err := os.MkdirTemp("", "agent")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(sockDir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	c := agentclient.NewClient("unix:" + sock)
	t.Cleanup(func() {
		c.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		os.RemoveAll(sockDir)
	})
	return &testAgent{Client: c, srv: srv, root: cfg.Root}
}

// execResult is a finished exec.
type execResult struct {
	stdout, stderr []byte
	exit           api.ExecExit
	events         int
}

func (a *testAgent) exec(t *testing.T, req api.AgentExecRequest) execResult {
	t.Helper()
	var r execResult
	exit, err := a.Exec(context.Background(), req, func(ev api.ExecEvent) {
		r.events++
		switch ev.Stream {
		case streamStdout:
			r.stdout = append(r.stdout, ev.Data...)
		case streamStderr:
			r.stderr = append(r.stderr, ev.Data...)
		default:
			t.Errorf("event with stream %q", ev.Stream)
		}
	})
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Command, err)
	}
	r.exit = exit
	return r
}

// wantFault checks err's class.
func wantFault(t *testing.T, err error, status int, cat faults.Category, code string) *faults.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s", code)
	}
	var e *faults.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *faults.Error", err, err)
	}
	if e.StatusOf() != status || e.Category != cat || e.Code != code {
		t.Fatalf("error = %d %s %s (%q), want %d %s %s", e.StatusOf(), e.Category, e.Code, e.Message, status, cat, code)
	}
	return e
}

// processGone waits until pid no longer exists (a zombie counts as alive:
// it is exactly what must not be left behind).
func processGone(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still exists: %s", pid, strings.TrimSpace(string(b)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) { c.Version = "v-test" })
	h, err := a.Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != "ok" || h.PID != os.Getpid() || h.Version != "v-test" {
		t.Fatalf("health = %+v", h)
	}
}
