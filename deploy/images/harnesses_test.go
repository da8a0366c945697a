package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The orchard-harnesses image holds the store's current generation at its
// root, read-only, hard links kept as links (one copy of a big binary).
func TestHarnessImage(t *testing.T) {
	dir := t.TempDir()
	gen := filepath.Join(dir, "gens", "g1")
	for name, body := range map[string]string{
		"manifest.json":     `[{"name":"codex","package":"@openai/codex","version":"1.0.0"}]`,
		"codex/bin/codex":   "#!/bin/sh\nexec true\n",
		"runtime/lib/ld.so": "loader",
	} {
		p := filepath.Join(gen, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(gen, "runtime/lib/ld.so"), filepath.Join(gen, "runtime/lib/ld-copy.so")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("gens/g1", filepath.Join(dir, "current")); err != nil {
		t.Fatal(err)
	}
	if _, err := harnessImage(t.TempDir(), time.Unix(0, 0)); err == nil {
		t.Error("an empty store made an image")
	}
	img, err := harnessImage(dir, time.Unix(1700000000, 0))
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	launcher := got["codex/bin/codex"]
	if launcher == nil || launcher.Mode&0o222 != 0 || launcher.ModTime.Unix() != 1700000000 {
		t.Errorf("codex/bin/codex: %+v, want a read-only file at the epoch", launcher)
	}
	a, b := got["runtime/lib/ld-copy.so"], got["runtime/lib/ld.so"]
	if a == nil || b == nil || a.Typeflag != tar.TypeReg || b.Typeflag != tar.TypeLink || b.Linkname != "runtime/lib/ld-copy.so" {
		t.Errorf("hard links: %+v, %+v; want one file and a link to it", a, b)
	}
	if got["manifest.json"] == nil || got["current"] != nil {
		t.Errorf("entries %v: want the generation's own, not the store's", got)
	}
}
