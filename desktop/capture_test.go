package desktop

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"testing"

	"github.com/jezek/xgb/xproto"

	"github.com/orchard/orchard/faults"
)

// Screenshots decode in the format asked for, at the size asked for, and
// show what is on the screen.
func TestScreenshotFormats(t *testing.T) {
	s := sharedSession(t)
	// A red probe window, to check the colours survive the conversion.
	pr := newProbe(t, s, image.Rect(40, 600, 140, 700), 0)
	if err := xproto.ChangeWindowAttributesChecked(pr.c, pr.win, xproto.CwBackPixel, []uint32{0xff0000}).Check(); err != nil {
		t.Fatal(err)
	}
	if err := xproto.ClearAreaChecked(pr.c, false, pr.win, 0, 0, 0, 0).Check(); err != nil {
		t.Fatal(err)
	}
	var lastID int64
	for _, tc := range []struct {
		o      ShotOptions
		format string
		w, h   int
		scale  float64
	}{
		{ShotOptions{}, FormatPNG, 1024, 768, 1},
		{ShotOptions{Format: "png", Width: 512}, FormatPNG, 512, 384, 0.5},
		{ShotOptions{Format: "jpeg"}, FormatJPEG, 1024, 768, 1},
		{ShotOptions{Format: "jpg", Quality: 50, Width: 640}, FormatJPEG, 640, 480, 0.625},
		{ShotOptions{Format: "jpeg", Height: 384}, FormatJPEG, 512, 384, 0.5},
		{ShotOptions{Format: "jpeg", Width: 800, Height: 300}, FormatJPEG, 400, 300, 400.0 / 1024},
		{ShotOptions{Format: "png", Width: 4096}, FormatPNG, 1024, 768, 1}, // never scaled up
	} {
		shot, err := s.Screenshot(ctxT(t), tc.o)
		if err != nil {
			t.Fatalf("%+v: %v", tc.o, err)
		}
		if shot.Format != tc.format || shot.Width != tc.w || shot.Height != tc.h || shot.Scale != tc.scale ||
			shot.ScreenWidth != 1024 || shot.ScreenHeight != 768 {
			t.Errorf("%+v: got %s %dx%d scale %v of %dx%d; want %s %dx%d scale %v",
				tc.o, shot.Format, shot.Width, shot.Height, shot.Scale, shot.ScreenWidth, shot.ScreenHeight,
				tc.format, tc.w, tc.h, tc.scale)
		}
		if shot.ID <= lastID {
			t.Errorf("frame id %d after %d: want increasing", shot.ID, lastID)
		}
		lastID = shot.ID
		var img image.Image
		if tc.format == FormatPNG {
			img, err = png.Decode(bytes.NewReader(shot.Data))
		} else {
			img, err = jpeg.Decode(bytes.NewReader(shot.Data))
		}
		if err != nil {
			t.Fatalf("%+v: decode: %v", tc.o, err)
		}
		if b := img.Bounds(); b.Dx() != tc.w || b.Dy() != tc.h {
			t.Errorf("%+v: decoded %v, want %dx%d", tc.o, b, tc.w, tc.h)
		}
		// The middle of the red window, mapped into the shot.
		x, y := shot.FromScreen(image.Pt(90, 650))
		r, g, b, _ := color.RGBAModel.Convert(img.At(int(x), int(y))).(color.RGBA).RGBA()
		if r>>8 < 200 || g>>8 > 60 || b>>8 > 60 {
			t.Errorf("%+v: pixel at the red window is %d,%d,%d", tc.o, r>>8, g>>8, b>>8)
		}
	}
	for _, bad := range []ShotOptions{{Format: "gif"}, {Quality: 101}, {Width: -1}} {
		_, err := s.Screenshot(ctxT(t), bad)
		if fe := faults.Of(err); err == nil || fe.Code != faults.CodeActionInvalid {
			t.Errorf("%+v: %v, want action.invalid", bad, err)
		}
	}
}

