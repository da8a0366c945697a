// Package local runs sandboxes as containers on this host, started in-process
// with runc's libcontainer: pid, mount, net (loopback only), uts, ipc and
// cgroup namespaces, cgroup limits, runc's default capabilities, masked and
// read-only /proc paths, no_new_privs and Docker's default seccomp profile
// (when built with the "seccomp" tag). Each sandbox's root is an overlay:
// the host's root with host-private folders masked (image "host"),
// or the cached layers of an OCI image, under a private writable layer on a
// per-sandbox filesystem on disk, as large as the sandbox's ephemeral
// storage limit (disk.go). The agent binary is bind-mounted read-only and runs as
// the container's init; the server reaches it over a host unix
// socket whose listening descriptor the agent inherits (the path itself
// stays outside the sandbox).
//
// The binary that uses this package must call Init first thing in main (see
// Init): libcontainer re-executes it as the container's init.
package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
	// Required by libcontainer to enter namespaces in the re-executed init.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
)

var (
	_ runtime.Runtime         = (*Local)(nil)
	_ runtime.OOMCounter      = (*Local)(nil)
	_ runtime.Closer          = (*Local)(nil)
	_ runtime.ImageChecker    = (*Local)(nil)
	_ runtime.StorageCapacity = (*Local)(nil)
)

// ImageHost is the default image: the host's root, read-only, under a
// private writable layer, with host-private folders masked.
const ImageHost = "host"

// Paths inside a sandbox.
const (
	agentMount = "/.orchard/bin/orchard-agent"
	workspace  = "/workspace"
)

// Config configures a Local runtime.
type Config struct {
	// StateDir holds all state: libcontainer's root (containers/), one
	// directory per sandbox (sandboxes/<id>/), the sandboxes' writable
	// layers (disks/) and the image cache (images/).
	// containers/ and sandboxes/ are tmpfs mounts while they hold
	// sandboxes (see runState).
	// Keep it short: the agent's socket path (StateDir/sandboxes/<id>/run/
	// agent.sock) must fit in 107 bytes. Keep it out of the directory that
	// holds the server binary: libcontainer then seals the binary for each
	// container's init with a cheap overlay instead of copying it. Required.
	StateDir string
	// AgentPath is the host path of the static orchard-agent binary,
	// bind-mounted read-only into every sandbox. Required.
	AgentPath string
	// InitPath is the host path of orchard-init (cmd/orchard-init) from the
	// same build, that containers' init processes run as (initredirect.go).
	// Empty: they run as this binary, correct but ≈4 ms of CPU slower per
	// create, this binary's package initialisation.
	InitPath string
	// CgroupParent is the cgroup (relative to each hierarchy's root) under
	// which sandboxes get their cgroups. Default "orchard".
	CgroupParent string
	// DefaultPidsLimit applies when a Spec sets no PidsLimit. Default 1024.
	DefaultPidsLimit int64
	// WritableBytes caps the writable layer of a sandbox whose Spec sets
	// no EphemeralStorageBytes. Default 10 GiB.
	WritableBytes int64
	// WritableInMemory keeps writable layers on a tmpfs per sandbox, whose
	// pages count against the sandbox's memory limit, instead of on disk.
	// Also what a host that cannot loop-mount ext4 gets.
	WritableInMemory bool
	// HostMasks lists extra host paths hidden from "host" sandboxes, on top
	// of the built-in ones (/tmp, /root, /home, /var/lib, /var/log, /work,
	// StateDir, ...).
	HostMasks []string
	// HostExpose lists host paths that "host" sandboxes see read-only
	// although a mask hides them (a dataset under /home, a service's logs
	// in /var/log): each is bound read-only at its own path (symlinks
	// resolved), one file system (mounts below it are not included). A
	// path may not be or hold StateDir, a HostMasks path or the host's key
	// files (/etc/shadow, TLS and SSH keys), lie inside one of them, or
	// hold any other mask, which it would undo; New refuses it.
	HostExpose []string
	// ImageDirs lists the directories whose archives and layouts
	// "docker-archive:" and "oci-layout:" references may name, once the
	// reference's symlinks and ".." are resolved; a reference naming any
	// other path is refused (image.path_not_allowed), so that API clients
	// cannot make the server open what it can read of the host. Empty (the
	// default): such references are refused. A directory may not be "/"
	// or hold or lie in StateDir, which holds every sandbox's writable
	// layer and what images unpacked to.
	ImageDirs []string
	// HarnessDir is the harness store (harness.Store.Dir) whose current
	// generation sandboxes that ask for harnesses get, read-only, at
	// harness.MountPath. Empty: no harnesses.
	HarnessDir string
	// Logger receives lifecycle events. Default slog.Default().
	Logger *slog.Logger
}

