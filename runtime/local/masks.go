package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// buildMasksLayer returns a detached tmpfs (a mount fd: no mount point,
// so nothing to leak and nothing another server on the same state
// directory can unmount) holding what hides m's folders in a "host"
// sandbox when stacked over the host root (lowerdir=layer:/): an empty
// opaque directory at each masked folder, and an empty file at each masked
// file. One layer for every sandbox replaces a tmpfs or bind mount per
// mask per sandbox, each of which cost the container's init a mount and
// made the sandbox's mount list longer for every later one. The masks look
// as before from the sandbox: empty, and what the sandbox writes there
// lands in its own writable layer; only the host's scratch folders were
// writable before, and now the others are too, which shows nothing of the
// host. The layer is a filesystem of its own because overlayfs refuses a
// lower layer inside another one's filesystem tree (the host root).
func buildMasksLayer(m masks) (*os.File, error) {
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("masks layer: fsopen tmpfs: %w", err)
	}
	defer unix.Close(fsfd)
	for k, v := range map[string]string{"size": "1m", "mode": "0755"} {
		if err := unix.FsconfigSetString(fsfd, k, v); err != nil {
			return nil, fmt.Errorf("masks layer: tmpfs %s: %w", k, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("masks layer: create tmpfs: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("masks layer: fsmount tmpfs: %w", err)
	}
	layer := os.NewFile(uintptr(mfd), "orchard-masks")
	if err := fillMasksLayer(fdPath(layer), m); err != nil {
		layer.Close()
		return nil, fmt.Errorf("masks layer: %w", err)
	}
	return layer, nil
}

// fdPath is the path through which the kernel resolves f's file, even a
// detached mount.
func fdPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// overlayTakesLayer reports whether overlayfs accepts layer, a detached
// mount, as a lower layer over the host root (older kernels take layers
// only from the caller's mount namespace; 6.18 takes it), and follows the
// redirects that show m's visible folders through it (a kernel built or
// booted with redirect_dir=nofollow refuses them). It builds, and drops,
// the read-only overlay a sandbox's root would stack.
func overlayTakesLayer(layer *os.File, m masks) error {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "lowerdir", escapeOverlayPath(fdPath(layer))+":/"); err != nil {
		return fmt.Errorf("overlay lowerdir: %w", err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("overlay over a detached masks layer: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY)
	if err != nil {
		return fmt.Errorf("fsmount overlay over the masks layer: %w", err)
	}
	defer unix.Close(mfd)
	for _, p := range m.visible {
		if !m.covered(p) {
			continue
		}
		fd, err := unix.Openat(mfd, strings.TrimPrefix(p, "/"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("overlay does not show %s through the masks layer: %w", p, err)
		}
		unix.Close(fd)
	}
	return nil
}

// fillMasksLayer fills the layer at dir with m's masks.
func fillMasksLayer(dir string, m masks) error {
	fail := func(p string, err error) error { return fmt.Errorf("%s: %w", p, err) }
	for _, p := range m.writable {
		mode := os.FileMode(0o755)
		switch p {
		case "/tmp", "/var/tmp":
			mode = 0o777 | os.ModeSticky
		case "/root":
			mode = 0o700
		}
		rp, err := resolveHost(p)
		if err != nil {
			return fail(p, err)
		}
		if err := maskDir(dir, rp, mode, 0, 0); err != nil {
			return fail(p, err)
		}
	}
	for _, p := range m.hidden {
		rp, err := filepath.EvalSymlinks(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // nothing to hide
		}
		var fi os.FileInfo
		if err == nil {
			fi, err = os.Stat(rp)
		}
		switch {
		case err != nil:
		case rp == "/":
			err = errors.New("would hide the whole root")
		case fi.IsDir():
			st := fi.Sys().(*syscall.Stat_t)
			err = maskDir(dir, rp, fi.Mode()&(os.ModePerm|os.ModeSticky), int(st.Uid), int(st.Gid))
		default:
			err = maskFile(dir, rp, fi)
		}
		if err != nil {
			return fail(p, err)
		}
	}
	for _, p := range m.visible {
		if !m.covered(p) {
			continue // nothing hides it
		}
		if err := showDir(dir, p); err != nil {
			return fail(p, err)
		}
	}
	return nil
}

// showDir makes p (a host directory inside a masked one, symlinks
// resolved) show through the layer at dir: a directory with the host's
// mode and owner whose absolute redirect sends overlayfs on to the host's
// p in the layers below, past the opaque folder around it (the redirect
// overlayfs itself writes when a directory is renamed; followed with the
// default redirect_dir, and New checks it is). Unlike a bind mount per
// sandbox it costs nothing at create, and what a sandbox writes there
// stays in its own layer, as everywhere else in its root.
func showDir(dir, p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if err := mkParents(dir, filepath.Dir(p)); err != nil {
		return err
	}
	d := filepath.Join(dir, p)
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := copyOwnerMode(d, fi); err != nil {
		return err
	}
	return unix.Setxattr(d, "trusted.overlay.redirect", []byte(p), 0)
}

// resolveHost resolves the symlinks in p, a path on the host that may not
// exist yet, as mounting over it in the sandbox would: a mask over a
// symlink hides what it points to, and the directories leading to a mask
// must be the host's real ones, or the layer would hide the symlinks.
func resolveHost(p string) (string, error) {
	rp, err := filepath.EvalSymlinks(p)
	if errors.Is(err, fs.ErrNotExist) && filepath.Dir(p) != p {
		parent, err := resolveHost(filepath.Dir(p))
		if err != nil {
			return "", err
		}
		return filepath.Join(parent, filepath.Base(p)), nil
	}
	if err == nil && rp == "/" {
		return "", errors.New("would hide the whole root")
	}
	return rp, err
}

// maskDir makes p (an absolute path on the host, symlinks resolved) an
// empty opaque directory with mode and owner in the layer at dir.
func maskDir(dir, p string, mode os.FileMode, uid, gid int) error {
	d := filepath.Join(dir, p)
	if err := mkParents(dir, filepath.Dir(p)); err != nil {
		return err
	}
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// Chmod, not Mkdir's mode: the umask would drop bits.
	if err := os.Chmod(d, mode); err != nil {
		return err
	}
	if err := os.Lchown(d, uid, gid); err != nil {
		return err
	}
	return unix.Setxattr(d, "trusted.overlay.opaque", []byte("y"), 0)
}

// maskFile makes p an empty file in the layer at dir with the host file's
// mode and owner, so programs that read it see no content and no error.
func maskFile(dir, p string, fi os.FileInfo) error {
	if err := mkParents(dir, filepath.Dir(p)); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, p), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return copyOwnerMode(filepath.Join(dir, p), fi)
}

// mkParents creates the directories leading to p (absolute on the host)
// in the layer at dir, each with its host counterpart's mode and owner:
// overlayfs shows a merged directory with its top layer's attributes.
func mkParents(dir, p string) error {
	cur := "/"
	for _, part := range strings.Split(strings.Trim(p, "/"), "/") {
		if part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		d := filepath.Join(dir, cur)
		if _, err := os.Lstat(d); err == nil {
			continue
		}
		fi, err := os.Stat(cur)
		if err != nil {
			return err
		}
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
		if err := copyOwnerMode(d, fi); err != nil {
			return err
		}
	}
	return nil
}

func copyOwnerMode(p string, fi os.FileInfo) error {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	return os.Chmod(p, fi.Mode()&(os.ModePerm|os.ModeSticky|os.ModeSetuid|os.ModeSetgid))
}

// checkExposed returns p, a host path to expose read-only to "host"
// sandboxes, with its symlinks resolved, or why it may not be: the root, a
// kernel file system, a path that is, holds or lies in one of secrets
// (the state directory, key files, configured masks), or one that holds
// another mask, which exposing it would undo. p may be a masked folder
// itself or lie inside one: that is what exposing is for.
func checkExposed(p string, m masks, secrets []string) (string, error) {
	rp, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	for _, fsys := range []string{"/proc", "/sys", "/dev"} {
		if within(rp, fsys) {
			return "", fmt.Errorf("%s is a kernel file system", fsys)
		}
	}
	resolved := func(s string) string {
		if r, err := filepath.EvalSymlinks(s); err == nil {
			return r
		}
		return filepath.Clean(s)
	}
	for _, s := range secrets {
		if s := resolved(s); within(rp, s) || within(s, rp) {
			return "", fmt.Errorf("sandboxes may not see %s", s)
		}
	}
	for _, q := range slices.Concat(m.writable, m.hidden) {
		if q := resolved(q); q != rp && within(q, rp) {
			return "", fmt.Errorf("it holds %s, which sandboxes may not see; expose the folders wanted instead", q)
		}
	}
	return rp, nil
}
