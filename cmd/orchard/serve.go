package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/orchard/orchard/agentbin"
	"github.com/orchard/orchard/agentclient"
	"github.com/orchard/orchard/evaluate"
	"github.com/orchard/orchard/harness"
	"github.com/orchard/orchard/metrics"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/runtime/local"
	"github.com/orchard/orchard/server"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/memory"
	"github.com/orchard/orchard/store/redis"
)

func serveCmd(getenv func(string) string) *cobra.Command {
	cfg := defaultConfig(getenv)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the Orchard API: sandboxes on this machine (local runtime) or as Kubernetes pods (--runtime kube)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := local.ReexecSealed(); err != nil {
				return err
			}
			if err := loadEnv(&cfg, getenv, cmd.Flags().Changed); err != nil {
				return err
			}
			if err := cfg.validate(); err != nil {
				return err
			}
			return serve(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", cfg.Addr, "listen address (env ORCHARD_ADDR, or HOST and PORT)")
	f.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "state directory: sandboxes, image cache, API key (env ORCHARD_STATE_DIR)")
	f.StringVar(&cfg.Runtime, "runtime", "local", "where sandboxes run: local (containers on this machine) or kube (pods in --kube-namespace; env ORCHARD_RUNTIME)")
	f.StringVar(&cfg.Kube.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster for --runtime kube; empty: in-cluster (env KUBECONFIG)")
	f.StringVar(&cfg.Kube.AgentImage, "kube-agent-image", "", "image holding /orchard-agent, copied into every sandbox pod (env ORCHARD_KUBE_AGENT_IMAGE)")
	f.StringVar(&cfg.Manager.Namespace, "kube-namespace", cfg.Manager.Namespace, "namespace of sandbox pods (env SANDBOX_NAMESPACE)")
	f.StringVar(&cfg.Store, "store", cfg.Store, "state store: memory, or redis for several replicas (env ORCHARD_STORE, USE_REDIS; REDIS_URL)")
	f.StringArrayVar(&cfg.ImageDirs, "image-dir", nil, "directory whose archives and layouts docker-archive: and oci-layout: images may name; repeat for more (env ORCHARD_IMAGE_DIRS, ':'-separated; none by default)")
	f.StringArrayVar(&cfg.HostExpose, "host-expose", nil, "host path that \"host\" sandboxes see read-only although a mask hides it; repeat for more (env ORCHARD_HOST_EXPOSE, ':'-separated)")
	f.StringSliceVar(&cfg.Harnesses, "harnesses", nil, "coding-agent harnesses to install into the harness store at start ("+strings.Join(harness.Names(), ", ")+", or all; env ORCHARD_HARNESSES); see `orchard harness`")
	f.StringSliceVar(&cfg.Manager.DefaultHarnesses, "default-harnesses", nil, "harnesses on the PATH of a sandbox whose create names none (or all; env DEFAULT_HARNESSES)")
	f.StringVar(&cfg.Manager.DefaultEphemeralStorage, "default-ephemeral-storage", cfg.Manager.DefaultEphemeralStorage,
		"what a sandbox that names no ephemeral_storage may write to its filesystem, on the host's disk (env DEFAULT_EPHEMERAL_STORAGE)")
	return cmd
}

func newLogger(cfg Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(strings.ToUpper(cfg.LogLevel)))
	opts := &slog.HandlerOptions{Level: lvl}
	if strings.EqualFold(cfg.LogFormat, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// apiKeys returns the configured keys, or the key kept in the state
// directory, generating (and announcing) it on first start.
func apiKeys(cfg Config, out io.Writer) ([]string, error) {
	if len(cfg.Server.APIKeys) > 0 || !cfg.Server.RequireAPIKey {
		return cfg.Server.APIKeys, nil
	}
	path := filepath.Join(cfg.StateDir, "api-key")
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) != "" {
		fmt.Fprintf(out, "API key: read from %s (send it as X-API-Key)\n", path)
		return []string{strings.TrimSpace(string(b))}, nil
	}
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return nil, err
	}
	key := base64.RawURLEncoding.EncodeToString(buf)
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("keep generated API key: %w", err)
	}
	fmt.Fprintf(out, "API key (generated, kept in %s; shown once):\n  %s\n", path, key)
	return []string{key}, nil
}