func (c *Config) validate() error {
	if c.StateDir == "" {
		return errors.New("local runtime: StateDir is required")
	}
	if c.AgentPath == "" {
		return errors.New("local runtime: AgentPath is required")
	}
	var err error
	if c.StateDir, err = filepath.Abs(c.StateDir); err != nil {
		return fmt.Errorf("local runtime: StateDir: %w", err)
	}
	if c.AgentPath, err = filepath.Abs(c.AgentPath); err != nil {
		return fmt.Errorf("local runtime: AgentPath: %w", err)
	}
	if fi, err := os.Stat(c.AgentPath); err != nil {
		return fmt.Errorf("local runtime: agent binary: %w", err)
	} else if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("local runtime: agent binary %s is not an executable file", c.AgentPath)
	}
	if c.CgroupParent == "" {
		c.CgroupParent = "orchard"
	}
	c.CgroupParent = "/" + strings.Trim(filepath.Clean("/"+c.CgroupParent), "/")
	if c.DefaultPidsLimit == 0 {
		c.DefaultPidsLimit = 1024
	}
	if c.WritableBytes == 0 {
		c.WritableBytes = 10 << 30
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	for i, m := range c.HostMasks {
		m = filepath.Clean(m)
		if !filepath.IsAbs(m) || m == "/" {
			return fmt.Errorf("local runtime: host mask %q must be an absolute path below /", c.HostMasks[i])
		}
		c.HostMasks[i] = m
	}
	stateDir := c.StateDir
	if sd, err := filepath.EvalSymlinks(stateDir); err == nil {
		stateDir = sd
	}
	for i, d := range c.ImageDirs {
		rd, err := imageDir(d, stateDir)
		if err != nil {
			return fmt.Errorf("local runtime: image directory %s: %w", d, err)
		}
		c.ImageDirs[i] = rd
	}
	for i, p := range c.HostExpose {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("local runtime: exposed host path %q must be absolute", p)
		}
		c.HostExpose[i] = filepath.Clean(p)
	}
	return nil
}

// imageDir returns d, an image directory (Config.ImageDirs), with its
// symlinks resolved, or why it cannot be one.
func imageDir(d, stateDir string) (string, error) {
	if !filepath.IsAbs(d) {
		return "", errors.New("not an absolute path")
	}
	rd, err := filepath.EvalSymlinks(d)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(rd); err != nil || !fi.IsDir() {
		return "", errors.New("not a directory")
	}
	if rd == "/" || within(rd, stateDir) || within(stateDir, rd) {
		return "", fmt.Errorf("it is, holds or lies in the state directory %s", stateDir)
	}
	return rd, nil
}