// Plain GetImage and MIT-SHM read the same pixels.
func TestCaptureShmMatchesPlain(t *testing.T) {
	s := sharedSession(t)
	a := image.NewRGBA(image.Rect(0, 0, 1024, 768))
	b := image.NewRGBA(image.Rect(0, 0, 1024, 768))
	var shm bool
	err := s.withX(ctxT(t), "capture", 0, func(_ context.Context, x *xconn) error {
		shm = x.shm != nil
		if err := x.capture(a, false); err != nil {
			return err
		}
		return x.capture(b, true)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !shm {
		t.Error("MIT-SHM is not in use")
	}
	if !bytes.Equal(a.Pix, b.Pix) {
		t.Error("MIT-SHM and GetImage captures differ")
	}
}

func TestFrameMapping(t *testing.T) {
	t.Parallel()
	f := Frame{Scale: 0.5, Width: 640, Height: 400, ScreenWidth: 1280, ScreenHeight: 800}
	for _, tc := range []struct {
		x, y float64
		want image.Point
	}{
		{0, 0, image.Pt(0, 0)}, {100, 100, image.Pt(200, 200)}, {639.9, 399.9, image.Pt(1279, 799)},
		{640, 400, image.Pt(1279, 799)}, {0.4, 0.6, image.Pt(0, 1)},
	} {
		if got := f.ToScreen(tc.x, tc.y); got != tc.want {
			t.Errorf("ToScreen(%v, %v) = %v, want %v", tc.x, tc.y, got, tc.want)
		}
	}
	if x, y := f.FromScreen(image.Pt(200, 300)); x != 100 || y != 150 {
		t.Errorf("FromScreen(200, 300) = %v, %v", x, y)
	}
	for _, tc := range []struct{ w, h, mw, mh, ww, wh int }{
		{1280, 800, 640, 0, 640, 400}, {1280, 800, 0, 0, 1280, 800}, {1280, 800, 2000, 0, 1280, 800},
		{1280, 800, 1024, 768, 1024, 640}, {1366, 768, 1024, 0, 1024, 576}, {1024, 768, 0, 100, 133, 100},
	} {
		w, h, _ := fitSize(tc.w, tc.h, tc.mw, tc.mh)
		if w != tc.ww || h != tc.wh {
			t.Errorf("fitSize(%dx%d in %dx%d) = %dx%d, want %dx%d", tc.w, tc.h, tc.mw, tc.mh, w, h, tc.ww, tc.wh)
		}
	}
}

// A screen pixel mapped into a frame (the cursor_position answer) maps
// back to itself (the mouse_move of that answer), whatever the scale.
func TestFrameRoundTrip(t *testing.T) {
	t.Parallel()
	for _, sc := range []image.Point{{1920, 1080}, {1280, 800}, {1024, 768}, {1001, 751}} {
		for mw := 64; mw < sc.X; mw += 7 {
			w, h, _ := fitSize(sc.X, sc.Y, mw, 0)
			f := Frame{Width: w, Height: h, ScreenWidth: sc.X, ScreenHeight: sc.Y}
			for i := range max(sc.X, sc.Y) {
				p := image.Pt(i%sc.X, i%sc.Y)
				if x, y := f.FromScreen(p); f.ToScreen(x, y) != p {
					t.Fatalf("screen %v, frame %dx%d: %v -> (%v, %v) -> %v", sc, w, h, p, x, y, f.ToScreen(x, y))
				}
			}
		}
	}
}

func TestToRGBA(t *testing.T) {
	t.Parallel()
	src := []byte{0x10, 0x20, 0x30, 0x00, 0xff, 0x00, 0x80, 0x7f}
	dst := make([]byte, len(src))
	toRGBA(dst, src, true)
	if want := []byte{0x30, 0x20, 0x10, 0xff, 0x80, 0x00, 0xff, 0xff}; !bytes.Equal(dst, want) {
		t.Errorf("BGRX → RGBA: %x, want %x", dst, want)
	}
	toRGBA(dst, []byte{0x00, 0x30, 0x20, 0x10}, false)
	if want := []byte{0x30, 0x20, 0x10, 0xff}; !bytes.Equal(dst[:4], want) {
		t.Errorf("XRGB → RGBA: %x, want %x", dst[:4], want)
	}
	// Large buffers are split over the cores; every pixel is converted.
	n := parallelMin*2 + 3
	big, out := make([]byte, n*4), make([]byte, n*4)
	for i := range n {
		big[i*4], big[i*4+2] = byte(i), byte(i>>8)
	}
	toRGBA(out, big, true)
	for i := range n {
		if out[i*4] != byte(i>>8) || out[i*4+2] != byte(i) || out[i*4+3] != 0xff {
			t.Fatalf("pixel %d: %x", i, out[i*4:i*4+4])
		}
	}
}

// A screenshot fits the size asked for also when one side of the scaled
// image rounds back to the screen's: a tall, narrow screen bounded to one
// pixel less than its height.
func TestScreenshotFitsTightBound(t *testing.T) {
	t.Parallel()
	s := startSession(t, Options{Width: 100, Height: 300, WindowManager: "none"})
	shot, err := s.Screenshot(ctxT(t), ShotOptions{Height: 299})
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot.Data))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dy() > 299 || shot.Height > 299 || b.Dx() != shot.Width || b.Dy() != shot.Height || shot.Scale >= 1 {
		t.Errorf("screenshot of a 100x300 screen within height 299: image %v, frame %dx%d at scale %v",
			b.Size(), shot.Width, shot.Height, shot.Scale)
	}
}
