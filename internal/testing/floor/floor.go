// Package floor measures what this machine needs, at the least, to make a
// sandbox: a bare container — new namespaces, an overlay root over the
// host's, a cgroup with limits, one process that prints and exits — made
// by a minimal loop, with nothing of Orchard's in the way. Machines of one
// kind differ several-fold in fork, exec, mount and cgroup costs, so
// Orchard's scale benchmark reports its time as a ratio to this floor
// measured in the same run.
package floor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// childArg is the argument a re-executed binary recognises as the
// container's process (MaybeChild); holdArg after its folder keeps it.
const (
	childArg = "orchard-floor-child"
	holdArg  = "hold"
)

// MaybeChild runs the container's side when this process was started as
// one by Run, and never returns then. Call it first in TestMain.
func MaybeChild() {
	if len(os.Args) < 3 || os.Args[1] != childArg {
		return
	}
	if err := child(os.Args[2], len(os.Args) > 3 && os.Args[3] == holdArg); err != nil {
		fmt.Fprintln(os.Stderr, "floor child:", err)
		os.Exit(1)
	}
	os.Exit(0) // not reached: child execs
}

// child is the container's process: in its own namespaces, it mounts an
// overlay of the host's root, with its /proc, enters it and becomes
// `echo ok` — or, held, prints ok itself and becomes `sleep`, so that the
// container lives on as a sandbox does.
func child(dir string, hold bool) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := filepath.Join(dir, "root")
	opts := "lowerdir=/,upperdir=" + filepath.Join(dir, "upper") + ",workdir=" + filepath.Join(dir, "work")
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	if err := unix.Chroot(root); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	env := []string{"PATH=/usr/bin:/bin"}
	if hold {
		if _, err := os.Stdout.WriteString("ok\n"); err != nil {
			return err
		}
		return unix.Exec("/bin/sleep", []string{"sleep", "infinity"}, env)
	}
	return unix.Exec("/bin/echo", []string{"echo", "ok"}, env)
}

// Result is one Run.
type Result struct {
	Elapsed time.Duration
	OK      int
	Held    int   // RunHeld: containers still alive when the last had printed
	Err     error // the first failure, if any
}

// Run makes n bare containers, concurrency at a time, each in a fresh
// cgroup (memory, cpu and pids limits, as a sandbox's) under a cgroup
// parent of its own, waits for each one's output, and removes it.
// Scratch space is a tmpfs under a fresh folder of tmp.
func Run(ctx context.Context, n, concurrency int, tmp string) (Result, error) {
	return run(ctx, n, concurrency, tmp, false)
}

// RunHeld is Run with every container kept alive until all n have
// printed, as n sandboxes made at once all live: their processes, mount
// and network namespaces and cgroups exist together, and what the kernel
// walks per live process or namespace costs the later ones more. Elapsed
// ends when the last one has printed; all are removed after.
func RunHeld(ctx context.Context, n, concurrency int, tmp string) (Result, error) {
	return run(ctx, n, concurrency, tmp, true)
}

func run(ctx context.Context, n, concurrency int, tmp string, hold bool) (Result, error) {
	base, err := os.MkdirTemp(tmp, "orchard-floor-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(base)
	if err := unix.Mount("tmpfs", base, "tmpfs", 0, "mode=700"); err != nil {
		return Result{}, fmt.Errorf("mount scratch tmpfs: %w", err)
	}
	defer unix.Unmount(base, unix.MNT_DETACH)
	// Not os.Executable: a binary re-executed from a sealed memfd has no
	// path to run it by.
	const exe = "/proc/self/exe"
	cg := newCgroups(fmt.Sprintf("orchard-floor-%d", os.Getpid()))
	defer cg.removeParent()

	var ok atomic.Int64
	var first error
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
		}
	}
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	var held []*exec.Cmd
	var heldMu sync.Mutex
	start := time.Now()
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			name := strconv.Itoa(i)
			dir := filepath.Join(base, name)
			if !hold {
				if err := one(ctx, exe, dir, cg, name); err != nil {
					fail(err)
					return
				}
				ok.Add(1)
				return
			}
			cmd, err := start1(ctx, exe, dir, cg, name, true)
			if cmd != nil {
				heldMu.Lock()
				held = append(held, cmd)
				heldMu.Unlock()
			}
			if err != nil {
				fail(err)
				return
			}
			ok.Add(1)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// Held containers go only now, outside the time; their scratch and
	// cgroups with them.
	alive := 0
	for _, cmd := range held {
		if running(cmd.Process.Pid) {
			alive++
		}
		_ = cmd.Process.Kill()
	}
	for _, cmd := range held {
		_ = cmd.Wait()
	}
	if hold {
		for i := range n {
			name := strconv.Itoa(i)
			cg.remove(name)
			_ = os.RemoveAll(filepath.Join(base, name))
		}
	}
	return Result{Elapsed: elapsed, OK: int(ok.Load()), Held: alive, Err: first}, nil
}