// Local is the local runtime. It is safe for concurrent use.
type Local struct {
	cfg       Config
	log       *slog.Logger
	ctrRoot   string // libcontainer's state root
	boxRoot   string // one directory per sandbox
	images    *imageStore
	hostMasks masks
	swap      bool // memory+swap can be limited (no swap escape)
	cgroups   []cgroupHierarchy
	// protectAgent: the agent's oom_score_adj can be lowered (needs
	// CAP_SYS_RESOURCE, which some hosts' root lacks).
	protectAgent bool
	nofile       uint64 // RLIMIT_NOFILE of sandbox processes
	// disks holds the sandboxes' writable layers when onDisk; otherwise
	// only what an earlier process left there (disk.go).
	disks  *disks
	onDisk bool
	// layers keeps saved layers (snapshots); nil when this host cannot
	// make their filesystem (layers.go).
	layers *layers
	// fullNet gives full-network sandboxes their veths and host rules.
	fullNet *fullNet
	// masks is the detached mount that hides hostMasks, stacked over the
	// host root of every "host" sandbox (buildMasksLayer); nil when the
	// kernel cannot, and then each mask is a mount. Closed by Close.
	masks *os.File
	// init is the sealed copy of Config.InitPath handed to every
	// container's init; nil without one. Closed by Close.
	init *os.File
	// seccomp is every sandbox's syscall filter, built once: it depends
	// only on the host and the capability set, and building it probes the
	// kernel and libseccomp. Read-only once built. Nil when seccomp is not
	// compiled in.
	seccomp *configs.Seccomp
	// seccompProg is seccomp compiled once (compileSeccomp), in a sealed
	// memfd that every sandbox's agent installs from; nil when compiling
	// failed, and then libcontainer compiles seccomp in each init. Closed
	// by Close.
	seccompProg  *os.File
	seccompFlags uint // seccomp(2) flags of seccompProg
	// wideCgroups warns once that sandboxes could not be kept to
	// sandboxControllers.
	wideCgroups sync.Once
	// run keeps ctrRoot and boxRoot on a tmpfs (runstate.go). Closed by
	// Close.
	run *runState

	mu        sync.Mutex // guards sandboxes and closed
	sandboxes map[string]*sandbox
	closed    bool

	watchers sync.WaitGroup // one goroutine per live sandbox, stopped by Close
}

// New returns a Local runtime over cfg.StateDir, creating the directories it
// needs. Sandboxes left in StateDir by an earlier process are re-attached on
// first use (Inspect, List, Delete).
func New(cfg Config) (*Local, error) {
	cfg.HostMasks = slices.Clone(cfg.HostMasks)
	cfg.HostExpose = slices.Clone(cfg.HostExpose)
	cfg.ImageDirs = slices.Clone(cfg.ImageDirs)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	l := &Local{
		cfg:       cfg,
		log:       cfg.Logger.With("runtime", "local"),
		ctrRoot:   filepath.Join(cfg.StateDir, "containers"),
		boxRoot:   filepath.Join(cfg.StateDir, "sandboxes"),
		sandboxes: map[string]*sandbox{},
		swap:      swapAccounting(),
		cgroups:   cgroupHierarchies(),

		protectAgent: canLowerOOMScore(),
		fullNet:      &fullNet{},
	}
	l.hostMasks = hostMasks(cfg.StateDir, cfg.HostMasks)
	secrets := append([]string{cfg.StateDir, "/var/lib/orchard"}, keyFiles()...)
	secrets = append(secrets, cfg.HostMasks...)
	for i, p := range cfg.HostExpose {
		rp, err := checkExposed(p, l.hostMasks, secrets)
		if err != nil {
			return nil, fmt.Errorf("local runtime: expose %s to sandboxes: %w", p, err)
		}
		l.cfg.HostExpose[i] = rp
	}
	l.nofile = nofileLimit(l.protectAgent)
	if !l.protectAgent {
		l.log.Warn("no CAP_SYS_RESOURCE: agents keep the default OOM score and may be killed with the user's processes")
	}
	var err error
	if l.seccomp, err = sandboxSeccomp(); err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	if !seccompEnabled {
		l.log.Warn("built without the seccomp build tag: sandboxes run without a syscall filter")
	}
	if l.seccomp != nil {
		prog, flags, err := compileSeccomp(l.seccomp)
		l.seccompFlags = flags
		if err == nil {
			l.seccompProg, err = sealedData("orchard-seccomp", prog)
		}
		if err != nil {
			// Still filtered, at ≈4 ms of CPU more per create.
			l.log.Warn("seccomp filter not precompiled: each container's init compiles it", "err", err)
		}
	}
	for _, d := range []string{cfg.StateDir, l.ctrRoot, l.boxRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("local runtime: %w", err)
		}
	}
	if l.images, err = newImageStore(filepath.Join(cfg.StateDir, "images"), cfg.ImageDirs, l.log); err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	if l.disks, err = newDisks(filepath.Join(cfg.StateDir, "disks"), l.log); err != nil {
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	loopErr := l.disks.usable()
	if loopErr == nil {
		l.layers = newLayers(cfg.StateDir, l.disks.mkfs)
	}
	if !cfg.WritableInMemory {
		if loopErr != nil {
			l.log.Warn("sandboxes' writable layers are kept in memory, counted against their memory limits", "err", loopErr)
		} else {
			l.onDisk = true
		}
	}
	if cfg.InitPath != "" {
		if l.init, err = sealInit(cfg.InitPath); err != nil {
			return nil, fmt.Errorf("local runtime: container init %s: %w", cfg.InitPath, err)
		}
	}
	if l.masks, err = buildMasksLayer(l.hostMasks); err == nil {
		if err = overlayTakesLayer(l.masks, l.hostMasks); err != nil {
			l.masks.Close()
			l.masks = nil
		}
	}
	if err != nil {
		l.log.Warn("host masks are mounts in each sandbox, not one shared layer", "err", err)
	}
	// Last: nothing may fail after the mounts, which only Close removes.
	if l.run, err = openRunState(cfg.StateDir, []string{l.ctrRoot, l.boxRoot}, l.log); err != nil {
		l.closeFiles()
		return nil, fmt.Errorf("local runtime: %w", err)
	}
	l.reapStrays(context.Background())
	l.disks.strays(l.recorded)
	return l, nil
}

