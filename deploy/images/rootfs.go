package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"sync"
	"time"
)

// rootfs is an image's file tree, assembled in memory (headers) and in a
// spool file (contents) so that the layer can be written in sorted order
// whatever order the packages came in.
type rootfs struct {
	entries map[string]*entry // by clean path without a leading slash
	spool   *os.File
	size    int64 // of the spool
	// dup counts files that a later package replaced.
	dup int
}

type entry struct {
	hdr  tar.Header
	off  int64  // of a regular file's content in the spool
	data []byte // content of a generated file (instead of the spool)
}

func newRootfs(dir string) (*rootfs, error) {
	f, err := os.CreateTemp(dir, "rootfs-spool-")
	if err != nil {
		return nil, fmt.Errorf("rootfs spool: %w", err)
	}
	// The spool lives only as long as the open file.
	_ = os.Remove(f.Name())
	return &rootfs{entries: map[string]*entry{}, spool: f}, nil
}

func (r *rootfs) Close() error { return r.spool.Close() }

// merged are the top-level directories that bookworm's merged /usr turns
// into links into /usr; packages still ship files under them.
var merged = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// usrMerge maps a package's path onto the merged-/usr layout: bin/x is
// usr/bin/x, as on a system installed by debootstrap since bookworm.
func usrMerge(p string) string {
	for _, m := range merged {
		if p == m || strings.HasPrefix(p, m+"/") {
			return "usr/" + p
		}
	}
	return p
}

// clean turns a tar name ("./usr/bin/", "/etc/x") into the key form.
func clean(name string) string {
	p := path.Clean("/" + name)
	return strings.TrimPrefix(p, "/")
}

// add reads one tar stream of a package's files into the tree. It returns
// the package's paths as dpkg knows them (unmerged), for its .list file.
func (r *rootfs) add(tr *tar.Reader) ([]string, error) {
	var list []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return list, nil
		}
		if err != nil {
			return nil, err
		}
		orig := clean(h.Name)
		if orig == "" {
			list = append(list, "/.")
			continue
		}
		list = append(list, "/"+orig)
		p := usrMerge(orig)
		hdr := tar.Header{
			Typeflag: h.Typeflag, Name: p, Mode: h.Mode & 0o7777, Uid: h.Uid, Gid: h.Gid,
			Linkname: h.Linkname, Devmajor: h.Devmajor, Devminor: h.Devminor,
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if _, ok := r.entries[p]; ok {
				continue
			}
		case tar.TypeReg:
			hdr.Size = h.Size
		case tar.TypeSymlink:
			if p != orig && !path.IsAbs(h.Linkname) {
				// A relative target was written for the unmerged place.
				abs := usrMerge(clean(path.Join(path.Dir(orig), h.Linkname)))
				hdr.Linkname = relative(path.Dir(p), abs)
			}
		case tar.TypeLink:
			hdr.Linkname = usrMerge(clean(h.Linkname))
		default:
			return nil, fmt.Errorf("%s: unsupported tar entry type %q", h.Name, h.Typeflag)
		}
		e := &entry{hdr: hdr}
		if h.Typeflag == tar.TypeReg {
			e.off = r.size
			n, err := io.Copy(r.spool, tr)
			if err != nil {
				return nil, fmt.Errorf("spool %s: %w", h.Name, err)
			}
			r.size += n
		}
		if old, ok := r.entries[p]; ok && old.hdr.Typeflag != tar.TypeDir {
			r.dup++
		}
		r.entries[p] = e
	}
}

// relative is the link target that reaches target (a key) from dir.
func relative(dir, target string) string {
	d := strings.Split(dir, "/")
	t := strings.Split(target, "/")
	if dir == "" {
		d = nil
	}
	i := 0
	for i < len(d) && i < len(t) && d[i] == t[i] {
		i++
	}
	parts := make([]string, 0, len(d)-i+len(t)-i)
	for range d[i:] {
		parts = append(parts, "..")
	}
	return path.Join(append(parts, t[i:]...)...)
}

// file adds a generated regular file.
func (r *rootfs) file(p string, mode int64, uid int, data []byte) {
	p = clean(p)
	r.entries[p] = &entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Uid: uid, Gid: uid, Size: int64(len(data))}, data: data}
}

func (r *rootfs) dir(p string, mode int64, uid int) {
	p = clean(p)
	r.entries[p] = &entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: p, Mode: mode, Uid: uid, Gid: uid}}
}

func (r *rootfs) symlink(p, target string) {
	p = clean(p)
	r.entries[p] = &entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: target, Mode: 0o777}}
}

// read returns a file's content, following links inside the tree.
func (r *rootfs) read(p string) ([]byte, error) {
	p = clean(p)
	for range 40 {
		e, ok := r.entries[p]
		if !ok {
			return nil, fmt.Errorf("%s: %w", p, fs.ErrNotExist)
		}
		switch e.hdr.Typeflag {
		case tar.TypeReg:
			if e.data != nil {
				return e.data, nil
			}
			b := make([]byte, e.hdr.Size)
			if _, err := r.spool.ReadAt(b, e.off); err != nil {
				return nil, fmt.Errorf("read %s from spool: %w", p, err)
			}
			return b, nil
		case tar.TypeSymlink:
			t := e.hdr.Linkname
			if !path.IsAbs(t) {
				t = path.Join(path.Dir(p), t)
			}
			p = usrMerge(clean(t)) // through the merged-/usr links
		case tar.TypeLink:
			p = e.hdr.Linkname
		default:
			return nil, fmt.Errorf("%s: not a file", p)
		}
	}
	return nil, fmt.Errorf("%s: too many links", p)
}

