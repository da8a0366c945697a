package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/retry"
)

// runState keeps the state of live sandboxes (libcontainer's state
// directory and one directory per sandbox: its record, agent socket and
// log, and the mount point of its writable layer) on a tmpfs.
//
// None of it outlives the host: a sandbox's processes, cgroups and
// writable layer (a tmpfs already) die with it, so a disk only made each
// create slower. On ext4 without a journal, as here, every new file or
// folder made the inode allocator skip each inode freed in the last
// minutes (ext4's recently_deleted), so creates got slower the more
// sandboxes had come and gone: with 1,000 sandboxes created right after
// 1,000 deleted, 9 % of the machine's CPU went to allocating ≈10 inodes per
// sandbox. A tmpfs makes that a memory allocation.
//
// The tmpfs is mounted in this process's mount namespace, on the host's
// directory, and outlives the process: a restarted server (or another one
// on the same state directory) finds the sandboxes as before. That needs
// the host's mount namespace (the init process's): one of the server's own
// (a service manager's private mounts) would take the tmpfs with it when
// it exits, so there the state stays on disk. The last
// Local to close unmounts it once it holds nothing, so a state directory
// without sandboxes is plain folders again. A directory that already holds
// something (sandboxes of an earlier version, which kept them on disk) is
// used as it is.
type runState struct {
	dirs []string
	// lock is a shared flock on stateLockFile for as long as this Local
	// may use dirs; mounting and unmounting take it exclusively, so no
	// Local unmounts a tmpfs another one uses.
	lock *os.File
	log  *slog.Logger
}

// stateLockFile is the lock file of runState, in the state directory.
const stateLockFile = "state.lock"

// runStateMountAttempts bounds New's attempts to mount the tmpfs when
// other Locals open and close on the same state directory meanwhile.
const runStateMountAttempts = 3

// openRunState makes dirs (inside stateDir) tmpfs mounts where they are
// empty folders, and holds them until close. It waits for another Local
// only while that one mounts or unmounts; a Local that holds the state
// keeps it as it is.
func openRunState(stateDir string, dirs []string, log *slog.Logger) (*runState, error) {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(filepath.Join(stateDir, stateLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	r := &runState{dirs: dirs, lock: f, log: log}
	if !inInitMountNamespace() {
		log.Warn("sandbox state stays on the state directory's filesystem: not in the host's mount namespace")
		if err := flock(f, unix.LOCK_SH); err != nil {
			f.Close()
			return nil, err
		}
		return r, nil
	}
	res, err := retry.Do(context.Background(), runStateMountRetry, func(_ context.Context, attempt int) error {
		// Shared, and converting it is not atomic: the exclusive lock
		// below may have dropped it.
		if err := flock(f, unix.LOCK_SH); err != nil {
			return err
		}
		mountable := r.mountable()
		if len(mountable) == 0 {
			return nil
		}
		if attempt > runStateMountAttempts {
			// Slower, as correct.
			log.Warn("sandbox state stays on the state directory's filesystem", "dirs", mountable)
			return nil
		}
		if flock(f, unix.LOCK_EX|unix.LOCK_NB) != nil {
			return errStateBusy // another Local uses the folders as they are
		}
		for _, d := range mountable {
			if err := mountRunTmpfs(d); err != nil {
				log.Warn("sandbox state stays on the state directory's filesystem", "dir", d, "err", err)
			}
		}
		return errStateMounted
	})
	if err != nil {
		f.Close()
		return nil, res.LastErr() // flock's own error
	}
	return r, nil
}

// runStateMountRetry runs openRunState's attempts: runStateMountAttempts
// to mount, and one more that only looks. A Local that finds another one
// mounting waits on the shared lock; the waits here only space the
// attempts that find the folders in use.
var runStateMountRetry = retry.Policy{Attempts: runStateMountAttempts + 1, Initial: time.Millisecond, Max: 10 * time.Millisecond,
	Retryable: func(err error) bool { return errors.Is(err, errStateBusy) || errors.Is(err, errStateMounted) }}

// errStateBusy and errStateMounted send openRunState round again: to try
// once more, or to look at what it mounted.
var (
	errStateBusy    = errors.New("sandbox state folders in use by another Local")
	errStateMounted = errors.New("sandbox state folders mounted")
)

// inInitMountNamespace reports whether this process shares the mount
// namespace of the host's init (pid 1), where mounts outlive it. When it
// cannot tell (pid 1's namespace hidden from it, as on some hosts), it
// assumes so.
func inInitMountNamespace() bool {
	init, err := os.Readlink("/proc/1/ns/mnt")
	if err != nil {
		return true
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	return err == nil && init == self
}

// mountable lists the dirs that are empty and not on a tmpfs.
func (r *runState) mountable() []string {
	var out []string
	for _, d := range r.dirs {
		if empty, err := emptyDir(d); err == nil && empty && !isTmpfs(d) {
			out = append(out, d)
		}
	}
	return out
}

// mountRunTmpfs mounts a private tmpfs on dir.
func mountRunTmpfs(dir string) error {
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700"); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	// Private: sandboxes' mounts below it propagate nowhere, whatever the
	// host's root propagation.
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		_ = unix.Unmount(dir, 0)
		return fmt.Errorf("make tmpfs private: %w", err)
	}
	return nil
}

// close drops this Local's hold and, if no other Local holds the state,
// unmounts the tmpfs mounts that hold nothing.
func (r *runState) close() {
	defer r.lock.Close()
	if flock(r.lock, unix.LOCK_EX|unix.LOCK_NB) != nil {
		return // another Local uses them
	}
	for _, d := range r.dirs {
		if !isTmpfs(d) || !mounted(d) {
			continue // the whole state directory may be on a tmpfs
		}
		if empty, err := emptyDir(d); err != nil || !empty {
			continue
		}
		// Lazily: nothing of a sandbox is left in it, but a leftover may
		// still hold it (libcontainer's open of the exec fifo of a
		// container whose init died never returns), and then only goes
		// with that.
		if err := unix.Unmount(d, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			r.log.Warn("unmount sandbox state tmpfs", "dir", d, "err", err)
		}
	}
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// isTmpfs reports whether dir is on a tmpfs.
func isTmpfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.TMPFS_MAGIC
}

func emptyDir(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}
