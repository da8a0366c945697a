package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/failpoint"
	"github.com/orchard/orchard/retry"
	"github.com/orchard/orchard/runtime"
)

// create does the work of Create; on error the caller tears down whatever
// it left. Callers hold s.op.
func (l *Local) create(ctx context.Context, s *sandbox, spec runtime.Spec) (runtime.Instance, error) {
	id := spec.ID
	if err := failpoint.Eval("runtime.local.create"); err != nil {
		return runtime.Instance{}, err
	}
	img, err := l.images.resolve(ctx, spec.Image)
	if err != nil {
		return runtime.Instance{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if err := ctx.Err(); err != nil {
		return runtime.Instance{}, faults.Wrap(context.Cause(ctx), faults.CodeTimeout, faults.Timeout, faults.Platform,
			fmt.Sprintf("create sandbox %s: deadline passed before the container started", id))
	}
	storage, err := l.storageBytes(spec)
	if err != nil {
		return runtime.Instance{}, err
	}

	if err := os.Mkdir(s.dir, 0o700); err != nil {
		return runtime.Instance{}, createFailed(id, "make sandbox directory", err)
	}
	// The record first: it names the disk, so that teardown finds the disk
	// whatever step a create failed at, and a sandbox directory exists for
	// as long as its disk does (disks.strays relies on it).
	m := meta{ID: id, Image: spec.Image, CreatedAt: time.Now().UTC(), AgentAddr: "unix:" + l.sockPath(id), Spec: spec}
	if l.onDisk {
		m.Disk = diskName(id)
	}
	if err := writeMeta(s.dir, m); err != nil {
		return runtime.Instance{}, createFailed(id, "write sandbox metadata", err)
	}
	s.mu.Lock()
	s.meta = m
	s.mu.Unlock()
	// One filesystem per sandbox holds the writable layer and the
	// overlay's work dir: overlayfs refuses an upper on the lower's
	// filesystem (the host root), and its size is the sandbox's limit.
	fsDir := filepath.Join(s.dir, sandboxFS)
	if err := os.Mkdir(fsDir, 0o700); err != nil {
		return runtime.Instance{}, createFailed(id, "make sandbox directory", err)
	}
	if l.onDisk {
		if err := l.disks.mount(ctx, m.Disk, storage, fsDir); err != nil {
			return runtime.Instance{}, classifyStart(id, "mount sandbox disk", err)
		}
		if err := os.Chmod(fsDir, 0o700); err != nil {
			return runtime.Instance{}, createFailed(id, "mount sandbox disk", err)
		}
	} else if err := unix.Mount("tmpfs", fsDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV,
		fmt.Sprintf("mode=0700,size=%d", storage)); err != nil {
		return runtime.Instance{}, createFailed(id, "mount sandbox tmpfs", err)
	}
	upper, work := filepath.Join(fsDir, "upper"), filepath.Join(fsDir, "work")
	rootfs := filepath.Join(fsDir, "rootfs")
	for _, d := range []string{upper, work, rootfs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return runtime.Instance{}, createFailed(id, "make sandbox directory", err)
		}
	}

	workdir := workspace
	var stacked []string
	if len(spec.Layers) > 0 {
		// Held until the root is mounted: no layer it stacks is pruned
		// meanwhile. The sandbox's record, written above, names them from
		// then on.
		unlock, err := l.layers.lock(unix.LOCK_SH)
		if err != nil {
			return runtime.Instance{}, createFailed(id, "lock layers", err)
		}
		defer unlock()
		if stacked, err = l.stackLayers(spec.Layers); err != nil {
			return runtime.Instance{}, fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}
	if img.host && len(stacked) == 0 {
		// An opaque /workspace: empty and writable even if the host has one.
		if err := os.Mkdir(filepath.Join(upper, workspace), 0o755); err != nil {
			return runtime.Instance{}, createFailed(id, "make workspace", err)
		}
		if err := unix.Setxattr(filepath.Join(upper, workspace), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			return runtime.Instance{}, createFailed(id, "make workspace", err)
		}
	} else if img.workingDir != "" {
		workdir = img.workingDir
	}
	lowers := img.lowers
	if img.host && l.masks != nil {
		lowers = append([]string{fdPath(l.masks)}, lowers...)
	}
	// A saved layer's /workspace is opaque already, when the sandbox it
	// came from was a "host" one: it hides the host's.
	lowers = append(slices.Clone(stacked), lowers...)
	if err := mountOverlay(rootfs, lowers, upper, work); err != nil {
		return runtime.Instance{}, createFailed(id, "mount root overlay", err)
	}
	if !img.host {
		for _, d := range []string{workspace, workdir} {
			if err := mkdirInRoot(rootfs, d); err != nil {
				return runtime.Instance{}, createFailed(id, "make "+d, err)
			}
		}
	}

	// The server creates the agent's listening socket on the host and hands
	// the agent only its descriptor: the socket's path is outside the
	// sandbox, so nothing inside can replace it (with a symlink to a host
	// socket, say) and make the server talk to something else.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: l.sockPath(id), Net: "unix"})
	if err != nil {
		return runtime.Instance{}, createFailed(id, "listen on agent socket", err)
	}
	ln.SetUnlinkOnClose(false)
	lnFile, err := ln.File()
	ln.Close()
	if err != nil {
		return runtime.Instance{}, createFailed(id, "listen on agent socket", err)
	}
	defer lnFile.Close()

	cfg := l.containerConfig(spec, img, rootfs)
	hm, err := l.harnessMount(spec)
	if err != nil {
		return runtime.Instance{}, createFailed(id, "mount harnesses", err)
	}
	if hm != nil {
		cfg.Mounts = append(cfg.Mounts, hm)
	}
	c, err := libcontainer.Create(l.ctrRoot, id, cfg)
	if err != nil {
		return runtime.Instance{}, classifyStart(id, "create container", err)
	}
	s.mu.Lock()
	s.container = c
	s.mu.Unlock()
	if narrowed, err := joinOnlySandboxControllers(c); err != nil {
		return runtime.Instance{}, createFailed(id, "choose cgroup controllers", err)
	} else if !narrowed {
		l.wideCgroups.Do(func() {
			l.log.Warn("libcontainer no longer lets sandboxes skip cgroup hierarchies: each gets a cgroup in every one")
		})
	}

	logf, err := os.OpenFile(filepath.Join(s.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return runtime.Instance{}, createFailed(id, "open agent log", err)
	}
	defer logf.Close()
	extra := []*os.File{lnFile}
	seccompFD := -1
	if l.seccompProg != nil {
		seccompFD = 3 + len(extra)
		extra = append(extra, l.seccompProg)
	}
	if l.init != nil {
		// Last, so the agent's descriptors keep their numbers: the init
		// closes this one when it becomes orchard-init (initredirect.go).
		extra = append(extra, l.init)
	}
	proc := &libcontainer.Process{
		Args:       agentArgs(spec, seccompFD, l.seccompFlags),
		ExtraFiles: extra,
		Env:        withHarnessPath(agentEnv(img, workdir, spec.Env), spec.Harnesses),
		Cwd:        workdir,
		Stdout:     logf,
		Stderr:     logf,
		Init:       true,
	}
	if err := runContainer(c, proc); err != nil {
		return runtime.Instance{}, classifyStart(id, "start agent", err)
	}
	// The agent holds the listening socket now. Dropping ours means that
	// once the agent dies nothing listens, and probes fail at once instead
	// of queueing on a socket no one will accept from.
	lnFile.Close()
	pid, err := proc.Pid()
	if err != nil {
		return runtime.Instance{}, createFailed(id, "start agent", err)
	}
	if !spec.BlockNetwork && spec.NetworkMode == runtime.NetworkFull {
		if err := l.setupFullNetwork(id, pid); err != nil {
			if _, ok := errors.AsType[*faults.Error](err); ok {
				return runtime.Instance{}, err
			}
			return runtime.Instance{}, createFailed(id, "full network", err)
		}
	}
	w := l.watchChild(id, pid)
	s.mu.Lock()
	s.watch = w
	s.mu.Unlock()

	if err := waitHealthy(ctx, l.sockPath(id), w); err != nil {
		if reason, dead := w.exited(); dead {
			return runtime.Instance{}, createFailed(id, "agent died: "+reason, errors.New(logTail(s.dir)))
		}
		if ctx.Err() != nil {
			return runtime.Instance{}, faults.Wrap(err, faults.CodeAgentNotReady, faults.Timeout, faults.Sandbox,
				fmt.Sprintf("create sandbox %s: agent not ready before the deadline", id))
		}
		return runtime.Instance{}, createFailed(id, "agent not healthy", err)
	}

	// Held for SaveLayer, before the server's mount goes (below).
	root, err := os.OpenFile(fsDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return runtime.Instance{}, createFailed(id, "hold sandbox filesystem", err)
	}
	s.mu.Lock()
	s.fsRoot = root
	s.mu.Unlock()

	// The container holds its own copy of its mounts now. Detaching the
	// server's copy keeps the server's mount namespace from growing with
	// every live sandbox: each create copies that namespace, so without
	// this a create costs more the more sandboxes there are. The sandbox's
	// filesystem lives on in the container and is unmounted when its last
	// process exits, which detaches its loop device.
	if err := unix.Unmount(fsDir, unix.MNT_DETACH); err != nil {
		l.log.Warn("detach sandbox mounts from the server", "sandbox_id", id, "err", err)
	} else {
		// libcontainer starts processes joining the container (setns) in
		// the configured rootfs path: keep an empty directory there.
		_ = os.Mkdir(rootfs, 0o700)
	}

	s.mu.Lock()
	s.creating = false
	s.attached = true
	s.mu.Unlock()
	return runtime.Instance{ID: id, AgentAddr: m.AgentAddr, Image: spec.Image, CreatedAt: m.CreatedAt, Alive: true, Spec: spec}, nil
}

// storageBytes is the size of spec's writable layer: its limit, or the
// default, in whole blocks.
func (l *Local) storageBytes(spec runtime.Spec) (int64, error) {
	size := spec.EphemeralStorageBytes
	if size == 0 {
		size = l.cfg.WritableBytes
	}
	if size < runtime.MinEphemeralStorageBytes {
		return 0, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
			"create sandbox %s: ephemeral storage of %d bytes is below the minimum of %d MiB", spec.ID, size, runtime.MinEphemeralStorageBytes>>20)
	}
	size -= size % diskBlockSize
	if !l.onDisk {
		return size, nil
	}
	// Disks are sparse: a sandbox takes host disk as it writes. One that is
	// promised more than is free now would find the host's disk full
	// before its own.
	if free, err := l.disks.free(); err == nil && size > free {
		return 0, faults.Newf(faults.CodeCapacity, faults.Capacity, faults.Platform,
			"create sandbox %s: ephemeral storage of %d MiB is more than the %d MiB free on the host's disk", spec.ID, size>>20, free>>20)
	}
	return size, nil
}

func createFailed(id, what string, err error) error {
	return faults.Wrap(err, faults.CodeCreateFailed, faults.Internal, faults.Platform,
		fmt.Sprintf("create sandbox %s: %s", id, what))
}

// classifyStart tells capacity exhaustion (no pids, memory or cgroup room
// left on the host: retry later) from other container start failures.
func classifyStart(id, what string, err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return faults.Wrap(err, faults.CodeTimeout, faults.Timeout, faults.Platform,
			fmt.Sprintf("create sandbox %s: %s: out of time", id, what))
	case errors.Is(err, context.Canceled):
		return faults.Wrap(err, faults.CodeCanceled, faults.Canceled, faults.Client,
			fmt.Sprintf("create sandbox %s: %s: canceled", id, what))
	}
	msg := err.Error()
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOSPC) ||
		strings.Contains(msg, "resource temporarily unavailable") ||
		strings.Contains(msg, "cannot allocate memory") ||
		strings.Contains(msg, "no space left on device") {
		return faults.Wrap(err, faults.CodeCapacity, faults.Capacity, faults.Platform,
			fmt.Sprintf("create sandbox %s: %s: host out of capacity", id, what))
	}
	return createFailed(id, what, err)
}

