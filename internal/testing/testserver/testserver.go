// Package testserver starts a real Orchard server for tests: the local
// runtime with real containers, the memory store, the real agent binary,
// real HTTP on loopback.
package testserver

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/agentclient"
	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/internal/testing/floor"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/metrics"
	"github.com/orchard/orchard/runtime/local"
	"github.com/orchard/orchard/server"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/memory"
)

// APIKey is the key every test server accepts.
const APIKey = "test-key_0123456789"

// Main is the TestMain of packages that start servers: the test binary is
// re-executed as the containers' init process, which must be handled
// before tests run.
func Main(m *testing.M) {
	floor.MaybeChild()
	if len(os.Args) > 1 && os.Args[1] == "init" {
		local.Init()
	}
	if err := local.ReexecSealed(); err != nil {
		fmt.Fprintln(os.Stderr, "testserver:", err)
	}
	code := m.Run()
	if code == 0 {
		// Every server a test started was stopped at its cleanup; what is
		// still running now leaked. Idle keep-alive connections of test
		// clients are not the server's.
		http.DefaultClient.CloseIdleConnections()
		if err := goleak.Find(
			goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Server is a running test server.
type Server struct {
	URL      string
	APIKey   string
	Manager  *manager.Manager
	Runtime  *local.Local
	StateDir string
	HTTP     *httptest.Server
	egress   *egress.Hub
	stopRun  func() // ends the manager's loop (Options.Run); nil if none
}

// Options adjust the server.
type Options struct {
	Manager manager.Config
	Server  server.Config
	// StateDir reuses a state directory (to test restarts, or replicas on
	// one host); empty = fresh.
	StateDir string
	// Store is the state store; nil = a fresh memory store.
	Store store.Store
	// Egress is the dialer network-enabled sandboxes reach sites through;
	// nil = public addresses only, names from the system resolver.
	Egress *egress.Dialer
	// ImageDirs are the directories "docker-archive:" and "oci-layout:"
	// references may name (local.Config.ImageDirs); none by default, as
	// for `orchard serve`.
	ImageDirs []string
	// HarnessDir is the harness store sandboxes may mount
	// (local.Config.HarnessDir; testenv.HarnessStore); none by default.
	HarnessDir string
	// Run runs the manager's background loop (cleanup every
	// CleanupInterval, cancels asked through other replicas), as
	// `orchard serve` does.
	Run bool
}

// Start starts a server and stops it (deleting its sandboxes) at cleanup.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	testenv.RequireRoot(t)
	agentPath := testenv.AgentBinary(t)
	dir := opts.StateDir
	if dir == "" {
		dir = StateDir(t)
	}
	// Background work may log after a test ends, so logs go to stderr.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Containers start from orchard-init, as the server's do.
	initPath, err := testenv.InitBinary(local.SeccompEnabled)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := local.New(local.Config{StateDir: dir, AgentPath: agentPath, InitPath: initPath, ImageDirs: opts.ImageDirs, HarnessDir: opts.HarnessDir, Logger: log})
	if err != nil {
		t.Fatalf("local runtime: %v", err)
	}
	mc := opts.Manager
	dialer := opts.Egress
	if dialer == nil {
		dialer = &egress.Dialer{}
	}
	hub := egress.NewHub(dialer, agentclient.DialRaw, log)
	mc.Egress = hub
	mc.Browser = true
	mc.Desktop = true
	mc.AdoptOrphans = opts.Store == nil
	if mc.CleanupInterval == 0 {
		mc.CleanupInterval = time.Hour
	}
	st := opts.Store
	if st == nil {
		st = memory.New()
	}
	sc := opts.Server
	if sc.Metrics == nil {
		sc.Metrics = metrics.New()
	}
	mc.OnRetry = sc.Metrics.ObserveRetry
	agents := agentclient.NewPool(0)
	mgr := manager.New(mc, rt, st, func(addr string) manager.Agent { return agents.Client(addr) }, log)
	if err := mgr.Recover(context.Background()); err != nil {
		t.Fatalf("recover: %v", err)
	}
	if sc.RecordingsDir == "" {
		sc.RecordingsDir = filepath.Join(dir, "recordings")
	}
	if len(sc.APIKeys) == 0 {
		sc.APIKeys = []string{APIKey}
	}
	sc.RequireAPIKey = true
	srv, err := server.New(sc, mgr, log)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	s := &Server{URL: hs.URL, APIKey: sc.APIKeys[0], Manager: mgr, Runtime: rt, StateDir: dir, HTTP: hs, egress: hub}
	if opts.Run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = mgr.Run(ctx) }()
		s.stopRun = func() { cancel(); <-done }
	}
	t.Cleanup(func() { s.Stop(t, true) })
	return s
}

// Stop stops the HTTP server and the manager; with remove it also deletes
// every sandbox the runtime holds. Safe to call twice.
func (s *Server) Stop(t testing.TB, remove bool) {
	if s.HTTP == nil {
		return
	}
	s.HTTP.Close()
	s.HTTP = nil
	if s.stopRun != nil {
		s.stopRun()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = s.Manager.Shutdown(ctx)
	s.egress.Close()
	if remove {
		// Shutdown may have used up its context waiting for a job that
		// was still running; removing sandboxes gets time of its own.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		insts, err := s.Runtime.List(ctx)
		if err != nil {
			t.Errorf("list sandboxes at cleanup: %v", err)
		}
		for _, in := range insts {
			if err := s.Runtime.Delete(ctx, in.ID); err != nil {
				t.Errorf("delete sandbox %s at cleanup: %v", in.ID, err)
			}
		}
	}
	_ = s.Runtime.Close()
}

// StateDir returns a fresh state directory outside the sandboxes' masked
// paths, removed at cleanup.
func StateDir(t testing.TB) string {
	dir, err := os.MkdirTemp("", "orchard-test-")
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(dir)
	t.Cleanup(func() {
		// Sandboxes outlive the processes that made them (a replica a test
		// killed, a failed test): remove whatever the directory still holds
		// before the directory itself, or their containers would leak. A
		// test server keeps them in the directory, `orchard serve` in its
		// runtime folder.
		for _, d := range []string{abs, filepath.Join(abs, "runtime")} {
			if _, err := os.Stat(filepath.Join(d, "sandboxes")); err == nil {
				RemoveSandboxes(t, d)
			}
			// The snapshots' filesystem, if a runtime left it mounted:
			// never remove through a mount.
			_ = unix.Unmount(filepath.Join(d, "layers"), unix.MNT_DETACH)
		}
		_ = os.RemoveAll(abs)
	})
	return abs
}

// RemoveSandboxes deletes every sandbox the local runtime holds in dir
// (its state directory): what a server that was killed, or failed, left.
func RemoveSandboxes(t testing.TB, dir string) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt, err := local.New(local.Config{StateDir: dir, AgentPath: testenv.AgentBinary(t), Logger: log})
	if err != nil {
		t.Errorf("open runtime in %s to remove leftovers: %v", dir, err)
		return
	}
	defer rt.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	insts, err := rt.List(ctx)
	if err != nil {
		t.Errorf("list leftover sandboxes in %s: %v", dir, err)
	}
	for _, in := range insts {
		if err := rt.Delete(ctx, in.ID); err != nil {
			t.Errorf("delete leftover sandbox %s: %v", in.ID, err)
		}
	}
}
