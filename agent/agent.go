// Package agent is the in-sandbox HTTP server (exec, PTY, files, patches)
// and the client the server uses to reach it.
//
// The agent usually runs as PID 1 of a sandbox. It serves HTTP/1.1 on a unix
// socket, starts every command in its own session so that timeouts can kill
// the whole process group, reaps every child (its own and inherited orphans)
// from one place, and confines file operations to a root directory. A plain
// command that `bash -c` would only exec (see oneshot.go) is exec'd by the
// agent itself, with the environment bash would have given it.
package agent

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/inject"
)

// DefaultSocket is where the agent listens inside a sandbox.
const DefaultSocket = "/run/orchard/agent.sock"

// Defaults of Config.
const (
	DefaultRoot = "/"
	DefaultCwd  = "/workspace"
	// DefaultMaxOutputBytes caps each of stdout and stderr of one command.
	// Orchard has no cap; 64 MiB keeps any sane command whole while a
	// runaway `yes` cannot exhaust the agent's or the server's memory.
	DefaultMaxOutputBytes = 64 << 20
	// DefaultExecTimeout is Orchard's DEFAULT_TIMEOUT_SECONDS, used when a
	// request says 0.
	DefaultExecTimeout = 300 * time.Second
	// DefaultPatchTimeout is Orchard's apply_patch default.
	DefaultPatchTimeout = 30 * time.Second
)

const (
	// maxJSONBody bounds every JSON request but uploads: commands, env and
	// patches are text a person or a model wrote.
	maxJSONBody = 16 << 20
	// maxUploadBody admits 1 GiB of base64 plus the JSON around it.
	maxUploadBody = 1<<30 + 64<<10
	// maxUploadField bounds an upload's path and mode: a path is at most
	// PATH_MAX (4096) bytes, and a value past this bound is refused
	// rather than held.
	maxUploadField = 64 << 10

	// readHeaderTimeout only bounds a client that connects and says
	// nothing; bodies and responses are unbounded in time because exec
	// streams last as long as the command.
	readHeaderTimeout = 10 * time.Second
	// idleTimeout keeps pooled connections from the server open well past
	// its 120 s keep-alive expectation (ORCHARD_COMPAT §0 fact 10).
	idleTimeout = 5 * time.Minute
	// shutdownGrace is how long in-flight requests may finish after the
	// agent is told to stop; then running commands are killed. The sandbox
	// is going away, so this is short.
	shutdownGrace = 5 * time.Second
)

// Config configures an agent Server. The zero value of each field means its
// default.
type Config struct {
	// Root confines every file operation: sandbox paths are resolved
	// inside it, with symlinks and ".." unable to leave it. Default "/".
	Root string
	// Cwd is the default working directory of commands, PTYs and patches,
	// and the base of relative file paths. Default $WORKING_DIR from Env,
	// else "/workspace".
	Cwd string
	// Env is the environment commands inherit (before the request's env and
	// without PYTHONHOME, PYTHONPATH, LD_LIBRARY_PATH). Default os.Environ().
	Env []string
	// MaxOutputBytes caps each output stream of one command when the request
	// does not say. Default DefaultMaxOutputBytes.
	MaxOutputBytes int64
	// ExecTimeout applies when an exec request has no timeout. Default
	// DefaultExecTimeout.
	ExecTimeout time.Duration
	// Version is reported by /health.
	Version string
	// Logger receives the agent's logs. Default: discarded.
	Logger *slog.Logger
	// BrowserSocket is where a browser sandbox's browser daemon listens.
	// Default /run/orchard-browser.sock.
	BrowserSocket string
	// TokenSHA256, when set, is the SHA-256 of the bearer token every
	// request but /health must carry (Authorization: Bearer <token>): an
	// agent that listens on a network (a pod's) answers only its server.
	// The sandbox's spec holds only the hash, so reading it reveals no
	// token.
	TokenSHA256 []byte
}