// agentEnv is the agent's environment: PATH, HOME and WORKING_DIR, the
// image's Env, then the spec's Env (which wins).
func agentEnv(img *image, workdir string, extra map[string]string) []string {
	env := map[string]string{
		"PATH":        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":        "/root",
		"WORKING_DIR": workdir,
	}
	for _, kv := range img.env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// mkdirInRoot creates dir (absolute inside the sandbox) under rootfs,
// resolving symlinks inside rootfs so that an image cannot point it outside.
func mkdirInRoot(rootfs, dir string) error {
	p, err := securejoin.SecureJoin(rootfs, dir)
	if err != nil {
		return err
	}
	return os.MkdirAll(p, 0o755)
}

// Polling bounds for the agent's socket. The agent listens ~10 ms after
// exec; a short first interval keeps create latency close to that.
const (
	healthPollMin = 200 * time.Microsecond
	healthPollMax = time.Millisecond
	// healthProbeTimeout bounds one probe: a started agent answers /health
	// in well under a millisecond, a loaded machine may take far longer.
	healthProbeTimeout = 2 * time.Second
)

// waitHealthy polls the agent's socket until GET /health answers 200, the
// agent dies or ctx ends.
func waitHealthy(ctx context.Context, sock string, w *watcher) error {
	poll := retry.NewBackoff(healthPoll)
	var last error
	for {
		if err := probeHealth(ctx, sock); err == nil {
			return nil
		} else {
			last = err
		}
		if _, dead := w.exited(); dead {
			return fmt.Errorf("agent exited: %w", last)
		}
		delay, _ := poll.Next(last) // no Attempts or Budget: ctx bounds it
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %v)", context.Cause(ctx), last)
		case <-w.done:
			t.Stop()
		case <-t.C:
		}
	}
}

