package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/retry"
)

// mountOverlay mounts an overlay at target: lowers (top first) under a
// writable upper.
func mountOverlay(target string, lowers []string, upper, work string) error {
	esc := make([]string, len(lowers))
	for i, l := range lowers {
		esc[i] = escapeOverlayPath(l)
	}
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s",
		strings.Join(esc, ":"), escapeOverlayPath(upper), escapeOverlayPath(work))
	// mount(2) takes at most a page of options; deep images need the
	// new mount API, one lower layer per call (Linux 6.8+).
	if len(data) < os.Getpagesize()-1 {
		if err := unix.Mount("overlay", target, "overlay", 0, data); err != nil {
			return fmt.Errorf("mount overlay on %s: %w", target, err)
		}
		return nil
	}
	return mountOverlayFsconfig(target, lowers, upper, work)
}

func mountOverlayFsconfig(target string, lowers []string, upper, work string) error {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	for _, l := range lowers {
		if err := unix.FsconfigSetString(fsfd, "lowerdir+", l); err != nil {
			return fmt.Errorf("overlay lowerdir+ %s (needs Linux 6.8 for %d layers): %w", l, len(lowers), err)
		}
	}
	if err := unix.FsconfigSetString(fsfd, "upperdir", upper); err != nil {
		return fmt.Errorf("overlay upperdir: %w", err)
	}
	if err := unix.FsconfigSetString(fsfd, "workdir", work); err != nil {
		return fmt.Errorf("overlay workdir: %w", err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("create overlay: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsmount overlay: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move overlay to %s: %w", target, err)
	}
	return nil
}

// escapeOverlayPath escapes the characters overlayfs's option parser treats
// specially in a path.
func escapeOverlayPath(p string) string {
	return strings.NewReplacer(`\`, `\\`, `:`, `\:`, `,`, `\,`).Replace(p)
}

// Unmount retries: a mount stays busy for a moment after the last process
// in a sandbox dies, while the kernel tears down its mount namespace.
// unmountRetry makes unmountTries attempts, unmountDelay apart on average
// (each wait a random fraction of up to twice it), about half a second
// in all.
const (
	unmountTries = 50
	unmountDelay = 10 * time.Millisecond
)

var unmountRetry = retry.Policy{Attempts: unmountTries, Initial: 2 * unmountDelay, Max: 2 * unmountDelay,
	Retryable: func(err error) bool { return errors.Is(err, unix.EBUSY) }}

// unmount unmounts every mount stacked at target. Not mounted is success.
func unmount(target string) error {
	for range 8 { // mounts stacked on one another at target
		res, _ := retry.Do(context.Background(), unmountRetry, func(context.Context, int) error {
			return unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		})
		err := res.LastErr() // unix.Unmount's own: the cases below test it
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more), or gone
		case errors.Is(err, unix.EBUSY):
			// Still pinned (an fd held somewhere): detach so it goes
			// away with its last user, and report nothing left here.
			if derr := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); derr != nil && !errors.Is(derr, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %w", target, derr)
			}
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	return nil
}