// withDefaults returns c with defaults filled in, or an error if a field is
// invalid.
func (c Config) withDefaults() (Config, error) {
	if c.Root == "" {
		c.Root = DefaultRoot
	}
	if c.Env == nil {
		c.Env = withHarnessPath(os.Environ())
	}
	if c.Cwd == "" {
		if wd, ok := envValue(c.Env, "WORKING_DIR"); ok && wd != "" {
			c.Cwd = wd
		} else {
			c.Cwd = DefaultCwd
		}
	}
	if c.MaxOutputBytes < 0 {
		return c, fmt.Errorf("config: max output bytes %d is negative", c.MaxOutputBytes)
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if c.ExecTimeout < 0 {
		return c, fmt.Errorf("config: exec timeout %v is negative", c.ExecTimeout)
	}
	if c.ExecTimeout == 0 {
		c.ExecTimeout = DefaultExecTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Server is the agent. It serves once: Serve releases its resources when it
// returns; a Server that is never served must be closed with Close.
type Server struct {
	cfg    Config
	log    *slog.Logger
	root   *os.Root
	reaper *reaper
	// devnull is every command's stdin, opened once rather than per exec.
	devnull int
	// bashes says, per bash binary, whether commands may skip it.
	bashes bashProbes
	// browser is the browser daemon of a browser sandbox; nil otherwise.
	browser *browserProc
	// desktop is the desktop daemon of a desktop sandbox; nil otherwise.
	desktop *browserProc
	// egress is the network-enabled sandbox's proxy; nil without network.
	egress *egressState
	// inject is the sandbox's fault plan; nil without one.
	inject *inject.Injector
	mux    *http.ServeMux

	// mu guards closing and the Add side of handlers, so that no handler
	// starts once shutdown waits for them.
	mu       sync.RWMutex
	closing  bool
	handlers sync.WaitGroup

	closeOnce sync.Once
}

// New validates cfg and prepares a Server: it opens the file root and joins
// the process's child reaper.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", cfg.Root, err)
	}
	devnull, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("open %s: %w", os.DevNull, err)
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		root:    root,
		reaper:  acquireReaper(cfg.Logger),
		devnull: devnull,
		mux:     http.NewServeMux(),
	}
	s.route("GET /health", s.handleHealth)
	s.route("POST /exec", s.handleExec)
	s.route("GET /exec/pty", s.handlePTY)
	s.route("POST /files/upload", s.handleUpload)
	s.route("GET /files/download", s.handleDownload)
	s.route("GET /files/list", s.handleList)
	s.route("POST /patch", s.handlePatch)
	s.route("/browser/", s.handleBrowser)
	s.route("/desktop/", s.handleDesktop)
	s.route("POST "+egress.TunnelPath, s.handleTunnel)
	s.route("GET /egress/log", s.handleNetwork)
	s.route("GET "+api.AgentDialPath, s.handleDial)
	s.route("/", s.handleUnknown)
	return s, nil
}

// Close releases the Server's resources. Serve calls it; it is safe to call
// more than once.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.reaper.release()
		_ = syscall.Close(s.devnull)
		err = s.root.Close()
	})
	return err
}

// Serve answers requests on ln until ctx ends, then shuts down: requests in
// flight get shutdownGrace to finish, then running commands and PTY sessions
// are killed, and Serve returns once every handler has.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	defer s.Close()
	// Every request context derives from base, so cancelling it reaches
	// handlers that net/http no longer tracks (hijacked WebSockets).
	base, cancelBase := context.WithCancelCause(context.Background())
	defer cancelBase(nil)
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	var err error
	select {
	case err = <-served:
		// The listener failed; nothing else will stop the handlers.
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()

	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	if serr := srv.Shutdown(sctx); serr != nil && !errors.Is(serr, context.DeadlineExceeded) {
		s.log.Warn("shutdown", "err", serr)
	}
	cancel()
	cancelBase(errors.New("agent shutting down"))
	_ = srv.Close()
	s.handlers.Wait()
	if err == nil {
		err = <-served
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// handlerFunc is a handler that reports failure by returning it; route turns
// the error into the JSON envelope.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) route(pattern string, h handlerFunc) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s.mu.RLock()
		if s.closing {
			s.mu.RUnlock()
			s.writeError(w, r, faults.New(faults.CodeShuttingDown, faults.Unavailable, faults.Sandbox, "agent is shutting down"))
			return
		}
		s.handlers.Add(1)
		s.mu.RUnlock()
		defer s.handlers.Done()
		if pattern != "GET /health" && !s.authorized(r) {
			s.writeError(w, r, faults.New(faults.CodeForbidden, faults.PermissionDenied, faults.Platform, "this agent answers its server only"))
			return
		}
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// authorized reports whether r carries the agent's token, when it has one.
func (s *Server) authorized(r *http.Request) bool {
	if s.cfg.TokenSHA256 == nil {
		return true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], s.cfg.TokenSHA256) == 1
}

// writeError is the one place errors become HTTP responses.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := faults.Of(err)
	level := slog.LevelInfo
	if e.Category == faults.Internal {
		level = slog.LevelError
	}
	s.log.Log(r.Context(), level, "request failed", "method", r.Method, "path", r.URL.Path,
		"category", e.Category, "source", e.Source, "code", e.Code, "err", err)
	writeJSON(w, e.StatusOf(), faults.EnvelopeOf(e))
}

