package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/runtime"
)

var _ runtime.Snapshotter = (*Local)(nil)

// Saved layers (snapshots) live in one directory per layer under layers/,
// which is the mount point of a filesystem of their own: a sparse ext4
// file (layers.ext4) on a loop device. Not a folder of the state
// directory's filesystem, because a "host" sandbox's root stacks the
// host's root as its bottom layer, and overlayfs refuses a layer that lies
// inside another one's tree (EBUSY "overlapping lowerdir"). The file is
// sparse: it takes host disk as layers are written, and outlives the
// server, so snapshots survive a restart.
//
// A layer's directory holds fs/ (a copy of the sandbox's writable layer
// as overlayfs keeps it: whiteouts, opaque folders and their xattrs) and
// layer.json. A sandbox started from it stacks fs/ read-only under its
// own writable layer: every branch shares the one copy.
//
// Every change to the set of layers, and every create that stacks layers,
// holds layers.lock: exclusively to remove, shared to use. A layer is
// removed (PruneLayers) only once released and unused: no sandbox's record
// names it and no other layer lies on it.
const (
	layersDir      = "layers"
	layersFile     = "layers.ext4"
	layersLockFile = "layers.lock"
	layerMetaFile  = "layer.json"
	layerFSDir     = "fs"
	// maxLayerDepth bounds a sandbox's stack of saved layers (a fork of a
	// fork of ...): overlayfs takes at most 500 lower layers, and each
	// costs every lookup that misses the ones above it.
	maxLayerDepth = 128
)

// freezeAttempts bounds SaveLayer's tries to freeze a sandbox.
const freezeAttempts = 4

// defaultLayersBytes is the size of the layers filesystem: sparse, so
// only what layers hold is taken from the host's disk.
const defaultLayersBytes = 1 << 40

// layerMeta is layer.json.
type layerMeta struct {
	Name      string          `json:"name"`
	CreatedAt time.Time       `json:"created_at"`
	Bytes     int64           `json:"bytes"`
	Source    string          `json:"source"`
	Parents   []string        `json:"parents,omitempty"`
	Meta      json.RawMessage `json:"meta,omitempty"`
	Released  bool            `json:"released,omitempty"`
}

// layers manages the layers filesystem of one state directory.
type layers struct {
	stateDir string
	dir      string
	mkfs     string

	mu      sync.Mutex // guards mounted
	mounted bool
}

func newLayers(stateDir, mkfs string) *layers {
	// The kernel names a loop device's file by its resolved path.
	if real, err := filepath.EvalSymlinks(stateDir); err == nil {
		stateDir = real
	}
	return &layers{stateDir: stateDir, dir: filepath.Join(stateDir, layersDir), mkfs: mkfs}
}

// lock takes layers.lock (unix.LOCK_SH or LOCK_EX); the returned function
// releases it.
func (ls *layers) lock(how int) (func(), error) {
	f, err := os.OpenFile(filepath.Join(ls.stateDir, layersLockFile), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := flock(f, how); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// ensure mounts the layers filesystem if it is not mounted, making it on
// first use.
func (ls *layers) ensure() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.mounted && mounted(ls.dir) {
		return nil
	}
	if err := os.MkdirAll(ls.dir, 0o700); err != nil {
		return err
	}
	if mounted(ls.dir) {
		ls.mounted = true
		return nil
	}
	file := filepath.Join(ls.stateDir, layersFile)
	// A device still attached to the file (its filesystem held by live
	// sandboxes' roots after this directory was unmounted) is mounted
	// again as it is: a second device on the same file would be a second,
	// diverging writer of one filesystem.
	for _, d := range loopDevices(ls.stateDir) {
		if d.backing == file {
			if err := unix.Mount(d.dev, ls.dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
				return fmt.Errorf("mount layers filesystem %s: %w", d.dev, err)
			}
			ls.mounted = true
			return nil
		}
	}
	if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
		if err := ls.format(file); err != nil {
			return err
		}
	}
	dev, err := attachLoop(file)
	if err != nil {
		return err
	}
	defer dev.Close() // the mount holds the device; autoclear detaches it with the last one
	if err := unix.Mount(dev.Name(), ls.dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable"); err != nil {
		return fmt.Errorf("mount layers filesystem %s on %s: %w", dev.Name(), ls.dir, err)
	}
	_ = os.Chmod(ls.dir, 0o700)
	ls.mounted = true
	return nil
}