// Init is the entry point of the container init that libcontainer starts by
// re-executing the current binary with the argument "init". The binary's
// main must call it first thing:
//
//	if len(os.Args) > 1 && os.Args[1] == "init" {
//		local.Init()
//	}
//
// Init does not return.
func Init() {
	if os.Getenv(seccompCompileEnv) != "" {
		os.Exit(seccompCompileChild())
	}
	libcontainer.Init()
}

// sandbox is one sandbox as this process knows it.
type sandbox struct {
	id  string
	dir string

	// op serialises Create, Delete and re-attachment of this sandbox.
	op sync.Mutex

	mu       sync.Mutex // guards the fields below
	meta     meta
	creating bool
	attached bool // container loaded (or created) and watcher started
	// adopted: attached from the state directory rather than created by
	// this Local; another runtime on the directory may create or delete it.
	adopted   bool
	gone      bool // deleted; a new sandbox with this id needs a new entry
	container *libcontainer.Container
	watch     *watcher
	broken    string // why the sandbox cannot be used (half-created, state lost)
	// oomFile is the memory cgroup's file holding the OOM kill count,
	// opened on first use: OOMKills runs around every exec, and re-reading
	// an open file costs one pread where opening it costs four syscalls.
	oomFile *os.File
	// fsRoot is the root of the sandbox's own filesystem (its writable
	// layer's upper and work dirs), held open by this process only: the
	// server's mount of it is detached once the sandbox starts, and this
	// is how SaveLayer still reaches it. Nil for sandboxes this process
	// did not create.
	fsRoot *os.File
}

// closeFSRoot drops the hold on the sandbox's filesystem. The caller
// holds s.mu.
func (s *sandbox) closeFSRoot() {
	if s.fsRoot != nil {
		_ = s.fsRoot.Close()
		s.fsRoot = nil
	}
}

// closeOOMFile drops the cached OOM count file. The caller holds s.mu.
func (s *sandbox) closeOOMFile() {
	if s.oomFile != nil {
		_ = s.oomFile.Close()
		s.oomFile = nil
	}
}

// meta is what a sandbox remembers across server restarts (sandbox.json).
type meta struct {
	ID        string    `json:"id"`
	Image     string    `json:"image"`
	CreatedAt time.Time `json:"created_at"`
	AgentAddr string    `json:"agent_addr"`
	// Spec is the spec the sandbox was created with, so that a restarted
	// server can rebuild its record.
	Spec runtime.Spec `json:"spec"`
	// Disk is the file name of the sandbox's writable layer in disks/;
	// empty when the layer is a tmpfs.
	Disk string `json:"disk,omitempty"`
}

const metaFile = "sandbox.json"

// sandboxFS is where the sandbox's own filesystem is mounted in its
// directory: its disk (or tmpfs), holding the writable layer, the overlay's
// work dir and the root overlay's mountpoint.
const sandboxFS = "fs"

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// maxSockPath is the room in sockaddr_un.sun_path, less the trailing NUL.
const maxSockPath = 107

func (l *Local) sandboxDir(id string) string { return filepath.Join(l.boxRoot, id) }

