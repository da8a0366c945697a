package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/retry"
)

// teardownPoll is how often teardown re-checks that processes are gone.
const teardownPoll = 2 * time.Millisecond

// teardown removes everything sandbox s may have: processes, container
// state, cgroups, mounts and its directory. It is idempotent and works on
// half-created sandboxes and on ones left by an earlier process. Callers
// hold s.op.
func (l *Local) teardown(ctx context.Context, s *sandbox) error {
	ctx, cancel := context.WithTimeout(ctx, teardownTimeout)
	defer cancel()
	s.mu.Lock()
	c, w := s.container, s.watch
	// Its filesystem goes with its mount namespace: this hold would keep it.
	s.closeFSRoot()
	s.mu.Unlock()
	if c == nil {
		loaded, err := libcontainer.Load(l.ctrRoot, s.id)
		if err == nil {
			c = loaded
		} else if !errors.Is(err, libcontainer.ErrNotExist) {
			l.log.Warn("load container for teardown", "sandbox_id", s.id, "err", err)
		}
	}

	var errs []error
	cg := &cgroups.Cgroup{Path: l.cgroupPath(s.id), Resources: &cgroups.Resources{}}
	var paths map[string]string
	if c != nil {
		if st, err := c.State(); err == nil {
			cg, paths = st.Config.Cgroups, st.CgroupPaths
		}
		// SIGKILL to init kills its whole pid namespace.
		if err := c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
			l.log.Debug("kill sandbox init", "sandbox_id", s.id, "err", err)
		}
		// A paused sandbox's processes take the kill only once thawed;
		// thawed after the signal, they run no more of their own code.
		if st, err := c.Status(); err == nil && st == libcontainer.Paused {
			if err := c.Resume(); err != nil {
				l.log.Warn("thaw paused sandbox for teardown", "sandbox_id", s.id, "err", err)
			}
		}
	}
	// When init dies the kernel kills the rest of its pid namespace before
	// reporting the exit, so waiting for init is usually all it takes.
	if w != nil {
		w.kill() // in case libcontainer no longer recognises init
		select {
		case <-w.done:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("wait for init to exit: %w", context.Cause(ctx)))
		}
	}
	cm, err := manager.NewWithPaths(cg, paths)
	if err != nil {
		errs = append(errs, fmt.Errorf("cgroup manager: %w", err))
	} else if err := thawAndKill(ctx, cm); err != nil {
		errs = append(errs, err)
	}
	if c != nil {
		if err := destroy(ctx, c); err != nil {
			errs = append(errs, err)
		}
	}
	// Whatever libcontainer did not remove (no state, or a failed Create
	// between cgroup creation and state save).
	if cm != nil {
		if err := cm.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroups: %w", err))
		}
	}
	if err := os.RemoveAll(filepath.Join(l.ctrRoot, s.id)); err != nil {
		errs = append(errs, err)
	}
	if err := l.teardownFullNetwork(s.id); err != nil {
		errs = append(errs, fmt.Errorf("remove veth: %w", err))
	}
	if w != nil {
		w.stop()
	}

	// A sandbox that started has no mounts left here (see create); one
	// that failed half-way may.
	fsDir := filepath.Join(s.dir, sandboxFS)
	rootfs := filepath.Join(fsDir, "rootfs")
	if err := unmount(rootfs); err != nil {
		errs = append(errs, err)
	}
	if err := unmount(fsDir); err != nil {
		errs = append(errs, err)
	}
	// Never remove through a mount: that would write whiteouts or delete
	// files on whatever is still mounted.
	if mounted(rootfs) || mounted(fsDir) {
		errs = append(errs, fmt.Errorf("sandbox %s still has mounts after unmount", s.id))
	} else if err := l.removeDisk(s); err != nil {
		// The directory stays, so that a later Delete finds the sandbox.
		errs = append(errs, err)
	} else if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeDisk deletes the file of the sandbox's writable layer, if a create
// that failed before mounting it left one. Its loop device has detached
// already, or does once the last mount of its filesystem, in the sandbox's
// dying mount namespace, is gone; the kernel then frees the file.
func (l *Local) removeDisk(s *sandbox) error {
	s.mu.Lock()
	name := s.meta.Disk
	s.mu.Unlock()
	if name == "" {
		m, err := readMeta(s.dir)
		if err != nil {
			// No record (a create that failed before writing it, a
			// stray, a lost file): whatever disk this id has.
			return l.disks.removeAll(s.id)
		}
		name = m.Disk
	}
	if name == "" {
		return nil // a tmpfs
	}
	return l.disks.remove(name)
}

func mounted(p string) bool {
	m, err := mountinfo.Mounted(p)
	return err == nil && m
}

// killCgroup kills every process left in the sandbox's cgroups (none once
// init has died, unless one was joining the sandbox meanwhile) and waits
// until they are gone. From the second round on, the freezer stops them
// forking while they are being killed; it is not used first because
// freezing on cgroup v1 polls for tens of milliseconds.
func killCgroup(ctx context.Context, cm cgroups.Manager) error {
	for round := 0; ; round++ {
		pids, err := cm.GetAllPids()
		if err != nil || len(pids) == 0 {
			return nil // no cgroup, or empty
		}
		if round > 0 {
			_ = cm.Freeze(cgroups.Frozen)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		if round > 0 {
			_ = cm.Freeze(cgroups.Thawed)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kill sandbox processes (%d left): %w", len(pids), context.Cause(ctx))
		case <-time.After(teardownPoll):
		}
	}
}

// thawAndKill kills what is left in the cgroup, thawing it first: a
// cgroup frozen by a pause whose container state is lost would hold its
// processes, and the kill, forever.
func thawAndKill(ctx context.Context, cm cgroups.Manager) error {
	if st, err := cm.GetFreezerState(); err == nil && st != cgroups.Thawed {
		_ = cm.Freeze(cgroups.Thawed)
	}
	return killCgroup(ctx, cm)
}

// destroy removes the container's state and cgroups, retrying while the
// kernel finishes tearing down its processes, until ctx ends.
func destroy(ctx context.Context, c *libcontainer.Container) error {
	again := retry.NewBackoff(destroyRetry)
	for {
		err := c.Destroy()
		if err == nil {
			return nil
		}
		if again.Wait(ctx, err) != nil {
			return fmt.Errorf("destroy container: %w", err)
		}
	}
}

// destroyRetry spaces destroy's attempts teardownPoll apart on average:
// the kernel is done within milliseconds.
var destroyRetry = retry.Policy{Initial: 2 * teardownPoll, Max: 2 * teardownPoll}
