package jpegenc

import (
	"bytes"
	"fmt"
	"image"
	"image/jpeg"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// Screens like the ones agents see: a terminal's text, a photo-like
// gradient, a busy desktop (windows, text, icons, a picture).
func terminal(w, h int) *image.RGBA {
	img := solid(w, h, [3]byte{0, 0, 0})
	r := rand.New(rand.NewPCG(3, 4))
	for y := 4; y+13 < h; y += 15 { // 7x13 glyph cells
		for x := 2; x+7 < w && r.IntN(60) > 0; x += 7 {
			for range 12 {
				px, py := x+r.IntN(6), y+r.IntN(12)
				set(img, px, py, [3]byte{0xe0, 0xe0, 0xe0})
			}
		}
	}
	return img
}

func gradient(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	r := rand.New(rand.NewPCG(5, 6))
	for y := range h {
		for x := range w {
			fx, fy := float64(x)/float64(w), float64(y)/float64(h)
			n := r.IntN(9) - 4
			set(img, x, y, [3]byte{
				clamp(255*fx + 40*math.Sin(fy*9) + float64(n)),
				clamp(255*fy + 30*math.Cos(fx*7) + float64(n)),
				clamp(128 + 100*math.Sin((fx+fy)*5) + float64(n)),
			})
		}
	}
	return img
}

func desktop(w, h int) *image.RGBA {
	img := solid(w, h, [3]byte{0x2e, 0x5e, 0x8c})
	r := rand.New(rand.NewPCG(7, 8))
	g := gradient(w, h)
	for i := range 6 {
		x0, y0 := r.IntN(w*3/4+1), r.IntN(h*3/4+1)
		x1, y1 := min(w, x0+w/4+r.IntN(w/3+1)), min(h, y0+h/4+r.IntN(h/3+1))
		fill(img, image.Rect(x0, y0, x1, y1), [3]byte{0xf0, 0xf0, 0xf0})
		fill(img, image.Rect(x0, y0, x1, min(y1, y0+22)), [3]byte{byte(40 * i), 0x60, 0xa0})
		for y := y0 + 30; y+10 < y1; y += 14 {
			for x := x0 + 6; x+4 < x1 && r.IntN(50) > 0; x += 3 {
				fill(img, image.Rect(x, y+r.IntN(3), x+1, y+7+r.IntN(3)), [3]byte{0x20, 0x20, 0x20})
			}
		}
	}
	for y := h / 2; y < h*3/4; y++ { // a picture
		for x := w / 2; x < w*3/4; x++ {
			o := img.PixOffset(x, y)
			copy(img.Pix[o:o+4], g.Pix[o:o+4])
		}
	}
	return img
}

func solid(w, h int, c [3]byte) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	fill(img, img.Rect, c)
	return img
}

func fill(img *image.RGBA, r image.Rectangle, c [3]byte) {
	r = r.Intersect(img.Rect)
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			set(img, x, y, c)
		}
	}
}

func set(img *image.RGBA, x, y int, c [3]byte) {
	o := img.PixOffset(x, y)
	img.Pix[o], img.Pix[o+1], img.Pix[o+2], img.Pix[o+3] = c[0], c[1], c[2], 0xff
}

func clamp(v float64) byte { return byte(min(max(v, 0), 255)) }

// psnr is the peak signal-to-noise ratio of the decoded data against src,
// over the three colour channels.
func psnr(t testing.TB, src *image.RGBA, data []byte) float64 {
	t.Helper()
	dec, err := jpeg.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if dec.Bounds().Size() != src.Rect.Size() {
		t.Fatalf("decoded %v, want %v", dec.Bounds().Size(), src.Rect.Size())
	}
	var sum float64
	b := dec.Bounds()
	for y := range src.Rect.Dy() {
		for x := range src.Rect.Dx() {
			r, g, bl, _ := dec.At(b.Min.X+x, b.Min.Y+y).RGBA()
			o := src.PixOffset(src.Rect.Min.X+x, src.Rect.Min.Y+y)
			for i, v := range []uint32{r >> 8, g >> 8, bl >> 8} {
				d := float64(v) - float64(src.Pix[o+i])
				sum += d * d
			}
		}
	}
	mse := sum / float64(3*src.Rect.Dx()*src.Rect.Dy())
	if mse == 0 {
		return 99
	}
	return 10 * math.Log10(255*255/mse)
}