// running reports whether pid is a live process: not gone and not a
// zombie, which signal 0 would still reach until it is reaped.
func running(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

// one makes, runs and removes one bare container.
func one(ctx context.Context, exe, dir string, cg *cgroups, name string) error {
	defer os.RemoveAll(dir)
	defer cg.remove(name)
	_, err := start1(ctx, exe, dir, cg, name, false)
	return err
}

// start1 makes one bare container and waits for its "ok": for it to exit,
// or, held, for the line alone, handing back the still running process
// (also on failure, once started, for the caller to kill and reap).
func start1(ctx context.Context, exe, dir string, cg *cgroups, name string, hold bool) (*exec.Cmd, error) {
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := cg.make(name); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	args := []string{childArg, dir}
	if hold {
		args = append(args, holdArg)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	var pipe, pipeW *os.File
	if hold {
		var err error
		if pipe, pipeW, err = os.Pipe(); err != nil {
			return nil, err
		}
		defer pipe.Close()
		defer pipeW.Close()
		cmd.Stdout = pipeW
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC |
			syscall.CLONE_NEWNET | unix.CLONE_NEWCGROUP,
		Pdeathsig: syscall.SIGKILL,
	}
	if fd, ok := cg.fd(name); ok {
		defer unix.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := cg.join(name, cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	if hold {
		// The child's end must close here, or a child that dies before
		// printing leaves the read below waiting forever.
		pipeW.Close()
		line := make([]byte, 3)
		if _, err := io.ReadFull(pipe, line); err != nil || string(line) != "ok\n" {
			return cmd, fmt.Errorf("container %s printed %q: %v: %s", name, line, err, out.Bytes())
		}
		return cmd, nil
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("container %s: %w: %s", name, err, out.Bytes())
	}
	if out.String() != "ok\n" {
		return nil, fmt.Errorf("container %s printed %q", name, out.Bytes())
	}
	return nil, nil
}

// cgroups makes the containers' cgroups, with a sandbox's limits: 128 MiB,
// half a CPU, 512 pids.
type cgroups struct {
	v2     bool
	parent string
}

var v1Controllers = []string{"memory", "cpu", "pids"}

func newCgroups(parent string) *cgroups {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return &cgroups{v2: err == nil, parent: parent}
}

func (c *cgroups) dirs(name string) []string {
	if c.v2 {
		return []string{filepath.Join("/sys/fs/cgroup", c.parent, name)}
	}
	var out []string
	for _, ctrl := range v1Controllers {
		out = append(out, filepath.Join("/sys/fs/cgroup", ctrl, c.parent, name))
	}
	return out
}

func (c *cgroups) make(name string) error {
	limits := map[string]string{"memory.limit_in_bytes": "134217728", "cpu.cfs_quota_us": "50000", "pids.max": "512"}
	if c.v2 {
		limits = map[string]string{"memory.max": "134217728", "cpu.max": "50000 100000", "pids.max": "512"}
		if err := os.MkdirAll(filepath.Dir(c.dirs(name)[0]), 0o755); err != nil {
			return err
		}
		_ = os.WriteFile(filepath.Join("/sys/fs/cgroup", c.parent, "cgroup.subtree_control"), []byte("+memory +cpu +pids"), 0)
	}
	for _, d := range c.dirs(name) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		for f, v := range limits {
			if !c.v2 && !strings.HasPrefix(f, filepath.Base(filepath.Dir(filepath.Dir(d)))+".") {
				continue // v1: each controller's files in its own hierarchy
			}
			if err := os.WriteFile(filepath.Join(d, f), []byte(v), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%s: %w", f, err)
			}
		}
	}
	return nil
}

// fd is the v2 cgroup's directory, for the child to start in it.
func (c *cgroups) fd(name string) (int, bool) {
	if !c.v2 {
		return 0, false
	}
	fd, err := unix.Open(c.dirs(name)[0], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	return fd, err == nil
}

// join moves pid into the v1 cgroups (on v2 it started there).
func (c *cgroups) join(name string, pid int) error {
	if c.v2 {
		return nil
	}
	for _, d := range c.dirs(name) {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("join %s: %w", d, err)
		}
	}
	return nil
}

func (c *cgroups) remove(name string) {
	for _, d := range c.dirs(name) {
		// The kernel may still be releasing the exited process.
		for i := 0; i < 100; i++ {
			if err := os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}

func (c *cgroups) removeParent() {
	for _, d := range c.dirs("") {
		_ = os.Remove(d)
	}
}