// healthPoll spaces waitHealthy's probes, from healthPollMin up to
// healthPollMax.
var healthPoll = retry.Policy{Initial: healthPollMin, Max: healthPollMax}

func probeHealth(ctx context.Context, sock string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return err
	}
	defer conn.Close()
	// A probe never waits long: the caller polls, and checks in between
	// whether the agent died.
	dl := time.Now().Add(healthProbeTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	_ = conn.SetDeadline(dl)
	if _, err := conn.Write([]byte("GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /health: %s", resp.Status)
	}
	return nil
}

// logTail returns the end of the agent's log, for errors.
func logTail(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "agent.log"))
	if err != nil || len(b) == 0 {
		return "agent log empty"
	}
	const max = 2048
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return "agent log: " + strings.TrimSpace(string(b))
}

// agentThreads is how many OS threads the agent reserves at start (see
// agent.reserveThreads), on top of the ≈5 its runtime starts with (main,
// sysmon and those its background work wakes): together enough for
// GOMAXPROCS plus the syscalls it blocks in at once. Kept small: every
// thread of every sandbox costs memory, and pivot_root walks every thread
// on the host (chroot_fs_refs), so each one alive slows every later create.
// Over 1,000 creates the walk took 1.3–1.6 ms of CPU per create with 8
// reserved (14 threads per agent) and 1.1 ms with 4 (10 threads), which
// still keep the agent serving while a fork bomb holds the pids limit
// (TestForkBombContained).
const agentThreads = 4