func (l *Local) sockPath(id string) string {
	return filepath.Join(l.sandboxDir(id), "agent.sock")
}

func (l *Local) checkID(id string) error {
	if !idPattern.MatchString(id) || id == "." || id == ".." {
		return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
			"invalid sandbox id %q: use 1-64 letters, digits, '_', '.', '-'", id)
	}
	if n := len(l.sockPath(id)); n > maxSockPath {
		return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
			"sandbox id %q too long for this server's state directory (socket path %d > %d bytes)", id, n, maxSockPath)
	}
	return nil
}

func notFound(id string) error {
	return faults.Newf(faults.CodeSandboxNotFound, faults.NotFound, faults.Client, "sandbox %s not found", id)
}

func errClosed() error {
	return faults.New(faults.CodeShuttingDown, faults.Unavailable, faults.Platform, "local runtime is closed")
}

// Create starts a sandbox and returns once its agent answers /health.
func (l *Local) Create(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	if err := l.checkID(spec.ID); err != nil {
		return runtime.Instance{}, err
	}
	if spec.Image == "" {
		spec.Image = ImageHost
	}
	id := spec.ID
	s := &sandbox{id: id, dir: l.sandboxDir(id), creating: true}

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return runtime.Instance{}, errClosed()
	}
	if _, ok := l.sandboxes[id]; ok {
		l.mu.Unlock()
		return runtime.Instance{}, exists(id)
	}
	for _, p := range []string{s.dir, filepath.Join(l.ctrRoot, id)} {
		if _, err := os.Lstat(p); err == nil {
			// Left by an earlier process: it must be deleted first.
			l.mu.Unlock()
			return runtime.Instance{}, exists(id)
		}
	}
	l.sandboxes[id] = s
	s.op.Lock()
	l.mu.Unlock()
	defer s.op.Unlock()

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, defaultCreateTimeout, errors.New("sandbox create took too long"))
		defer cancel()
	}
	start := time.Now()
	inst, err := l.create(ctx, s, spec)
	if err != nil {
		// A fresh context: the caller's may be what just expired.
		tctx, cancel := context.WithTimeout(context.Background(), teardownTimeout)
		terr := l.teardown(tctx, s)
		cancel()
		if terr != nil {
			l.log.Error("teardown after failed create", "sandbox_id", id, "err", terr)
		}
		l.forget(s)
		e := faults.Of(err)
		l.log.Warn("create sandbox failed", "sandbox_id", id, "image", spec.Image,
			"category", e.Category, "code", e.Code, "err", err)
		return runtime.Instance{}, err
	}
	l.log.Info("sandbox created", "sandbox_id", id, "image", spec.Image, "took", time.Since(start))
	return inst, nil
}

func exists(id string) error {
	return faults.Newf(faults.CodeSandboxExists, faults.Conflict, faults.Client, "sandbox %s already exists", id)
}

// defaultCreateTimeout bounds a Create whose context has no deadline: an
// agent that never listens must not hang it. Generous, because an image
// pull is part of a create.
const defaultCreateTimeout = 5 * time.Minute

// teardownTimeout bounds cleaning up one sandbox: killing a pid namespace
// and removing cgroups takes milliseconds, but a loaded host can stall
// process exit for seconds.
const teardownTimeout = 30 * time.Second

// forget drops s from the table and marks it gone.
func (l *Local) forget(s *sandbox) {
	s.mu.Lock()
	s.gone = true
	s.creating = false
	s.closeOOMFile()
	s.mu.Unlock()
	l.mu.Lock()
	if l.sandboxes[s.id] == s {
		delete(l.sandboxes, s.id)
	}
	l.mu.Unlock()
}

// Delete kills the sandbox and removes everything it used. Deleting an
// unknown sandbox is not an error.
func (l *Local) Delete(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return nil
	}
	s, err := l.lookup(id)
	if err != nil || s == nil {
		return err
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	gone := s.gone
	s.mu.Unlock()
	if gone {
		return nil
	}
	if err := l.teardown(ctx, s); err != nil {
		return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform,
			fmt.Sprintf("delete sandbox %s", id))
	}
	l.forget(s)
	l.log.Info("sandbox deleted", "sandbox_id", id)
	return nil
}