// format makes the layers filesystem's file. With a journal, unlike
// sandboxes' disks: layers outlive the server and the host's crashes.
func (ls *layers) format(file string) error {
	tmp := file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("make layers filesystem: %w", err)
	}
	err = f.Truncate(defaultLayersBytes)
	f.Close()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("make layers filesystem: %w", err)
	}
	cmd := exec.Command(ls.mkfs, "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0", tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("make layers filesystem: %s: %w: %s", ls.mkfs, err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, file)
}

// release unmounts the layers filesystem if no sandbox of the state
// directory stacks a layer (Close: a state directory without sandboxes
// keeps no mount).
func (ls *layers) release(inUse func() bool) {
	unlock, err := ls.lock(unix.LOCK_EX)
	if err != nil {
		return
	}
	defer unlock()
	if !mounted(ls.dir) || inUse() {
		return
	}
	_ = unmount(ls.dir)
	ls.mu.Lock()
	ls.mounted = false
	ls.mu.Unlock()
}

func (ls *layers) path(name string) string { return filepath.Join(ls.dir, name) }

// FSPath is where a layer's files are, for a root's lower layers.
func (ls *layers) fsPath(name string) string { return filepath.Join(ls.dir, name, layerFSDir) }

func readLayerMeta(dir string) (layerMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, layerMetaFile))
	if err != nil {
		return layerMeta{}, err
	}
	var m layerMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return layerMeta{}, fmt.Errorf("%s: %w", filepath.Join(dir, layerMetaFile), err)
	}
	return m, nil
}

func (m layerMeta) layer() runtime.Layer {
	return runtime.Layer{Name: m.Name, CreatedAt: m.CreatedAt, Bytes: m.Bytes, Source: m.Source,
		Parents: slices.Clone(m.Parents), Meta: slices.Clone([]byte(m.Meta)), Released: m.Released}
}

func layerNotFound(name string) error {
	return faults.Newf(faults.CodeSnapshotNotFound, faults.NotFound, faults.Client, "snapshot layer %s not found", name)
}