// writeFault answers with err's envelope: the daemons' error writer, which
// have no request logging of their own.
func writeFault(w http.ResponseWriter, err error) {
	f := faults.Of(err)
	writeJSON(w, f.StatusOf(), faults.EnvelopeOf(f))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeJSON reads r's body, at most limit bytes, into v. It reads to EOF so
// that net/http starts watching the connection and cancels the request
// context if the client goes away while a command runs.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body := http.MaxBytesReader(w, r.Body, limit)
	err := json.NewDecoder(body).Decode(v)
	if err == nil {
		_, err = io.Copy(io.Discard, body)
	}
	var tooBig *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooBig):
		return faults.Wrap(err, faults.CodeTooLarge, faults.TooLarge, faults.Client,
			fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
	default:
		return faults.Wrap(err, faults.CodeInvalidJSON, faults.InvalidRequest, faults.Client, "invalid JSON body: "+err.Error())
	}
}

// handleUnknown answers what no route matched: 405 when the path exists
// with another method, else 404.
func (s *Server) handleUnknown(w http.ResponseWriter, r *http.Request) error {
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "/" {
			return faults.Newf(faults.CodeMethodNotAllowed, faults.InvalidRequest, faults.Client, "method %s not allowed on %s", r.Method, r.URL.Path).WithStatus(http.StatusMethodNotAllowed)
		}
	}
	return faults.Newf(faults.CodeRouteNotFound, faults.NotFound, faults.Client, "no route %s %s", r.Method, r.URL.Path)
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, api.AgentHealth{Status: "ok", PID: os.Getpid(), Version: s.cfg.Version})
	return nil
}

