package recordings

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/color/palette"
	"image/gif"
	"image/jpeg"
	"testing"

	"golang.org/x/image/draw"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// gifAtOnce is the GIF export as image/gif writes a whole animation: every
// frame in memory, then encoded together.
func gifAtOnce(t *testing.T, r *Recording) []byte {
	t.Helper()
	anim := &gif.GIF{}
	if _, err := r.frames(context.Background(), maxGIFWidth, func(img image.Image) error {
		b := img.Bounds()
		p := ditherPlan9(img)
		anim.Image = append(anim.Image, p)
		anim.Delay = append(anim.Delay, gifDelay)
		anim.Config.Width = max(anim.Config.Width, b.Dx())
		anim.Config.Height = max(anim.Config.Height, b.Dy())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := gif.EncodeAll(&buf, anim); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// recordFrames writes a recording whose steps have screenshots of the
// given sizes (width, height), each a different colour.
func recordFrames(t *testing.T, id string, sizes [][2]int) *Recording {
	t.Helper()
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(Manifest{ID: id, Question: "q"})
	if err != nil {
		t.Fatal(err)
	}
	shots := map[[2]int][]byte{}
	for i, size := range sizes {
		shot, ok := shots[size]
		if !ok {
			shot = testImage(t, size[0], size[1], color.RGBA{uint8(40 * i), 120, uint8(255 - 30*i), 255}, "png")
			shots[size] = shot
		}
		if err := w.Append(Step{N: i, Width: size[0], Height: size[1], Scale: 1}, shot, "png"); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(nil); err != nil {
		t.Fatal(err)
	}
	r, err := s.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The GIF export, written frame by frame, is byte for byte the file
// image/gif writes for the whole animation at once: frames of several
// sizes (the screen is the largest, after scaling to maxGIFWidth), one
// frame (no loop extension), many.
func TestGIFFrameByFrame(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		sizes [][2]int
	}{
		{"one frame", [][2]int{{800, 600}}},
		{"sizes", [][2]int{{800, 600}, {1280, 2400}, {320, 200}, {640, 480}, {641, 3}}},
		{"many", func() (s [][2]int) {
			for i := range 30 {
				s = append(s, [2]int{200 + 10*i, 100 + 5*i})
			}
			return s
		}()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := recordFrames(t, "g", c.sizes)
			var got bytes.Buffer
			if _, err := r.Export(context.Background(), FormatGIF, &got); err != nil {
				t.Fatal(err)
			}
			want := gifAtOnce(t, r)
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("%d bytes written frame by frame differ from the %d of the whole animation", got.Len(), len(want))
			}
			g, err := gif.DecodeAll(bytes.NewReader(got.Bytes()))
			if err != nil || len(g.Image) != len(c.sizes) {
				t.Fatalf("decode: %v, %d frames", err, len(g.Image))
			}
		})
	}
}

// A long recording's GIF export holds one frame at a time: its heap stays
// far below the frames' total, which the whole-animation encoder holds
// (TestGIFFrameByFrame checks the bytes).
func TestGIFExportMemory(t *testing.T) {
	const frames, w, h = 80, 640, 800 // 512 KB a paletted frame: 40 MB in all
	sizes := make([][2]int, frames)
	for i := range sizes {
		sizes[i] = [2]int{w, h}
	}
	r := recordFrames(t, "long", sizes)
	heapPeak := testenv.HeapPeak()
	var n countWriter
	_, err := r.Export(context.Background(), FormatGIF, &n)
	grew := heapPeak()
	if err != nil || n == 0 {
		t.Fatalf("export: %d bytes, %v", n, err)
	}
	if total := int64(frames * w * h); grew > total/4 {
		t.Errorf("heap grew by %d MB exporting %d frames of %d KB each", grew>>20, frames, w*h>>10)
	}
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}

// Dithering onto the Plan 9 palette keeps a colour the palette has as it
// is, and the colours of a region on average, whatever the source image
// type.
func TestDitherPlan9(t *testing.T) {
	t.Parallel()
	const w, h = 96, 64
	flat := image.NewRGBA(image.Rect(0, 0, w, h))
	inPalette := palette.Plan9[77]
	for y := range h {
		for x := range w {
			flat.Set(x, y, inPalette)
		}
	}
	gradient := image.NewRGBA(image.Rect(10, 20, 10+w, 20+h)) // not at the origin
	for y := range h {
		for x := range w {
			gradient.Set(10+x, 20+y, color.RGBA{uint8(x * 255 / w), uint8(y * 255 / h), uint8((x + y) * 2), 255})
		}
	}
	var jb bytes.Buffer
	if err := jpeg.Encode(&jb, gradient, &jpeg.Options{Quality: 95}); err != nil {
		t.Fatal(err)
	}
	ycc, err := jpeg.Decode(&jb) // *image.YCbCr
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		img  image.Image
	}{{"flat colour of the palette", flat}, {"gradient", gradient}, {"gradient as decoded from JPEG", ycc}} {
		t.Run(c.name, func(t *testing.T) {
			p := ditherPlan9(c.img)
			if p.Rect != image.Rect(0, 0, w, h) {
				t.Fatalf("bounds %v", p.Rect)
			}
			if c.img == image.Image(flat) {
				want := uint8(color.Palette(palette.Plan9).Index(inPalette))
				for i, v := range p.Pix {
					if v != want {
						t.Fatalf("pixel %d is entry %d, want %d", i, v, want)
					}
				}
				return
			}
			// Each 8×8 block averages to about its source's colour, as
			// closely as image/draw's Floyd-Steinberg does (on the
			// gradient: 11 at worst, 0.70 on average).
			b := c.img.Bounds()
			worst, sum, n := 0, 0, 0
			for by := 0; by < h; by += 8 {
				for bx := 0; bx < w; bx += 8 {
					var src, got [3]int
					for y := by; y < by+8; y++ {
						for x := bx; x < bx+8; x++ {
							r, g, bl, _ := c.img.At(b.Min.X+x, b.Min.Y+y).RGBA()
							src[0], src[1], src[2] = src[0]+int(r>>8), src[1]+int(g>>8), src[2]+int(bl>>8)
							r, g, bl, _ = p.At(x, y).RGBA()
							got[0], got[1], got[2] = got[0]+int(r>>8), got[1]+int(g>>8), got[2]+int(bl>>8)
						}
					}
					for k := range 3 {
						d := (src[k] - got[k]) / 64
						d = max(d, -d)
						worst, sum, n = max(worst, d), sum+d, n+1
					}
				}
			}
			if mean := float64(sum) / float64(n); worst > 14 || mean > 1.2 {
				t.Errorf("8×8 block means off their source's by %d at worst, %.2f on average", worst, mean)
			}
		})
	}
}

// BenchmarkDither: one 640×400 frame onto the Plan 9 palette, with the
// table (ditherPlan9) and with image/draw's Floyd-Steinberg, which
// searches the palette for every pixel.
func BenchmarkDither(b *testing.B) {
	src := image.NewRGBA(image.Rect(0, 0, 640, 400))
	for y := range 400 {
		for x := range 640 {
			src.Set(x, y, color.RGBA{uint8(x), uint8(y), uint8(x + y), 255})
		}
	}
	b.Run("table", func(b *testing.B) {
		for b.Loop() {
			ditherPlan9(src)
		}
	})
	b.Run("image-draw", func(b *testing.B) {
		for b.Loop() {
			p := image.NewPaletted(src.Bounds(), palette.Plan9)
			draw.FloydSteinberg.Draw(p, p.Bounds(), src, image.Point{})
		}
	})
}