// Inspect reports the sandbox's liveness.
func (l *Local) Inspect(ctx context.Context, id string) (runtime.Instance, error) {
	if !idPattern.MatchString(id) {
		return runtime.Instance{}, notFound(id)
	}
	s, err := l.lookup(id)
	if err != nil {
		return runtime.Instance{}, err
	}
	if s == nil {
		return runtime.Instance{}, notFound(id)
	}
	inst, ok := s.instance()
	if !ok {
		return runtime.Instance{}, notFound(id)
	}
	return inst, nil
}

// List returns every sandbox in StateDir, including those created by an
// earlier process and half-created ones (not alive) left by a crash.
func (l *Local) List(ctx context.Context) ([]runtime.Instance, error) {
	entries, err := os.ReadDir(l.boxRoot)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform, "list sandboxes")
	}
	seen := map[string]bool{}
	var out []runtime.Instance
	add := func(s *sandbox) {
		if s == nil || seen[s.id] {
			return
		}
		if inst, ok := s.instance(); ok {
			seen[s.id] = true
			out = append(out, inst)
		}
	}
	for _, e := range entries {
		if !e.IsDir() || !idPattern.MatchString(e.Name()) {
			continue
		}
		s, err := l.lookup(e.Name())
		if err != nil {
			return nil, err
		}
		add(s)
	}
	// Sandboxes being created may not have a directory yet.
	l.mu.Lock()
	var live []*sandbox
	for _, s := range l.sandboxes {
		live = append(live, s)
	}
	l.mu.Unlock()
	for _, s := range live {
		add(s)
	}
	slices.SortFunc(out, func(a, b runtime.Instance) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// MaxEphemeralStorage is the largest writable layer a sandbox can get now:
// the space free for the disks (or, when layers are kept in memory, the
// host's memory).
func (l *Local) MaxEphemeralStorage() (int64, error) {
	if !l.onDisk {
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err != nil {
			return 0, err
		}
		return int64(si.Totalram) * int64(si.Unit), nil
	}
	return l.disks.free()
}

// OOMKills returns how many processes the kernel's OOM killer has killed
// in the sandbox's memory cgroup.
func (l *Local) OOMKills(id string) (uint64, error) {
	if !idPattern.MatchString(id) {
		return 0, notFound(id)
	}
	s, err := l.lookup(id)
	if err != nil {
		return 0, err
	}
	if s == nil {
		return 0, notFound(id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return 0, notFound(id)
	}
	if s.container == nil {
		return 0, nil
	}
	// A cached file of a cgroup that was replaced fails to read; the
	// second attempt opens the current one.
	for attempt := 0; ; attempt++ {
		if s.oomFile == nil {
			f, err := l.openOOMFile(id)
			if err != nil {
				return 0, err
			}
			s.oomFile = f
		}
		n, err := readOOMKills(s.oomFile)
		if err == nil || attempt > 0 {
			return n, err
		}
		s.closeOOMFile()
	}
}

// Close stops watching sandboxes without touching them: they keep running
// and a later Local on the same StateDir re-attaches to them.
func (l *Local) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	boxes := make([]*sandbox, 0, len(l.sandboxes))
	for _, s := range l.sandboxes {
		boxes = append(boxes, s)
	}
	l.mu.Unlock()
	for _, s := range boxes {
		s.mu.Lock()
		w := s.watch
		s.closeOOMFile()
		s.closeFSRoot()
		s.mu.Unlock()
		if w != nil {
			w.stop()
		}
	}
	l.watchers.Wait()
	if l.layers != nil {
		l.layers.release(func() bool { return len(l.stackedLayers()) > 0 })
	}
	// A create still starting now fails, as any create racing Close.
	l.closeFiles()
	l.run.close()
	return nil
}

// closeFiles closes what New opened for every sandbox.
func (l *Local) closeFiles() {
	if l.init != nil {
		_ = l.init.Close()
	}
	if l.seccompProg != nil {
		_ = l.seccompProg.Close()
	}
	if l.masks != nil {
		_ = l.masks.Close() // live sandboxes' roots hold their own reference
	}
}

// lookup returns the sandbox called id, re-attaching to one left by an
// earlier process; nil if there is none.
func (l *Local) lookup(id string) (*sandbox, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errClosed()
	}
	s, ok := l.sandboxes[id]
	if !ok {
		dir := l.sandboxDir(id)
		if _, err := os.Lstat(dir); err != nil {
			// A container without a sandbox directory is a crash between
			// removing the directory and destroying the container; Delete
			// must still be able to clean it.
			if _, cerr := os.Lstat(filepath.Join(l.ctrRoot, id)); cerr != nil {
				l.mu.Unlock()
				return nil, nil
			}
		}
		s = &sandbox{id: id, dir: dir}
		l.sandboxes[id] = s
	}
	l.mu.Unlock()

	s.mu.Lock()
	need := !s.attached && !s.creating && !s.gone
	stale := s.staleLocked()
	s.mu.Unlock()
	if need || stale {
		s.op.Lock()
		s.mu.Lock()
		if s.staleLocked() {
			// Adopted and dead or incomplete: maybe only as seen while
			// another runtime on this state directory was still creating
			// it, or before it deleted and created it again. Look again.
			if s.watch != nil {
				s.watch.stop()
			}
			s.closeOOMFile()
			s.attached, s.container, s.watch, s.broken = false, nil, nil, ""
		}
		s.mu.Unlock()
		l.attach(s)
		s.op.Unlock()
		if !l.recorded(id) {
			s.mu.Lock()
			gone := s.adopted && s.broken != ""
			s.mu.Unlock()
			if gone { // deleted by another runtime meanwhile
				l.forget(s)
				return nil, nil
			}
		}
	}
	return s, nil
}

