package desktop

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// benchSession starts a 1280x800 desktop showing a web page in chromium
// when it is installed (what agents mostly look at), else a synthetic
// document image (text-sized strokes in lines, a toolbar, a picture), so
// the encoders see about what a page gives them, not a blank screen.
func benchSession(b *testing.B) *Session {
	b.Helper()
	if chromium, ok := testenv.HeadedChromiumPath(); ok {
		page := filepath.Join(b.TempDir(), "page.html")
		if err := os.WriteFile(page, []byte(benchPage()), 0o644); err != nil {
			b.Fatal(err)
		}
		s := startSession(b, Options{Width: 1280, Height: 800, Apps: []string{AppChromium},
			ChromiumPath: chromium, ChromiumArgs: []string{"file://" + page}})
		if waitPage(b, s) {
			return s
		}
		b.Log("chromium did not draw the page within 30 s; using a synthetic image")
		s.Close()
	}
	s := startSession(b, Options{Width: 1280, Height: 800, WindowManager: "none"})
	paint(b, s, documentImage(1280, 800))
	return s
}

// benchPage is a text-heavy page: headings, paragraphs, a table.
func benchPage() string {
	words := strings.Fields("the quick brown fox jumps over a lazy dog while agents click buttons " +
		"and read long paragraphs of text about sandboxes screenshots frames and encoders")
	r := rand.New(rand.NewPCG(1, 2))
	var sb strings.Builder
	sb.WriteString(`<html><body style="font-family:sans-serif;margin:0">` +
		`<div style="background:#36c;color:#fff;padding:12px;font-size:22px">Orchard benchmark page</div>` +
		`<div style="display:flex"><div style="width:220px;background:#eee;padding:8px">`)
	for i := range 20 {
		fmt.Fprintf(&sb, `<p><a href="#">Section %d</a></p>`, i)
	}
	sb.WriteString(`</div><div style="padding:16px;flex:1">`)
	for p := range 12 {
		fmt.Fprintf(&sb, "<h2>Heading %d</h2><p>", p)
		for range 80 {
			sb.WriteString(words[r.IntN(len(words))] + " ")
		}
		sb.WriteString("</p>")
	}
	sb.WriteString(`</div></div></body></html>`)
	return sb.String()
}

// waitPage waits until the page's blue title bar is on the screen and
// two captures 300 ms apart agree: the page has been drawn.
func waitPage(b *testing.B, s *Session) bool {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	var prev []byte
	for time.Now().Before(deadline) {
		img, err := s.CaptureInto(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		drawn := bytes.Count(img.Pix, []byte{0x33, 0x66, 0xcc, 0xff}) > 10000
		if drawn && bytes.Equal(img.Pix, prev) {
			return true
		}
		prev = img.Pix
		time.Sleep(300 * time.Millisecond)
	}
	return false
}

// paint shows img on the whole screen in a window of its own.
func paint(b *testing.B, s *Session, img *image.RGBA) {
	b.Helper()
	newCanvas(b, s, img.Rect).put(b, img, img.Rect)
}

// canvas is a window benchmarks draw pixels into.
type canvas struct {
	pr *probe
	gc xproto.Gcontext
}

func newCanvas(b *testing.B, s *Session, r image.Rectangle) *canvas {
	b.Helper()
	pr := newProbe(b, s, r, 0)
	gc, err := xproto.NewGcontextId(pr.c)
	if err != nil {
		b.Fatal(err)
	}
	if err := xproto.CreateGCChecked(pr.c, gc, xproto.Drawable(pr.win), 0, nil).Check(); err != nil {
		b.Fatal(err)
	}
	return &canvas{pr: pr, gc: gc}
}

// put draws img's pixels in r (window coordinates) and waits until the
// server has drawn them.
func (c *canvas) put(b *testing.B, img *image.RGBA, r image.Rectangle) {
	b.Helper()
	w := r.Dx()
	// Requests are limited to 256 KB without BIG-REQUESTS.
	rows := max(1, (1<<18-64)/(w*4))
	for y := r.Min.Y; y < r.Max.Y; y += rows {
		n := min(rows, r.Max.Y-y)
		data := make([]byte, 0, w*n*4)
		for yy := y; yy < y+n; yy++ {
			for x := r.Min.X; x < r.Max.X; x++ {
				c := img.RGBAAt(x, yy)
				data = append(data, c.B, c.G, c.R, 0)
			}
		}
		err := xproto.PutImageChecked(c.pr.c, xproto.ImageFormatZPixmap, xproto.Drawable(c.pr.win), c.gc,
			uint16(w), uint16(n), int16(r.Min.X), int16(y), 0, 24, data).Check()
		if err != nil {
			b.Fatal(err)
		}
	}
}

func documentImage(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = 0xff
	}
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(rect image.Rectangle, c [3]byte) {
		for y := rect.Min.Y; y < rect.Max.Y; y++ {
			for x := rect.Min.X; x < rect.Max.X; x++ {
				o := img.PixOffset(x, y)
				img.Pix[o], img.Pix[o+1], img.Pix[o+2] = c[0], c[1], c[2]
			}
		}
	}
	fill(image.Rect(0, 0, w, 60), [3]byte{0x33, 0x66, 0xcc}) // a toolbar
	fill(image.Rect(0, 60, 220, h), [3]byte{0xee, 0xee, 0xee})
	fill(image.Rect(900, 120, 1200, 420), [3]byte{0xcc, 0x44, 0x22}) // a picture
	for y := 90; y+12 < h; y += 18 {                                 // lines of text
		x := 240
		for x < 880 {
			word := 10 + r.IntN(50)
			for i := 0; i < word && x < 880; i += 3 {
				fill(image.Rect(x, y+r.IntN(4), x+1+r.IntN(2), y+8+r.IntN(4)), [3]byte{0x11, 0x11, 0x11})
				x += 3
			}
			x += 8
		}
	}
	return img
}

