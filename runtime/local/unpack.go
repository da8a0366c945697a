package local

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// OCI whiteout names (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// errEscape marks a tar entry that would land outside the layer.
var errEscape = errors.New("tar entry escapes the layer")

// unpackTar extracts an uncompressed layer tar into dir, turning OCI
// whiteouts into overlayfs ones: ".wh.NAME" becomes a 0/0 character device
// NAME, ".wh..wh..opq" sets trusted.overlay.opaque=y on its directory.
// Every path is resolved beneath dir without following symlinks, so no
// entry can write outside it.
func unpackTar(ctx context.Context, r io.Reader, dir string) error {
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	u := &unpacker{root: root}
	defer unix.Close(root)
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		if n%256 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	return u.finish()
}

type unpacker struct {
	root int
	dirs []dirTimes // directory times, set last: adding entries changes them
}

type dirTimes struct {
	rel          string
	atime, mtime time.Time
}

// localPath cleans a tar name into a path relative to the layer root.
func localPath(name string) (string, error) {
	p := strings.TrimLeft(name, "/")
	if p == "" {
		return ".", nil
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", errEscape
		}
	}
	p = filepath.Clean(p)
	if !filepath.IsLocal(p) && p != "." {
		return "", errEscape
	}
	return p, nil
}

// resolveHow opens a path beneath the layer root, never through a symlink.
var resolveHow = unix.OpenHow{
	Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
}

// dir returns an O_PATH fd of directory rel, creating missing directories
// (tars may list a file before its parent). The caller closes it.
func (u *unpacker) dir(rel string, create bool) (int, error) {
	if rel == "." || rel == "" {
		return unix.Dup(u.root)
	}
	how := resolveHow
	fd, err := unix.Openat2(u.root, rel, &how)
	if err == nil || !create || !errors.Is(err, unix.ENOENT) {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return -1, errEscape
		}
		return fd, err
	}
	cur, err := unix.Dup(u.root)
	if err != nil {
		return -1, err
	}
	for _, part := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(cur, part, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(cur)
			return -1, err
		}
		how := resolveHow
		next, err := unix.Openat2(cur, part, &how)
		unix.Close(cur)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, errEscape
			}
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := localPath(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "." {
		return nil // the layer root: its attributes belong to the lower layers
	}
	parent, base := filepath.Split(rel)
	parent = strings.TrimSuffix(parent, "/")
	pfd, err := u.dir(parent, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)

	switch {
	case base == whiteoutOpaque:
		return unix.Lsetxattr(procFD(pfd, ""), "trusted.overlay.opaque", []byte("y"), 0)
	case strings.HasPrefix(base, whiteoutMeta):
		return nil // other AUFS metadata (.wh..wh.plnk, ...)
	case strings.HasPrefix(base, whiteoutPrefix):
		target := strings.TrimPrefix(base, whiteoutPrefix)
		if target == "" || target == "." || target == ".." {
			return errEscape
		}
		if err := removeEntry(pfd, target); err != nil {
			return err
		}
		return unix.Mknodat(pfd, target, unix.S_IFCHR, 0)
	}

	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			if !errors.Is(err, unix.EEXIST) {
				return err
			}
			var st unix.Stat_t
			if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				if err := removeEntry(pfd, base); err != nil {
					return err
				}
				if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
					return err
				}
			}
		}
		u.dirs = append(u.dirs, dirTimes{rel: rel, atime: hdr.AccessTime, mtime: hdr.ModTime})
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		if err := removeEntry(pfd, base); err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), base)
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := removeEntry(pfd, base); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return err
		}
	case tar.TypeLink:
		trel, err := localPath(hdr.Linkname)
		if err != nil || trel == "." {
			return errEscape
		}
		tparent, tbase := filepath.Split(trel)
		tfd, err := u.dir(strings.TrimSuffix(tparent, "/"), false)
		if err != nil {
			return fmt.Errorf("hard link target %s: %w", hdr.Linkname, err)
		}
		defer unix.Close(tfd)
		if err := removeEntry(pfd, base); err != nil {
			return err
		}
		// linkat without AT_SYMLINK_FOLLOW links a symlink itself, never
		// what it points to.
		return unix.Linkat(tfd, tbase, pfd, base, 0)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		if err := removeEntry(pfd, base); err != nil {
			return err
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknodat(pfd, base, kind|mode, int(dev)); err != nil {
			return err
		}
	default:
		return nil // pax headers and the like carry no file
	}

	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			if err := unix.Lsetxattr(procFD(pfd, base), name, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
				return fmt.Errorf("xattr %s: %w", name, err)
			}
		}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// After chown, which clears set-id bits.
		if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
			return err
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		return setTimes(pfd, base, hdr.AccessTime, hdr.ModTime)
	}
	return nil
}

// finish sets directory times, deepest first.
func (u *unpacker) finish() error {
	for i := len(u.dirs) - 1; i >= 0; i-- {
		d := u.dirs[i]
		parent, base := filepath.Split(d.rel)
		pfd, err := u.dir(strings.TrimSuffix(parent, "/"), false)
		if err != nil {
			return err
		}
		err = setTimes(pfd, base, d.atime, d.mtime)
		unix.Close(pfd)
		if err != nil {
			return err
		}
	}
	return nil
}

func setTimes(dirfd int, name string, atime, mtime time.Time) error {
	if atime.IsZero() {
		atime = mtime
	}
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// removeEntry removes name in dirfd if present, recursively for a
// directory (a later entry replacing an earlier one in the same layer).
func removeEntry(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EISDIR):
		return os.RemoveAll(procFD(dirfd, name))
	}
	return err
}

// procFD names an entry relative to an O_PATH directory fd for the calls
// that take only paths (xattrs). /proc/self/fd/N resolves to the directory
// itself, so no symlink on the way is followed.
func procFD(dirfd int, name string) string {
	if name == "" {
		name = "." // the directory itself, not the fd's magic link
	}
	return "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
}