// SaveLayer copies sandbox id's writable layer into the new layer name.
func (l *Local) SaveLayer(ctx context.Context, id, name string, opts runtime.LayerOptions) (runtime.Layer, error) {
	meta, maxBytes := opts.Meta, opts.MaxBytes
	if !idPattern.MatchString(name) || name == "." || name == ".." {
		return runtime.Layer{}, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "invalid layer name %q", name)
	}
	if meta != nil && !json.Valid(meta) {
		return runtime.Layer{}, faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Platform, "layer metadata is not JSON")
	}
	if l.layers == nil {
		return runtime.Layer{}, errNoLayers()
	}
	if !idPattern.MatchString(id) {
		return runtime.Layer{}, notFound(id)
	}
	s, err := l.lookup(id)
	if err != nil {
		return runtime.Layer{}, err
	}
	if s == nil {
		return runtime.Layer{}, notFound(id)
	}
	// Serialised with Delete and Pause: the sandbox is neither torn down
	// nor thawed by someone else while its layer is copied.
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	c, gone, broken, root, spec := s.container, s.gone, s.broken, s.fsRoot, s.meta.Spec
	s.mu.Unlock()
	switch {
	case gone:
		return runtime.Layer{}, notFound(id)
	case c == nil || broken != "":
		return runtime.Layer{}, faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox, "sandbox %s is not running%s", id, suffix(broken))
	case root == nil:
		return runtime.Layer{}, faults.Newf(faults.CodeSnapshotUnavailable, faults.NotImplemented, faults.Platform,
			"sandbox %s was started by an earlier server process: its writable layer is out of this one's reach", id)
	}
	if len(spec.Layers)+1 > maxLayerDepth {
		return runtime.Layer{}, faults.Newf(faults.CodeSnapshotUnavailable, faults.NotImplemented, faults.Client,
			"sandbox %s already stacks %d saved layers: a snapshot of it would pass the limit of %d", id, len(spec.Layers), maxLayerDepth)
	}

	unlock, err := l.layers.lock(unix.LOCK_SH)
	if err != nil {
		return runtime.Layer{}, snapshotFailed(id, "lock layers", err)
	}
	defer unlock()
	if err := l.layers.ensure(); err != nil {
		return runtime.Layer{}, snapshotFailed(id, "mount layers filesystem", err)
	}
	if _, err := os.Lstat(l.layers.path(name)); err == nil {
		return runtime.Layer{}, faults.Newf(faults.CodeValidation, faults.Conflict, faults.Client, "layer %s exists", name)
	}

	// Frozen, nothing in the sandbox writes while its layer is measured and
	// copied. A sandbox the user paused stays paused.
	st, err := c.Status()
	if err != nil {
		return runtime.Layer{}, snapshotFailed(id, "container status", err)
	}
	if st == libcontainer.Running {
		// The v1 freezer gives up when a task does not reach a point where
		// it can stop in time, which a loaded host sees now and then: the
		// next try usually gets it.
		err := c.Pause()
		for try := 1; err != nil && try < freezeAttempts; try++ {
			_ = c.Resume()
			time.Sleep(time.Duration(try) * 50 * time.Millisecond)
			err = c.Pause()
		}
		if err != nil {
			return runtime.Layer{}, faults.Wrap(err, faults.CodeCapacity, faults.Capacity, faults.Platform,
				fmt.Sprintf("snapshot of sandbox %s: its processes could not be frozen (the host is loaded); try again", id))
		}
		defer func() {
			if err := c.Resume(); err != nil && !errors.Is(err, libcontainer.ErrNotPaused) {
				l.log.Error("thaw sandbox after snapshot", "sandbox_id", id, "err", err)
			}
		}()
	} else if st != libcontainer.Paused {
		return runtime.Layer{}, faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox, "sandbox %s is not running", id)
	}

	upper := filepath.Join(fdPath(root), "upper")
	size, err := diskUsage(upper)
	if err != nil {
		return runtime.Layer{}, snapshotFailed(id, "measure writable layer", err)
	}
	if maxBytes > 0 && size > maxBytes {
		return runtime.Layer{}, faults.Newf(faults.CodeSnapshotTooLarge, faults.TooLarge, faults.Client,
			"sandbox %s has %d MiB of filesystem changes, more than the snapshot cap of %d MiB", id, size>>20, maxBytes>>20)
	}
	var stf unix.Statfs_t
	if err := unix.Statfs(l.layers.dir, &stf); err == nil && size > int64(stf.Bavail)*stf.Bsize {
		return runtime.Layer{}, faults.Newf(faults.CodeCapacity, faults.Capacity, faults.Platform,
			"snapshot of sandbox %s: %d MiB of changes, %d MiB free for snapshots", id, size>>20, (int64(stf.Bavail)*stf.Bsize)>>20)
	}
	if free, err := l.disks.free(); err == nil && size > free {
		return runtime.Layer{}, faults.Newf(faults.CodeCapacity, faults.Capacity, faults.Platform,
			"snapshot of sandbox %s: %d MiB of changes, %d MiB free on the host's disk", id, size>>20, free>>20)
	}

	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	tmp := filepath.Join(l.layers.dir, ".tmp-"+name+"-"+hex.EncodeToString(nonce[:]))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return runtime.Layer{}, snapshotFailed(id, "make layer", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(tmp)
		}
	}()
	// cp keeps what overlayfs needs of the copy: device nodes (whiteouts),
	// xattrs (opaque folders, redirects), owners, modes, times, hard links
	// and holes.
	// The hold is handed to cp as its fd 3: the path names it in cp.
	cmd := exec.CommandContext(ctx, "cp", "-a", "--sparse=always", "--", "/proc/self/fd/3/upper", filepath.Join(tmp, layerFSDir))
	cmd.ExtraFiles = []*os.File{root}
	if out, err := cmd.CombinedOutput(); err != nil {
		return runtime.Layer{}, snapshotFailed(id, "copy writable layer", fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out))))
	}
	if err := excludeFrom(filepath.Join(tmp, layerFSDir), opts.Exclude); err != nil {
		return runtime.Layer{}, snapshotFailed(id, "leave out excluded paths", err)
	}
	if size, err = diskUsage(filepath.Join(tmp, layerFSDir)); err != nil {
		return runtime.Layer{}, snapshotFailed(id, "measure layer", err)
	}
	m := layerMeta{Name: name, CreatedAt: time.Now().UTC(), Bytes: size, Source: id, Parents: slices.Clone(spec.Layers), Meta: meta}
	b, err := json.Marshal(m)
	if err != nil {
		return runtime.Layer{}, snapshotFailed(id, "write layer metadata", err)
	}
	if err := writeFileAtomic(filepath.Join(tmp, layerMetaFile), b); err != nil {
		return runtime.Layer{}, snapshotFailed(id, "write layer metadata", err)
	}
	if err := os.Rename(tmp, l.layers.path(name)); err != nil {
		return runtime.Layer{}, snapshotFailed(id, "store layer", err)
	}
	ok = true
	return m.layer(), nil
}