// Main parses flags and serves until ctx ends.
func Main(ctx context.Context, args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("orchard-agent", flag.ContinueOnError)
	sock := fs.String("socket", DefaultSocket, "unix socket to listen on")
	listenFD := fs.Int("listen-fd", -1, "serve on this inherited listening socket instead of --socket")
	listenTCP := fs.String("listen", "", "serve on this TCP address (host:port) instead of --socket; needs --token-sha256")
	tokenHash := fs.String("token-sha256", "", "hex SHA-256 of the bearer token every request but /health must carry")
	threads := fs.Int("reserve-threads", 0, "OS threads to make at start (see reserveThreads)")
	kind := fs.String("kind", "shell", "sandbox kind: shell or browser")
	kindOptions := fs.String("kind-options", "{}", "the kind's settings (JSON)")
	egressListen := fs.String("egress-proxy", "", "serve the sandbox's HTTP proxy on this address (network-enabled sandboxes)")
	egressDirect := fs.Bool("egress-direct", false, "dial from inside the sandbox instead of through the server's tunnel")
	egressAllow := fs.String("egress-allow", "", "with --egress-direct: comma-separated host patterns to allow (empty: all)")
	faultPlan := fs.String("faults", "", "fault plan (JSON) to inject, for testing attribution")
	seccompFD := fs.Int("seccomp-fd", -1, "install the seccomp BPF program read from this inherited descriptor before anything else")
	seccompFlags := fs.Uint("seccomp-flags", 0, "seccomp(2) flags to install the program with (TSYNC is always added)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var sum []byte
	if *tokenHash != "" {
		var herr error
		if sum, herr = hex.DecodeString(*tokenHash); herr != nil || len(sum) != sha256.Size {
			return fmt.Errorf("--token-sha256: want %d hex bytes", sha256.Size)
		}
	}
	if *listenTCP != "" && sum == nil {
		// A network listener without a token would serve anyone who can
		// reach the sandbox.
		return errors.New("--listen needs --token-sha256")
	}
	if *kind == "shell" {
		// A shell sandbox's agent only passes bytes and waits on its
		// children: with one P its goroutine hand-offs stay on one thread
		// instead of waking idle ones that spin and sleep again. Measured
		// per exec of "true" (2,000, alternating builds): 465–485 µs of
		// the agent's CPU with the machine's two Ps, 365–370 µs with one,
		// 9 threads instead of 10–11, and the exec round trip 1–3 %
		// faster. Browser and desktop agents encode images and keep theirs.
		goruntime.GOMAXPROCS(1)
	}
	if *seccompFD >= 0 {
		if err := installSeccomp(*seccompFD, *seccompFlags); err != nil {
			return err
		}
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	version := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	s, err := New(Config{Cwd: getenv("WORKING_DIR"), Version: version, Logger: log, TokenSHA256: sum})
	if err != nil {
		return err
	}
	if *threads > 0 {
		reserveThreads(*threads)
	}
	if *faultPlan != "" {
		var plan faults.Plan
		if err := json.Unmarshal([]byte(*faultPlan), &plan); err != nil {
			s.Close()
			return fmt.Errorf("fault plan: %w", err)
		}
		if err := plan.Validate(); err != nil {
			s.Close()
			return fmt.Errorf("fault plan: %w", err)
		}
		s.inject = inject.New(&plan, 0)
	}
	if *egressListen != "" {
		if err := s.startEgress(ctx, EgressConfig{Listen: *egressListen, Direct: *egressDirect, Allow: parseAllow(*egressAllow)}); err != nil {
			s.Close()
			return err
		}
	}
	if *kind == "desktop" {
		// The sandbox is ready when its X session is, and every command
		// gets its DISPLAY.
		if s.desktop, err = s.startDesktop(ctx, *kindOptions); err != nil {
			s.Close()
			return fmt.Errorf("start desktop: %w", err)
		}
	}
	if *kind == "browser" {
		// The sandbox is ready when its browser is: start it before serving.
		if s.browser, err = s.startBrowser(ctx, *kindOptions); err != nil {
			s.Close()
			return fmt.Errorf("start browser: %w", err)
		}
	}
	var ln net.Listener
	switch {
	case *listenTCP != "":
		ln, err = net.Listen("tcp", *listenTCP)
		if err == nil {
			*sock = ln.Addr().String()
		}
	case *listenFD >= 0:
		// The server made the socket on the host and passed it down, so
		// its path is out of the sandbox's reach.
		f := os.NewFile(uintptr(*listenFD), "agent-listener")
		ln, err = net.FileListener(f)
		f.Close()
		if err == nil {
			*sock = ln.Addr().String()
		}
	default:
		ln, err = listenUnix(*sock)
	}
	if err != nil {
		s.Close()
		return err
	}
	log.Info("agent listening", "socket", *sock, "pid", os.Getpid(), "version", version)
	return s.Serve(ctx, ln)
}

// listenUnix listens on path, replacing a socket left by an earlier run.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return ln, nil
}

// reserveThreads makes the runtime start n OS threads now. Threads count
// against the sandbox's pids limit, and the Go runtime dies when it cannot
// make one it needs — so a fork bomb that exhausts the limit would take the
// agent down with it. Idle threads are kept and reused, so with these in
// hand the agent keeps serving (and can kill the bomb) while the limit is
// exhausted. The runtime picks n from the sandbox's pids limit.
//
// Each goroutine
// locks itself to a thread, so while all are locked each holds its own;
// unlocked, the threads go idle and stay in the runtime's pool.
func reserveThreads(n int) {
	var all, release sync.WaitGroup
	all.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			goruntime.LockOSThread()
			all.Done()
			release.Wait()
			goruntime.UnlockOSThread()
		}()
	}
	all.Wait()
	release.Done()
	done.Wait()
}
