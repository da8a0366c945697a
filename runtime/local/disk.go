package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// disks keeps sandboxes' writable layers on disk, each within its own
// limit: a sparse file per sandbox holding an ext4 filesystem as large as
// the limit, attached to a loop device and mounted where the sandbox's
// overlay keeps its upper and work dirs. A write beyond the limit fails
// with ENOSPC in the writer, as on a full disk, and df inside the sandbox
// shows the limit. On a tmpfs the layer would be charged to the sandbox's
// memory cgroup, so a checkout or a build would count against its memory
// and a large write would get the whole sandbox OOM-killed.
//
// Formatting a filesystem takes 20–250 ms (1–100 GiB), so each size is
// formatted once per process, into a template kept in memory: the blocks
// mkfs wrote, ≈160 KB for 10 GiB (no journal, nothing on the filesystem
// outlives the sandbox; no blocks reserved for growing it or for root).
// A create makes an empty sparse file, attaches it and writes the template
// through the loop device: the blocks land in the device's page cache,
// where mounting finds them. Written into the file instead, they would be
// dirty pages of the file when it is attached, which makes attaching
// flush them to the host's filesystem; their blocks would then be
// allocated there, and freeing them when the sandbox ends took 25–41 ms
// per sandbox here (the host's root is mounted with discard) against
// 1.9–2.8 ms.
//
// The loop device detaches itself once its filesystem's last mount is gone
// (autoclear): when the sandbox's last process exits, or when a failed
// create unmounts it. The file is unlinked as soon as the filesystem is
// mounted, so the kernel frees it with the device: a server killed at any
// point leaves no file behind but that of a create in flight (strays).
type disks struct {
	dir  string // one file per sandbox: <id>.<nonce>.ext4
	mkfs string // mkfs.ext4
	log  *slog.Logger

	mu   sync.Mutex // guards made
	made map[int64]*diskTemplate
}

// diskTemplate is one formatted size, made at most once at a time.
type diskTemplate struct {
	done    chan struct{} // closed once made (or failed)
	err     error
	extents []diskExtent
	used    time.Time // last create that used it; guarded by disks.mu
}

// diskExtent is a run of blocks of a template that are not holes.
type diskExtent struct {
	off  int64
	data []byte
}

// Disk file names: <id>.<nonce>.ext4. The nonce makes each create's file
// new, so a sweep for strays that listed a deleted sandbox's file can never
// remove the file of a later sandbox with the same id (replicas share a
// state directory).
const diskSuffix = ".ext4"

// maxTemplateBytes bounds the memory of the templates kept, one per size
// asked for: ≈40 KB for 16 MiB, 160 KB for 10 GiB, 1 MB for 100 GiB, 12 MB
// for 1 TiB. The least recently used go first; the last one made stays.
const maxTemplateBytes = 64 << 20

// diskBlockSize is the filesystems' block size, and the loop devices'.
const diskBlockSize = 4096

// staleFormatAge: a file being formatted older than this was left by a
// process that died while formatting (formatting takes under a second).
const staleFormatAge = 10 * time.Minute

// newDisks prepares dir for sandbox disks and removes the files that a
// process which died while formatting left.
func newDisks(dir string, log *slog.Logger) (*disks, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// The kernel names a loop device's file by its resolved path.
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	d := &disks{dir: dir, log: log, made: map[int64]*diskTemplate{}}
	entries, _ := os.ReadDir(d.dir)
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), formatPrefix) && time.Since(fi.ModTime()) > staleFormatAge {
			_ = os.Remove(filepath.Join(d.dir, e.Name()))
		}
	}
	return d, nil
}

// usable reports why this host cannot loop-mount an ext4 filesystem, if
// it cannot; the runtime then keeps writable layers in memory.
func (d *disks) usable() error {
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return fmt.Errorf("no mkfs.ext4 (package e2fsprogs): %w", err)
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("no loop devices: %w", err)
	}
	ctl.Close()
	if b, err := os.ReadFile("/proc/filesystems"); err != nil || !strings.Contains(string(b), "\text4\n") {
		return errors.New("the kernel has no ext4")
	}
	d.mkfs = mkfs
	return nil
}

// diskName is a new name for sandbox id's disk file.
func diskName(id string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return id + "." + hex.EncodeToString(b[:]) + diskSuffix
}

