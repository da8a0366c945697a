// Package docimg saves screenshots that tests take of Orchard's pages as
// the small PNGs under docs/img, when ORCHARD_DOCS_IMG names that folder:
//
//	ORCHARD_DOCS_IMG=$PWD/docs/img go test -run 'Replay|Dashboard|Report' ./recordings ./server ./runner
//
// Without the variable nothing is written, so ordinary runs leave the tree
// alone.
package docimg

import (
	"bytes"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/image/draw"
)

// maxWidth keeps the committed images small: half of a 1200 px page is
// still readable in a README.
const maxWidth = 600

// Save writes shot (a PNG) as dir/name, scaled down to maxWidth.
func Save(t testing.TB, name string, shot []byte) {
	t.Helper()
	dir := os.Getenv("ORCHARD_DOCS_IMG")
	if dir == "" {
		return
	}
	src, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("docimg %s: %v", name, err)
	}
	b := src.Bounds()
	out := src
	if b.Dx() > maxWidth {
		dst := image.NewRGBA(image.Rect(0, 0, maxWidth, b.Dy()*maxWidth/b.Dx()))
		draw.CatmullRom.Scale(dst, dst.Bounds(), src, b, draw.Src, nil)
		out = dst
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&buf, out); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes)", filepath.Join(dir, name), buf.Len())
}
