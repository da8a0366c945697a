// Package pixels compares screenshots pixel by pixel for tests.
package pixels

import (
	"bytes"
	"image"
	"image/draw"
	_ "image/jpeg" // screenshots are JPEG or PNG
	_ "image/png"
	"testing"
)

// Decode decodes an encoded image (JPEG or PNG) to RGBA.
func Decode(t testing.TB, data []byte) *image.RGBA {
	t.Helper()
	img, _, err := image.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("decode screenshot: %v", err)
	}
	out := image.NewRGBA(img.Bounds())
	draw.Draw(out, out.Bounds(), img, img.Bounds().Min, draw.Src)
	return out
}

// Differing counts the pixels whose colour differs between a and b; all of
// them when their sizes differ.
func Differing(a, b *image.RGBA) int {
	if a.Bounds() != b.Bounds() {
		return a.Bounds().Dx() * a.Bounds().Dy()
	}
	n := 0
	for i := 0; i < len(a.Pix); i += 4 {
		if a.Pix[i] != b.Pix[i] || a.Pix[i+1] != b.Pix[i+1] || a.Pix[i+2] != b.Pix[i+2] {
			n++
		}
	}
	return n
}