// exists reports whether p is in the tree (links not followed).
func (r *rootfs) exists(p string) bool {
	_, ok := r.entries[usrMerge(clean(p))]
	return ok
}

// parents adds the missing parent directories of every entry: tar
// readers create them with modes of their own choosing otherwise.
func (r *rootfs) parents() {
	for p := range r.entries {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := r.entries[d]; ok {
				break
			}
			r.dir(d, 0o755, 0)
		}
	}
}

// write writes the tree as one tar stream: entries sorted by name, every
// time set to mtime, owners by number only, hard links after the files
// they name (a reader must have the target first).
func (r *rootfs) write(ctx context.Context, w io.Writer, mtime time.Time) error {
	r.parents()
	names := make([]string, 0, len(r.entries))
	for p := range r.entries {
		names = append(names, p)
	}
	sort.Slice(names, func(i, j int) bool {
		li := r.entries[names[i]].hdr.Typeflag == tar.TypeLink
		lj := r.entries[names[j]].hdr.Typeflag == tar.TypeLink
		if li != lj {
			return lj
		}
		return names[i] < names[j]
	})
	tw := tar.NewWriter(w)
	for i, p := range names {
		if i%4096 == 0 && ctx.Err() != nil {
			return context.Cause(ctx)
		}
		e := r.entries[p]
		if p == "" {
			continue // the root: its owner and mode are the runtime's
		}
		h := e.hdr
		h.Name = p
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		h.ModTime = mtime
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return fmt.Errorf("layer: %s: %w", p, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		var src io.Reader = bytes.NewReader(e.data)
		if e.data == nil {
			src = io.NewSectionReader(r.spool, e.off, h.Size)
		}
		if _, err := io.Copy(tw, src); err != nil {
			return fmt.Errorf("layer: %s: %w", p, err)
		}
	}
	return tw.Close()
}

// unpacked is a package's control members by name and its files' tar.
type unpacked struct {
	ctrl map[string][]byte
	fsys []byte
}

// unpackDeb reads a .deb's control members and its files' tar stream.
func unpackDeb(ctx context.Context, file string) (unpacked, error) {
	u := unpacked{ctrl: map[string][]byte{}}
	err := dpkgDeb(ctx, file, "--ctrl-tarfile", func(tr *tar.Reader) error {
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if h.Typeflag != tar.TypeReg {
				continue
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			u.ctrl[path.Base(h.Name)] = b
		}
	})
	if err != nil {
		return u, err
	}
	if _, ok := u.ctrl["control"]; !ok {
		return u, fmt.Errorf("%s: no control file", file)
	}
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", file)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if u.fsys, err = cmd.Output(); err != nil {
		return u, fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", file, err, strings.TrimSpace(stderr.String()))
	}
	return u, nil
}

// unpackAhead is how many packages are decompressed ahead of the one
// being added: xz decoding is most of an unpack's time, and runs on other
// cores while the tree takes the previous package, with at most this
// many unpacked packages (chromium's: 300 MB) in memory.
const unpackAhead = 2

// unpackAll unpacks the debs concurrently and hands them to add in
// order, so that the tree is the same however the unpacking interleaves.
func unpackAll(ctx context.Context, debs []deb, add func(int, unpacked) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		u   unpacked
		err error
	}
	results := make([]chan result, len(debs))
	for i := range results {
		results[i] = make(chan result, 1) // never blocks a finished unpack
	}
	slots := make(chan struct{}, unpackAhead)
	var running sync.WaitGroup
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i, d := range debs {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			running.Go(func() {
				u, err := unpackDeb(ctx, d.Path)
				results[i] <- result{u, err}
			})
		}
	}()
	// Unpacks still running after an error end with ctx.
	defer func() { cancel(); <-done; running.Wait() }()
	for i, d := range debs {
		var r result
		select {
		case r = <-results[i]:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		<-slots
		if r.err == nil {
			r.err = add(i, r.u)
		}
		if r.err != nil {
			return fmt.Errorf("unpack %s: %w", d.Filename, r.err)
		}
	}
	return nil
}

// dpkgDeb streams a member of a .deb as tar: dpkg-deb knows every
// compression a Debian archive may use, and nothing is unpacked to disk.
func dpkgDeb(ctx context.Context, file, member string, read func(*tar.Reader) error) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", member, file)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb %s %s: %w", member, file, err)
	}
	rerr := read(tar.NewReader(out))
	if rerr != nil {
		// Unblock dpkg-deb if it is still writing.
		_, _ = io.Copy(io.Discard, out)
	}
	werr := cmd.Wait()
	if rerr != nil {
		return fmt.Errorf("dpkg-deb %s %s: %w", member, file, rerr)
	}
	if werr != nil {
		return fmt.Errorf("dpkg-deb %s %s: %w: %s", member, file, werr, strings.TrimSpace(stderr.String()))
	}
	return nil
}
