package main

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/orchard/orchard/harness"
)

// harnessesName is the image that carries a harness store to Kubernetes
// sandbox pods: unlike the others it is not made from Debian packages but
// from a store `orchard harness install` wrote (--store), so it holds
// exactly what a local server's sandboxes get.
const harnessesName = "orchard-harnesses"

// harnessImage is the current generation of the harness store in dir at
// the root of a one-layer image, for an image volume mounted read-only at
// harness.MountPath (its launchers name that path). Files that are hard
// links of each other stay links; times are epoch, owners root.
func harnessImage(dir string, epoch time.Time) (v1.Image, error) {
	gen, err := (&harness.Store{Dir: dir}).Current()
	if err != nil {
		return nil, err
	}
	if gen == "" {
		return nil, fmt.Errorf("--store %s: no harness installed (orchard harness install NAME...)", dir)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTree(pw, gen, epoch)) }()
		return pr, nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", "amd64", v1.Time{Time: epoch}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "Orchard harnesses, mounted at " + harness.MountPath,
		"org.opencontainers.image.description": "coding-agent harnesses with their runtime and libraries, for a read-only image volume",
	}
	return mutate.ConfigFile(img, cf)
}

// writeTree writes dir as a tar stream, in WalkDir's (sorted) order.
func writeTree(w io.Writer, dir string, epoch time.Time) error {
	tw := tar.NewWriter(w)
	seen := map[uint64]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname = rel, epoch, 0, 0, "", ""
		h.Mode &^= 0o222 // read-only, as in the store
		if fi.IsDir() {
			h.Name += "/"
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			if first, ok := seen[st.Ino]; ok {
				h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			} else {
				seen[st.Ino] = rel
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