// diskID is the sandbox id of a disk file name; false if name is not one.
func diskID(name string) (string, bool) {
	rest, ok := strings.CutSuffix(name, diskSuffix)
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 {
		return "", false
	}
	return rest[:i], idPattern.MatchString(rest[:i])
}

// formatPrefix starts the names of the files mkfs formats templates in.
const formatPrefix = ".format-"

// mount makes disk file name, of size bytes (a whole number of blocks),
// and mounts its filesystem at target. The file is unlinked once mounted:
// the loop device holds it from then on. On error nothing is left but,
// maybe, the file, which remove deletes.
func (d *disks) mount(ctx context.Context, name string, size int64, target string) error {
	tmpl, err := d.template(ctx, size)
	if err != nil {
		return err
	}
	path := filepath.Join(d.dir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("make disk: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("make disk: %w", err)
	}
	dev, err := attachLoop(path)
	if err != nil {
		return err
	}
	// Closed once mounted: the mount then holds the only reference, and
	// its end detaches the device. On failure, closing detaches it.
	defer dev.Close()
	for _, e := range tmpl {
		if _, err := dev.WriteAt(e.data, e.off); err != nil {
			return fmt.Errorf("write filesystem to %s: %w", dev.Name(), err)
		}
	}
	// minixdf: df shows the whole size, the sandbox's limit, not the size
	// less the inode tables. nobarrier: nothing on the filesystem outlives
	// the host, so an fsync need not flush the host's disk cache.
	// no_prefetch_block_bitmaps: no kernel thread reading every group's
	// bitmap in the background of each mount.
	err = unix.Mount(dev.Name(), target, "ext4", unix.MS_NOSUID|unix.MS_NODEV,
		"noinit_itable,minixdf,nobarrier,no_prefetch_block_bitmaps")
	if err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", dev.Name(), path, target, err)
	}
	return d.remove(name)
}

// template returns the blocks of an empty filesystem of size bytes,
// formatting it first if needed.
func (d *disks) template(ctx context.Context, size int64) ([]diskExtent, error) {
	d.mu.Lock()
	t, ok := d.made[size]
	if !ok {
		t = &diskTemplate{done: make(chan struct{})}
		d.made[size] = t
	}
	t.used = time.Now()
	d.mu.Unlock()
	if ok {
		select {
		case <-t.done:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		return t.extents, t.err
	}
	t.extents, t.err = d.format(size)
	close(t.done)
	d.mu.Lock()
	if t.err != nil {
		delete(d.made, size) // the next create tries again
	} else {
		d.pruneLocked()
	}
	d.mu.Unlock()
	return t.extents, t.err
}

// format formats an empty filesystem of size bytes and returns its blocks
// that are not holes.
func (d *disks) format(size int64) ([]diskExtent, error) {
	start := time.Now()
	path := filepath.Join(d.dir, fmt.Sprintf("%s%d-%s", formatPrefix, size, diskName("t")))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("format disk template: %w", err)
	}
	defer os.Remove(path)
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return nil, fmt.Errorf("format disk template: %w", err)
	}
	// No journal: nothing on the filesystem outlives the sandbox, and a
	// journal would be written at every create. No resize inode (4 MB of
	// reserved descriptor blocks per 10 GiB) and no blocks reserved for
	// root, who every sandbox user may be. Inode tables are left unwritten:
	// they read as zeros in a sparse file, and the mount's noinit_itable
	// keeps the kernel from zeroing them.
	cmd := exec.Command(d.mkfs, "-q", "-F", "-b", strconv.Itoa(diskBlockSize), "-T", "default", "-m", "0",
		"-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0", path)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("format disk template: %s: %w: %s", d.mkfs, err, strings.TrimSpace(string(out)))
	}
	extents, err := dataBlocks(f, size)
	if err != nil {
		return nil, fmt.Errorf("format disk template: %w", err)
	}
	d.log.Info("formatted sandbox disk template", "bytes", size, "took", time.Since(start))
	return extents, nil
}

// dataBlocks reads the blocks of f that are not holes. Zeros among them
// are kept: the filesystem reads them (a bitmap at the first mkdir), and
// written with the rest they are in the device's page cache.
func dataBlocks(f *os.File, size int64) ([]diskExtent, error) {
	var out []diskExtent
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only holes left
		} else if err != nil {
			return nil, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, hole-data)
		if _, err := f.ReadAt(buf, data); err != nil {
			return nil, err
		}
		out = append(out, diskExtent{off: data, data: buf})
		off = hole
	}
	return out, nil
}