func serve(ctx context.Context, cfg Config, out io.Writer) error {
	srv, err := startServer(ctx, cfg, out)
	if err != nil {
		return err
	}
	return srv.wait()
}

// instance is a started Orchard server: its address, its keys, and what
// runs it.
type instance struct {
	URL  string
	Keys []string
	g    *errgroup.Group
	// closers release what the server was built on, last first, once it
	// has stopped.
	closers []func()
}

// wait blocks until the server has stopped (its context ended and
// shutdown finished) and releases what it held.
func (s *instance) wait() error {
	err := s.g.Wait()
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	return err
}

// startServer builds the server of cfg (its runtime, the configured
// store) and starts serving; it stops when ctx ends. The caller waits for
// it with wait.
func startServer(ctx context.Context, cfg Config, out io.Writer) (_ *instance, err error) {
	s := &instance{}
	defer func() {
		if err != nil {
			for i := len(s.closers) - 1; i >= 0; i-- {
				s.closers[i]()
			}
		}
	}()
	log := newLogger(cfg, os.Stderr)
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	keys, err := apiKeys(cfg, out)
	if err != nil {
		return nil, err
	}
	cfg.Server.APIKeys, s.Keys = keys, keys
	// Pods get the agent from the agent image: the kube runtime needs no
	// agent binary beside the server.
	var agentPath string
	if cfg.Runtime != "kube" {
		if agentPath, err = agentbin.Resolve(filepath.Join(cfg.StateDir, "bin"), cfg.AgentPath); err != nil {
			return nil, err
		}
	}
	initPath := cfg.InitPath
	if initPath == "" {
		initPath = initBeside()
	}
	stateDir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	cfg.Server.Metrics = metrics.New()
	rt, err := newRuntime(ctx, &cfg, stateDir, agentPath, initPath, log)
	if err != nil {
		return nil, err
	}
	if c, ok := rt.(runtime.Closer); ok {
		s.closers = append(s.closers, func() { _ = c.Close() })
	}
	st, closeStore, err := openStore(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, closeStore)
	sites, err := newSiteHealth(cfg, st, log)
	if err != nil {
		return nil, err
	}
	cfg.Server.SiteHealth = sites
	hub, err := newEgressHub(cfg, sites, log)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, hub.Close)
	cfg.Manager.Egress = hub
	cfg.Server.RecordingsDir = filepath.Join(cfg.StateDir, "recordings")
	if u := os.Getenv("JUDGE_URL"); u != "" {
		cfg.Server.Judge = &evaluate.JudgeConfig{URL: u, Model: os.Getenv("JUDGE_MODEL"), APIKey: os.Getenv("JUDGE_API_KEY")}
	}
	cfg.Manager.Browser = true
	cfg.Manager.Desktop = true
	cfg.Manager.AdoptOrphans = cfg.Store == "memory"
	if cfg.Store == "memory" && cfg.Manager.PoolsFile == "" {
		// Redis keeps the pools' definitions itself; the memory store
		// dies with the process, so they are kept beside its sandboxes.
		cfg.Manager.PoolsFile = filepath.Join(stateDir, "pools.json")
	}
	cfg.Manager.OnRetry = cfg.Server.Metrics.ObserveRetry
	agents := agentclient.NewPool(0)
	mgr := manager.New(cfg.Manager, rt, st, func(addr string) manager.Agent { return agents.Client(addr) }, log)
	if _, local := rt.(*local.Local); local {
		dir := filepath.Join(stateDir, "runtime")
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		if err := mgr.ClaimHost(ctx, dir); err != nil {
			return nil, err
		}
	}
	if err := mgr.Recover(ctx); err != nil {
		log.Warn("recover sandboxes from an earlier run", "err", err)
	}
	srv, err := server.New(cfg.Server, mgr, log)
	if err != nil {
		return nil, err
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s.URL = "http://" + ln.Addr().String()
	httpSrv := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		// The SDK pools connections and reuses them after idle gaps; keep
		// them at least as long as Orchard's uvicorn does (120 s).
		IdleTimeout: 125 * time.Second,
	}
	where := "local runtime"
	if cfg.Runtime == "kube" {
		where = "kube runtime, namespace " + cfg.Manager.Namespace
	}
	fmt.Fprintf(out, "Orchard %s serving on http://%s (%s, %s store, state in %s)\n", version, ln.Addr(), where, cfg.Store, cfg.StateDir)
	if cfg.Server.RequireAPIKey {
		fmt.Fprintf(out, "Authenticate with the header X-API-Key; for the SDK: export SANDBOX_BASE_URL=http://%s SANDBOX_API_KEY=<key>\n", ln.Addr())
	} else {
		fmt.Fprintln(out, "Authentication is disabled (REQUIRE_API_KEY=false)")
	}

	g, gctx := errgroup.WithContext(ctx)
	s.g = g
	g.Go(func() error {
		if err := httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error { return mgr.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		// Fixed order: stop taking requests, let in-flight ones and their
		// jobs finish within the bound, then stop background work.
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		log.Info("shutting down")
		_ = httpSrv.Shutdown(sctx)
		if err := mgr.Shutdown(sctx); err != nil {
			log.Warn("shutdown: background work cut short", "err", err)
		}
		return nil
	})
	return s, nil
}