// staleLocked reports whether s is an adopted sandbox seen dead or
// incomplete, whose state must be read again. The caller holds s.mu.
func (s *sandbox) staleLocked() bool {
	if !s.attached || !s.adopted || s.gone || s.creating {
		return false
	}
	if s.broken != "" {
		return true
	}
	if s.watch != nil {
		if _, exited := s.watch.exited(); exited {
			return true
		}
	}
	return false
}

// attach loads a sandbox left by an earlier process (or this process's
// earlier Local) and starts watching its init. Callers hold s.op.
func (l *Local) attach(s *sandbox) {
	s.mu.Lock()
	if s.attached || s.gone || s.creating {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()

	m, merr := readMeta(s.dir)
	c, cerr := libcontainer.Load(l.ctrRoot, s.id)
	var w *watcher
	broken := ""
	switch {
	case cerr != nil:
		c = nil
		broken = "incomplete: no container state"
		if !errors.Is(cerr, libcontainer.ErrNotExist) {
			broken = "incomplete: " + cerr.Error()
		}
	case merr != nil:
		broken = "incomplete: " + merr.Error()
	}
	if c != nil {
		w = l.watchContainer(s.id, c)
	}
	if m.ID == "" {
		m = meta{ID: s.id, AgentAddr: "unix:" + l.sockPath(s.id)}
		if fi, err := os.Stat(s.dir); err == nil {
			m.CreatedAt = fi.ModTime()
		}
	}
	s.mu.Lock()
	s.meta, s.container, s.watch, s.broken, s.attached, s.adopted = m, c, w, broken, true, true
	s.mu.Unlock()
	if broken != "" {
		l.log.Warn("sandbox left in a broken state", "sandbox_id", s.id, "reason", broken)
	}
}

// instance is s as the Runtime interface reports it; false if s is gone.
func (s *sandbox) instance() (runtime.Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return runtime.Instance{}, false
	}
	inst := runtime.Instance{
		ID:        s.id,
		AgentAddr: s.meta.AgentAddr,
		Image:     s.meta.Image,
		CreatedAt: s.meta.CreatedAt,
		Spec:      s.meta.Spec,
	}
	switch {
	case s.creating:
		inst.Reason = "creating"
	case s.broken != "":
		inst.Reason = s.broken
	case s.watch == nil:
		inst.Reason = "not started"
	default:
		if reason, exited := s.watch.exited(); exited {
			inst.Reason = reason
		} else {
			inst.Alive = true
		}
	}
	return inst, true
}

func readMeta(dir string) (meta, error) {
	var m meta
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return meta{}, fmt.Errorf("%s: %w", metaFile, err)
	}
	return m, nil
}

func writeMeta(dir string, m meta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, metaFile), b, 0o600)
}