func encode(t testing.TB, img *image.RGBA, q int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := Encode(&b, img, q); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestQuality compares the output with image/jpeg's at the same quality:
// PSNR against the source pixels no more than 0.1 dB below the
// reference's, and at most 3 % more bytes.
func TestQuality(t *testing.T) {
	t.Parallel()
	screens := map[string]*image.RGBA{
		"terminal": terminal(1280, 800), "gradient": gradient(1280, 800), "desktop": desktop(1280, 800),
		"desktop-odd": desktop(333, 201),
	}
	for name, img := range screens {
		for _, q := range []int{30, 80, 95} {
			t.Run(fmt.Sprintf("%s/q%d", name, q), func(t *testing.T) {
				t.Parallel()
				var ref bytes.Buffer
				if err := jpeg.Encode(&ref, img, &jpeg.Options{Quality: q}); err != nil {
					t.Fatal(err)
				}
				ours := encode(t, img, q)
				pr, po := psnr(t, img, ref.Bytes()), psnr(t, img, ours)
				t.Logf("PSNR %.2f dB (image/jpeg %.2f), %d bytes (image/jpeg %d)", po, pr, len(ours), ref.Len())
				if po < pr-0.1 {
					t.Errorf("PSNR %.2f dB, image/jpeg's %.2f", po, pr)
				}
				if float64(len(ours)) > 1.03*float64(ref.Len()) {
					t.Errorf("%d bytes, image/jpeg's %d", len(ours), ref.Len())
				}
			})
		}
	}
}

// TestSizes encodes odd and tiny sizes, as sub-images, and checks each
// decodes to the source's size, its pixels as close to the source as
// image/jpeg's (0.5 dB: in a few pixels, one differs more).
func TestSizes(t *testing.T) {
	t.Parallel()
	for _, sz := range []image.Point{{1, 1}, {2, 3}, {7, 7}, {8, 8}, {15, 17}, {16, 16}, {17, 1}, {1, 33}, {31, 47}, {129, 65}} {
		t.Run(fmt.Sprint(sz), func(t *testing.T) {
			t.Parallel()
			img := desktop(max(sz.X, 4), max(sz.Y, 4)).SubImage(image.Rect(1, 2, 1+sz.X, 2+sz.Y)).(*image.RGBA)
			if img.Rect.Dx() != sz.X || img.Rect.Dy() != sz.Y {
				img = gradient(sz.X, sz.Y)
			}
			var ref bytes.Buffer
			if err := jpeg.Encode(&ref, img, &jpeg.Options{Quality: 90}); err != nil {
				t.Fatal(err)
			}
			if po, pr := psnr(t, img, encode(t, img, 90)), psnr(t, img, ref.Bytes()); po < pr-0.5 {
				t.Errorf("PSNR %.2f dB, image/jpeg's %.2f", po, pr)
			}
		})
	}
	for _, bad := range []image.Rectangle{image.Rect(0, 0, 0, 5), image.Rect(0, 0, 1<<16, 1)} {
		if err := Encode(&bytes.Buffer{}, &image.RGBA{Rect: bad}, 80); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// segments splits a JPEG at its restart markers: the scan's segments,
// one per stripe.
func segments(t *testing.T, data []byte) [][]byte {
	t.Helper()
	sos := bytes.Index(data, []byte{0xff, 0xda})
	scan := data[sos+14 : len(data)-2]
	var segs [][]byte
	start := 0
	for i := 0; i+1 < len(scan); i++ {
		if scan[i] == 0xff && scan[i+1] >= 0xd0 && scan[i+1] <= 0xd7 {
			if want := byte(0xd0 + len(segs)%8); scan[i+1] != want {
				t.Fatalf("restart marker %#x, want %#x", scan[i+1], want)
			}
			segs = append(segs, scan[start:i])
			start = i + 2
		}
	}
	return append(segs, scan[start:])
}

// TestReuse changes one pixel of one stripe between two frames: the
// output differs in that stripe only, equals a fresh encoding byte for
// byte, and decodes.
func TestReuse(t *testing.T) {
	t.Parallel()
	img := desktop(1280, 800)
	var e Encoder
	first := new(bytes.Buffer)
	if err := e.Encode(first, img, 80); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.Bytes(), encode(t, img, 80)) {
		t.Fatal("first frame differs from a fresh encoding")
	}
	for _, y := range []int{0, 17, 400, 799} {
		set(img, 640, y, [3]byte{0xff, 0, 0xff})
		next := new(bytes.Buffer)
		if err := e.Encode(next, img, 80); err != nil {
			t.Fatal(err)
		}
		if got := e.Reused(); got != 49 {
			t.Errorf("row %d: %d stripes reused, want 49", y, got)
		}
		if !bytes.Equal(next.Bytes(), encode(t, img, 80)) {
			t.Fatalf("row %d: output differs from a fresh encoding", y)
		}
		a, b := segments(t, first.Bytes()), segments(t, next.Bytes())
		if len(a) != 50 || len(b) != 50 {
			t.Fatalf("%d and %d segments, want 50", len(a), len(b))
		}
		for i := range a {
			if changed := !bytes.Equal(a[i], b[i]); changed != (i == y/16) {
				t.Errorf("row %d: stripe %d changed %v", y, i, changed)
			}
		}
		psnr(t, img, next.Bytes())
		first = next
	}
	// Another quality or size starts over, and back again too.
	small := img.SubImage(image.Rect(0, 0, 640, 400)).(*image.RGBA)
	for _, c := range []struct {
		img *image.RGBA
		q   int
	}{{img, 70}, {small, 70}, {img, 70}, {img, 70}} {
		var b bytes.Buffer
		if err := e.Encode(&b, c.img, c.q); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), encode(t, c.img, c.q)) {
			t.Errorf("%v q%d: output differs from a fresh encoding", c.img.Rect, c.q)
		}
	}
	if got := e.Reused(); got != 50 {
		t.Errorf("same frame again: %d stripes reused, want 50", got)
	}
}