// BenchmarkCaptureRaw is the X side of a capture: the server writing the
// screen into shared memory, against sending it over the socket.
func BenchmarkCaptureRaw(b *testing.B) {
	requireX(b)
	s := benchSession(b)
	for _, mode := range []struct {
		name  string
		plain bool
	}{{"shm", false}, {"plain", true}} {
		b.Run(mode.name, func(b *testing.B) {
			err := s.withX(context.Background(), "bench", 0, func(_ context.Context, x *xconn) error {
				if x.shm == nil && !mode.plain {
					b.Skip("MIT-SHM unavailable")
				}
				for b.Loop() {
					if _, err := x.grab(mode.plain); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkCaptureRGBA is a capture through the session's X lock, with
// the conversion to RGBA.
func BenchmarkCaptureRGBA(b *testing.B) {
	requireX(b)
	s := benchSession(b)
	img := image.NewRGBA(image.Rect(0, 0, 1280, 800))
	for b.Loop() {
		if _, err := s.CaptureInto(context.Background(), img); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScreenshot is the whole screenshot path: capture, convert,
// scale, encode.
func BenchmarkScreenshot(b *testing.B) {
	requireX(b)
	s := benchSession(b)
	for _, tc := range []struct {
		name string
		o    ShotOptions
	}{
		{"png-bestspeed", ShotOptions{Format: FormatPNG}},
		{"jpeg-q80", ShotOptions{Format: FormatJPEG, Quality: 80}},
		{"jpeg-q80-640w", ShotOptions{Format: FormatJPEG, Quality: 80, Width: 640}},
		{"png-640w", ShotOptions{Format: FormatPNG, Width: 640}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var size int
			for b.Loop() {
				shot, err := s.Screenshot(context.Background(), tc.o)
				if err != nil {
					b.Fatal(err)
				}
				size = len(shot.Data)
			}
			b.ReportMetric(float64(size), "bytes/shot")
		})
	}
}

// BenchmarkScreenshotJPEG is the JPEG q80 screenshot path with the
// striped encoder (the default) against image/jpeg (Options.StdJPEG),
// alternating the two in each iteration so that a busy machine slows both
// alike, and reports each one's median. In full-repaint every stripe of
// the screen changes between frames (a document and its negative in
// turn); in line-change a line of text is drawn between frames, as an
// agent's step that prints a line in a terminal.
//
//	go test -run XXX -bench ScreenshotJPEG -benchtime 60x -count 3 ./desktop
func BenchmarkScreenshotJPEG(b *testing.B) {
	requireX(b)
	s := benchSession(b)
	doc := documentImage(1280, 800)
	neg := image.NewRGBA(doc.Rect)
	for i, v := range doc.Pix {
		neg.Pix[i] = ^v | byte(i%4/3*0xff) // alpha stays 255
	}
	cv := newCanvas(b, s, doc.Rect)
	cv.put(b, doc, doc.Rect)
	r := rand.New(rand.NewPCG(3, 4))
	line := image.NewRGBA(doc.Rect)
	for _, tc := range []struct {
		name   string
		change func(i int)
	}{
		{"full-repaint", func(i int) {
			cv.put(b, [2]*image.RGBA{neg, doc}[i%2], doc.Rect)
		}},
		{"line-change", func(i int) {
			y := 90 + 18*(i%38)
			lr := image.Rect(240, y, 880, y+14)
			for yy := lr.Min.Y; yy < lr.Max.Y; yy++ { // a white line
				for x := lr.Min.X; x < lr.Max.X; x++ {
					line.SetRGBA(x, yy, color.RGBA{0xff, 0xff, 0xff, 0xff})
				}
			}
			for x := lr.Min.X; x < lr.Max.X-4; { // words of glyph-sized strokes
				for range 2 + r.IntN(10) {
					top := y + 2 + r.IntN(4)
					for yy := top; yy < y+12; yy++ {
						line.SetRGBA(x, yy, color.RGBA{0x11, 0x11, 0x11, 0xff})
					}
					x += 3
				}
				x += 8
			}
			cv.put(b, line, lr)
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			o := ShotOptions{Format: FormatJPEG, Quality: 80}
			var took [2][]time.Duration // striped, image/jpeg
			var size [2]int
			i := 0
			for b.Loop() {
				b.StopTimer()
				tc.change(i)
				b.StartTimer()
				for k := range 2 {
					std := (i+k)%2 == 1
					s.opts.StdJPEG = std
					t0 := time.Now()
					shot, err := s.Screenshot(ctx, o)
					if err != nil {
						b.Fatal(err)
					}
					j := map[bool]int{false: 0, true: 1}[std]
					took[j] = append(took[j], time.Since(t0))
					size[j] = len(shot.Data)
				}
				i++
			}
			s.opts.StdJPEG = false
			ours, ref := p50(took[0]), p50(took[1])
			b.ReportMetric(ours, "ms-p50")
			b.ReportMetric(ref, "image/jpeg-ms-p50")
			b.ReportMetric(ours/ref, "ratio")
			b.ReportMetric(float64(size[0]), "bytes/shot")
			b.ReportMetric(float64(size[1]), "image/jpeg-bytes/shot")
		})
	}
}

// p50 is the median of d in milliseconds.
func p50(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Microseconds()) / 1000
}

// BenchmarkDownscale is the scaling step alone, 1280x800 → 640x400.
func BenchmarkDownscale(b *testing.B) {
	img := documentImage(1280, 800)
	for b.Loop() {
		downscale(img, 640, 400)
	}
}

// BenchmarkClick is a click as the API runs it: move, press, release and
// the round trip that waits for the server to process them.
func BenchmarkClick(b *testing.B) {
	requireX(b)
	s := benchSession(b)
	i := 0
	for b.Loop() {
		i++
		if err := s.Click(context.Background(), image.Pt(300+i%400, 300), ButtonLeft, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKey is one key press and release with its round trip.
func BenchmarkKey(b *testing.B) {
	requireX(b)
	s := benchSession(b)
	for b.Loop() {
		if err := s.Key(context.Background(), "shift"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkToRGBA is the pixel conversion alone, on one core and split
// over all of them.
func BenchmarkToRGBA(b *testing.B) {
	src := make([]byte, 1280*800*4)
	dst := make([]byte, len(src))
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			convertRange(dst, src, true)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		for b.Loop() {
			toRGBA(dst, src, true)
		}
	})
}

// BenchmarkAgainstTools runs the X tools agents otherwise spawn per
// action, in the same run as ours: xwd and ImageMagick's import for a
// screenshot, xdotool for a click. Each is skipped when not installed.
//
//	go test -run XXX -bench 'AgainstTools|Screenshot|Click' -benchtime 30x -count 3 ./desktop
func BenchmarkAgainstTools(b *testing.B) {
	s := benchSession(b)
	env := append(os.Environ(), "DISPLAY="+s.Display())
	ctx := context.Background()
	tools := []struct {
		name string
		argv []string
	}{
		{"xwd-root", []string{"xwd", "-root", "-silent", "-out", "/dev/null"}},
		{"import-jpeg", []string{"import", "-window", "root", "-quality", "80", "jpeg:/dev/null"}},
		{"xdotool-click", []string{"xdotool", "mousemove", "640", "400", "click", "1"}},
	}
	for _, tool := range tools {
		b.Run(tool.name, func(b *testing.B) {
			if _, err := exec.LookPath(tool.argv[0]); err != nil {
				b.Skipf("%s not installed", tool.argv[0])
			}
			for b.Loop() {
				cmd := exec.Command(tool.argv[0], tool.argv[1:]...)
				cmd.Env = env
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%v: %s", err, out)
				}
			}
		})
	}
	b.Run("ours-jpeg", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Screenshot(ctx, ShotOptions{Format: FormatJPEG, Quality: 80}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ours-click", func(b *testing.B) {
		for b.Loop() {
			if err := s.Click(ctx, image.Pt(640, 400), ButtonLeft, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}