// pruneLocked drops the least recently used templates beyond
// maxTemplateBytes. The caller holds d.mu.
func (d *disks) pruneLocked() {
	type tmpl struct {
		size, bytes int64
		used        time.Time
	}
	var all []tmpl
	for size, t := range d.made {
		select {
		case <-t.done:
		default:
			continue // being made
		}
		var n int64
		for _, e := range t.extents {
			n += int64(len(e.data))
		}
		all = append(all, tmpl{size, n, t.used})
	}
	slices.SortFunc(all, func(a, b tmpl) int { return b.used.Compare(a.used) })
	var total int64
	for i, t := range all {
		if total += t.bytes; i > 0 && total > maxTemplateBytes {
			delete(d.made, t.size)
		}
	}
}

// remove deletes disk file name. A loop device attached to it keeps the
// blocks until it detaches.
func (d *disks) remove(name string) error {
	if err := os.Remove(filepath.Join(d.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove disk: %w", err)
	}
	return nil
}

// removeAll deletes every disk file of sandbox id, for a sandbox whose
// record (and so its disk's name) is lost.
func (d *disks) removeAll(id string) error {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range entries {
		if got, ok := diskID(e.Name()); ok && got == id {
			errs = append(errs, d.remove(e.Name()))
		}
	}
	return errors.Join(errs...)
}

// free is how many bytes the disks' filesystem has free for them.
func (d *disks) free() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(d.dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// loopAttempts bounds attaching to a free loop device that another
// process (losetup, another runtime) takes between the lookup and the
// attach.
const loopAttempts = 32

// attachLoop attaches the file at path to a free loop device, autoclear,
// and returns the open device.
//
// Not with direct I/O: every block the filesystem reads or writes would
// then wait for the disk (mounting and the first mkdirs took 5.7–10.3 ms
// against 1.5–3.4 ms under load here). Buffered, the file's pages sit in the
// host's page cache like any file's, and what a short-lived sandbox writes
// may never reach the disk at all.
func attachLoop(path string) (*os.File, error) {
	backing, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("attach loop device: %w", err)
	}
	defer backing.Close() // the device holds its own reference
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("attach loop device: %w", err)
	}
	defer ctl.Close()
	var last error
	for range loopAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("attach loop device: find a free one: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("attach loop device: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Size: diskBlockSize, Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("attach loop device %s: %w", dev.Name(), err)
		}
		last = err // taken meanwhile
	}
	return nil, fmt.Errorf("attach loop device: no free one after %d attempts: %w", loopAttempts, last)
}

// loopDevice is a loop device and the file it is attached to.
type loopDevice struct {
	dev     string // /dev/loopN
	backing string // the file's path when attached; it may be deleted since
}

// loopDevices lists the attached loop devices whose files were in dir.
func loopDevices(dir string) []loopDevice {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []loopDevice
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		p := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)")
		if filepath.Dir(p) == dir {
			name := filepath.Base(filepath.Dir(filepath.Dir(f)))
			out = append(out, loopDevice{dev: "/dev/" + name, backing: p})
		}
	}
	return out
}

// detachLoop detaches a loop device, or, while its filesystem is still
// mounted, makes it detach itself once it is not.
func detachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return err // ENXIO: detached meanwhile
	}
	return nil
}

// strays removes what sandboxes no runtime has a record of left in d.dir:
// disk files, and loop devices still attached to them (a sandbox whose
// state directory was wiped while it ran). Loop devices normally detach
// themselves with their filesystem's last mount; this covers devices that
// lost that flag or never had it.
func (d *disks) strays(recorded func(id string) bool) {
	for _, l := range loopDevices(d.dir) {
		if id, ok := diskID(filepath.Base(l.backing)); ok && !recorded(id) {
			if err := detachLoop(l.dev); err != nil {
				d.log.Warn("detach loop device of a stray sandbox disk", "device", l.dev, "file", l.backing, "err", err)
			}
		}
	}
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		id, ok := diskID(e.Name())
		// The sandbox's directory is made before its disk and removed
		// after it, so a disk without one is no sandbox's.
		if !ok || recorded(id) {
			continue
		}
		d.log.Warn("removing the disk of a sandbox whose state is gone", "sandbox_id", id, "file", e.Name())
		if err := d.remove(e.Name()); err != nil {
			d.log.Warn("remove stray sandbox disk", "sandbox_id", id, "err", err)
		}
	}
}