func errNoLayers() error {
	return faults.New(faults.CodeSnapshotUnavailable, faults.NotImplemented, faults.Platform,
		"snapshots need a filesystem of their own, and this host cannot loop-mount ext4 (mkfs.ext4, loop devices)")
}

func snapshotFailed(id, what string, err error) error {
	return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform, fmt.Sprintf("snapshot of sandbox %s: %s", id, what))
}

// excludeFrom removes from root, a copy of a sandbox's writable layer,
// what the globs (paths in the sandbox) match. Removing them from the copy
// rather than skipping them in it keeps the copy to one cp; what they
// match is small (sockets, lock files, a profile).
func excludeFrom(root string, globs []string) error {
	for _, g := range globs {
		if !filepath.IsAbs(g) {
			return fmt.Errorf("exclude %q: not an absolute path", g)
		}
		matches, err := filepath.Glob(filepath.Join(root, filepath.Clean(g)))
		if err != nil {
			return fmt.Errorf("exclude %q: %w", g, err)
		}
		for _, p := range matches {
			if !within(p, root) || p == root {
				continue
			}
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// diskUsage is the space the files under dir take, as du counts it.
func diskUsage(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	return total, err
}

// Layers lists every saved layer.
func (l *Local) Layers(ctx context.Context) ([]runtime.Layer, error) {
	if l.layers == nil {
		return nil, nil
	}
	if _, err := os.Stat(filepath.Join(l.layers.stateDir, layersFile)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil // none was ever saved
	}
	if err := l.layers.ensure(); err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	return l.listLayers()
}

func (l *Local) listLayers() ([]runtime.Layer, error) {
	ents, err := os.ReadDir(l.layers.dir)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	var out []runtime.Layer
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || e.Name() == "lost+found" {
			continue
		}
		m, err := readLayerMeta(l.layers.path(e.Name()))
		if err != nil {
			l.log.Warn("unreadable layer", "layer", e.Name(), "err", err)
			continue
		}
		out = append(out, m.layer())
	}
	slices.SortFunc(out, func(a, b runtime.Layer) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// ReleaseLayer marks a layer for removal once unused.
func (l *Local) ReleaseLayer(ctx context.Context, name string) error {
	if !idPattern.MatchString(name) || l.layers == nil {
		return nil
	}
	unlock, err := l.layers.lock(unix.LOCK_EX)
	if err != nil {
		return fmt.Errorf("release layer %s: %w", name, err)
	}
	defer unlock()
	if err := l.layers.ensure(); err != nil {
		return fmt.Errorf("release layer %s: %w", name, err)
	}
	dir := l.layers.path(name)
	m, err := readLayerMeta(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || m.Released {
		return err
	}
	m.Released = true
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, layerMetaFile), b)
}

// PruneLayers removes released layers that no sandbox stacks and no other
// layer lies on.
func (l *Local) PruneLayers(ctx context.Context) ([]string, error) {
	if l.layers == nil {
		return nil, nil
	}
	if _, err := os.Stat(filepath.Join(l.layers.stateDir, layersFile)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	unlock, err := l.layers.lock(unix.LOCK_EX)
	if err != nil {
		return nil, fmt.Errorf("prune layers: %w", err)
	}
	defer unlock()
	if err := l.layers.ensure(); err != nil {
		return nil, fmt.Errorf("prune layers: %w", err)
	}
	stacked := l.stackedLayers()
	var removed []string
	// Until nothing goes: removing a layer may leave the one it lay on unused.
	for {
		all, err := l.listLayers()
		if err != nil {
			return removed, err
		}
		used := maps.Clone(stacked)
		for _, ly := range all {
			for _, p := range ly.Parents {
				used[p] = true
			}
		}
		n := len(removed)
		for _, ly := range all {
			if !ly.Released || used[ly.Name] {
				continue
			}
			// Renamed first: a crash half-way leaves a hidden folder, never a
			// layer with part of its files.
			trash := filepath.Join(l.layers.dir, ".trash-"+ly.Name)
			if err := os.Rename(l.layers.path(ly.Name), trash); err != nil {
				return removed, fmt.Errorf("prune layer %s: %w", ly.Name, err)
			}
			if err := os.RemoveAll(trash); err != nil {
				return removed, fmt.Errorf("prune layer %s: %w", ly.Name, err)
			}
			removed = append(removed, ly.Name)
		}
		if len(removed) == n {
			break
		}
	}
	// What a crash left: half-made and half-removed layers.
	if ents, err := os.ReadDir(l.layers.dir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".trash-") {
				_ = os.RemoveAll(filepath.Join(l.layers.dir, e.Name()))
			}
		}
	}
	return removed, nil
}

// stackedLayers is the set of layers named by the record of any sandbox
// of the state directory, this process's or another's, live or not: a
// record exists from the start of a create until its teardown ends.
func (l *Local) stackedLayers() map[string]bool {
	used := map[string]bool{}
	ents, _ := os.ReadDir(l.boxRoot)
	for _, e := range ents {
		m, err := readMeta(filepath.Join(l.boxRoot, e.Name()))
		if err != nil {
			continue
		}
		for _, n := range m.Spec.Layers {
			used[n] = true
		}
	}
	return used
}

// stackLayers checks that a create's layers exist and returns their
// folders, top first. Callers hold layers.lock shared.
func (l *Local) stackLayers(names []string) ([]string, error) {
	if len(names) > maxLayerDepth {
		return nil, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
			"%d saved layers: at most %d stack", len(names), maxLayerDepth)
	}
	if l.layers == nil {
		return nil, errNoLayers()
	}
	if err := l.layers.ensure(); err != nil {
		return nil, fmt.Errorf("mount layers filesystem: %w", err)
	}
	out := make([]string, len(names))
	for i, n := range names {
		if !idPattern.MatchString(n) {
			return nil, layerNotFound(n)
		}
		if _, err := os.Stat(filepath.Join(l.layers.path(n), layerMetaFile)); err != nil {
			return nil, layerNotFound(n)
		}
		out[i] = l.layers.fsPath(n)
	}
	return out, nil
}