// TestDjpeg decodes the output with libjpeg-turbo's djpeg when it is
// installed: a second decoder that is strict about restart markers.
func TestDjpeg(t *testing.T) {
	t.Parallel()
	djpeg, err := exec.LookPath("djpeg")
	testenv.Require(t, "djpeg", err == nil, "djpeg not installed (apt-get install libjpeg-turbo-progs)")
	for _, img := range []*image.RGBA{desktop(1280, 800), terminal(333, 17), gradient(1, 1)} {
		f := filepath.Join(t.TempDir(), "a.jpg")
		if err := os.WriteFile(f, encode(t, img, 80), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(djpeg, "-strict", "-ppm", f).CombinedOutput()
		if err != nil {
			t.Fatalf("djpeg: %v: %.200s", err, out)
		}
		want := fmt.Sprintf("P6\n%d %d\n255\n", img.Rect.Dx(), img.Rect.Dy())
		if !bytes.HasPrefix(out, []byte(want)) || len(out) != len(want)+3*img.Rect.Dx()*img.Rect.Dy() {
			t.Errorf("djpeg output %.40q, %d bytes", out, len(out))
		}
	}
}

func FuzzEncode(f *testing.F) {
	f.Add(uint16(1), uint16(1), uint8(80), []byte{1, 2, 3})
	f.Add(uint16(33), uint16(17), uint8(1), []byte{0xff, 0})
	f.Fuzz(func(t *testing.T, w, h uint16, q uint8, seed []byte) {
		w, h = w%300+1, h%300+1
		img := image.NewRGBA(image.Rect(0, 0, int(w), int(h)))
		for i := range img.Pix {
			if len(seed) > 0 {
				img.Pix[i] = seed[i%len(seed)] + byte(i/len(seed))
			}
		}
		var b bytes.Buffer
		if err := Encode(&b, img, int(q)%100+1); err != nil {
			t.Fatal(err)
		}
		dec, err := jpeg.Decode(&b)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Bounds().Size() != img.Rect.Size() {
			t.Fatalf("decoded %v", dec.Bounds())
		}
	})
}

// BenchmarkEncode alternates this package's encoder and image/jpeg on the
// same 1280x800 image and reports each one's median, so that a busy
// machine slows both alike.
//
//	go test -run XXX -bench Encode -benchtime 60x -cpu 1,2 ./internal/jpegenc
func BenchmarkEncode(b *testing.B) {
	for _, screen := range []struct {
		name string
		img  *image.RGBA
	}{{"terminal", terminal(1280, 800)}, {"gradient", gradient(1280, 800)}, {"desktop", desktop(1280, 800)}} {
		b.Run(screen.name, func(b *testing.B) {
			var ours, ref []time.Duration
			for b.Loop() {
				t0 := time.Now()
				Encode(io.Discard, screen.img, 80)
				t1 := time.Now()
				jpeg.Encode(io.Discard, screen.img, &jpeg.Options{Quality: 80})
				ours, ref = append(ours, t1.Sub(t0)), append(ref, time.Since(t1))
			}
			o, r := median(ours), median(ref)
			b.ReportMetric(o, "ms-p50")
			b.ReportMetric(r, "image/jpeg-ms-p50")
			b.ReportMetric(o/r, "ratio")
		})
	}
}

func median(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Microseconds()) / 1000
}