// agentArgs is the agent's command line: install the seccomp program from
// seccompFD (when not -1) with seccompFlags, serve on the inherited socket
// (fd 3), reserve threads, and run the sandbox's kind.
func agentArgs(spec runtime.Spec, seccompFD int, seccompFlags uint) []string {
	args := []string{agentMount, "--listen-fd", "3", "--reserve-threads", strconv.Itoa(agentThreads)}
	if seccompFD >= 0 {
		args = append(args, "--seccomp-fd", strconv.Itoa(seccompFD), "--seccomp-flags", strconv.FormatUint(uint64(seccompFlags), 10))
	}
	if spec.Kind != "" {
		args = append(args, "--kind", spec.Kind)
	}
	if len(spec.KindOptions) > 0 {
		args = append(args, "--kind-options", string(spec.KindOptions))
	}
	if !spec.BlockNetwork && spec.NetworkMode != runtime.NetworkFull {
		// The sandbox's namespace has only loopback: the proxy hands every
		// connection to the server through the tunnel it attaches.
		args = append(args, "--egress-proxy", "127.0.0.1:3128") // agent.DefaultEgressProxy
	}
	if len(spec.Faults) > 0 {
		args = append(args, "--faults", string(spec.Faults))
	}
	return args
}

// The cgroups library's v1 controllers are process-wide values, and one of
// them (blkio) records on first use, without a lock, which file name its
// kernel uses; two containers starting at once in a fresh process race on
// it. The first start in the process therefore runs alone; once it is
// done every later start reads the recorded name.
var (
	firstStart   sync.Mutex
	firstStarted atomic.Bool
)

func runContainer(c *libcontainer.Container, p *libcontainer.Process) error {
	if firstStarted.Load() {
		return c.Run(p)
	}
	firstStart.Lock()
	defer firstStart.Unlock()
	if firstStarted.Load() {
		return c.Run(p)
	}
	err := c.Run(p)
	if err == nil {
		firstStarted.Store(true)
	}
	return err
}