// openStore opens the configured store: the only place that names the
// concrete backends.
func openStore(ctx context.Context, cfg Config, log *slog.Logger) (store.Store, func(), error) {
	if cfg.Store != "redis" {
		return memory.New(), func() {}, nil
	}
	redis.RouteClientLogs(log)
	st, err := redis.New(ctx, redis.Config{URL: cfg.RedisURL, Prefix: cfg.RedisPrefix, CAFile: cfg.RedisCACert, Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("redis store: %w", err)
	}
	return st, func() { _ = st.Close() }, nil
}

// initBeside is orchard-init beside this binary (scripts/dev.sh builds both
// into bin/), or "" when there is none: containers' inits then run as this
// binary, correct but ≈4 ms of CPU slower each. Found through os.Args[0]:
// after ReexecSealed, /proc/self/exe is the sealed copy, beside nothing.
func initBeside() string {
	exe := os.Args[0]
	if !strings.Contains(exe, "/") {
		var err error
		if exe, err = exec.LookPath(exe); err != nil {
			return ""
		}
	}
	p := filepath.Join(filepath.Dir(exe), "orchard-init")
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return p
}

// newRuntime starts the runtime cfg names: the local one, or pods through
// the kube one (which also sets what the manager does differently there).
func newRuntime(ctx context.Context, cfg *Config, stateDir, agentPath, initPath string, log *slog.Logger) (runtime.Runtime, error) {
	if cfg.Runtime == "kube" {
		// Pods have no host image: a create that names none gets the
		// runtime's default for its kind.
		cfg.Manager.RuntimeImages = true
		if cfg.Manager.MaxConcurrentCreates == 0 {
			// A create costs this machine one API call and a wait on the
			// informer, not a container start: the cluster bounds them.
			cfg.Manager.MaxConcurrentCreates = kubeConcurrentCreates
		}
		cfg.Kube.SandboxTTL = cfg.Manager.SandboxTTL
		kr, err := newKubeRuntime(ctx, cfg.Kube, cfg.Manager.Namespace, cfg.Server.Metrics, log)
		if err != nil {
			return nil, err
		}
		return kr, nil
	}
	hs := &harness.Store{Dir: filepath.Join(stateDir, "harnesses"), Out: os.Stderr}
	if len(cfg.Harnesses) > 0 {
		names := cfg.Harnesses
		if len(names) == 1 && names[0] == harness.All {
			names = harness.Names()
		}
		if err := hs.Install(ctx, names); err != nil {
			return nil, err
		}
	}
	lr, err := local.New(local.Config{
		StateDir: filepath.Join(stateDir, "runtime"), AgentPath: agentPath, InitPath: initPath, Logger: log,
		HarnessDir: hs.Dir,
		// All of it: the API key, recordings, the agent binary.
		HostMasks:  []string{stateDir},
		HostExpose: cfg.HostExpose,
		ImageDirs:  cfg.ImageDirs,
	})
	if err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	return lr, nil
}
