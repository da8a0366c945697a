package desktop

import (
	"bytes"
	"image"
	"image/jpeg"
	"math"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/jpegenc"
)

// JPEG screenshots of a real screen (openbox and an xterm) decode to
// pixels as close to the screen's as image/jpeg's at the same quality,
// and a screenshot after a line is typed re-encodes only the stripes the
// line changed.
func TestScreenshotJPEG(t *testing.T) {
	s := sharedSession(t)
	ctx := ctxT(t)
	if err := s.Type(ctx, "echo striped jpeg\n"); err != nil {
		t.Fatal(err)
	}
	img, err := s.CaptureInto(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []int{50, 80, 95} {
		var ours, ref bytes.Buffer
		if err := jpegenc.Encode(&ours, img, q); err != nil {
			t.Fatal(err)
		}
		if err := jpeg.Encode(&ref, img, &jpeg.Options{Quality: q}); err != nil {
			t.Fatal(err)
		}
		po, pr := psnr(t, img, ours.Bytes()), psnr(t, img, ref.Bytes())
		t.Logf("q%d: PSNR %.2f dB (image/jpeg %.2f), %d bytes (image/jpeg %d)", q, po, pr, ours.Len(), ref.Len())
		// Within 0.2 dB (5 % more squared error). At q95, where most
		// quantiser steps are 1 or 2, the float DCT's rounding against
		// image/jpeg's integer one moves PSNR either way by up to about
		// 0.1 dB depending on what the screen shows.
		if po < pr-0.2 || ours.Len() > ref.Len()*103/100 {
			t.Errorf("q%d: PSNR %.2f dB and %d bytes; image/jpeg %.2f dB and %d bytes", q, po, ours.Len(), pr, ref.Len())
		}
	}

	o := ShotOptions{Format: FormatJPEG}
	if _, err := s.Screenshot(ctx, o); err != nil {
		t.Fatal(err)
	}
	stripes := (s.height + 15) / 16
	if _, err := s.Screenshot(ctx, o); err != nil {
		t.Fatal(err)
	}
	if got := s.jpeg.Reused(); got != stripes {
		t.Errorf("unchanged screen: %d of %d stripes reused", got, stripes)
	}
	if err := s.Type(ctx, "echo another line\n"); err != nil {
		t.Fatal(err)
	}
	// The xterm draws asynchronously: wait for the screen to change.
	for range 50 {
		if _, err := s.Screenshot(ctx, o); err != nil {
			t.Fatal(err)
		}
		if s.jpeg.Reused() == stripes {
			continue
		}
		if got := s.jpeg.Reused(); got < stripes/2 {
			t.Errorf("a typed line: only %d of %d stripes reused", got, stripes)
		}
		break
	}
	if s.jpeg.Reused() == stripes {
		t.Fatal("the screen did not change after typing")
	}
	// The xterm may still be drawing: compare a shot with the screen only
	// when the screen was the same just before and just after it.
	for range 50 {
		before, err := s.CaptureInto(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		shot, err := s.Screenshot(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		after, err := s.CaptureInto(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(before.Pix, after.Pix) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if p := psnr(t, after, shot.Data); p < 30 {
			t.Errorf("after a typed line: PSNR %.2f dB against the screen", p)
		}
		return
	}
	t.Error("the screen never held still around a screenshot")
}

// psnr is the peak signal-to-noise ratio of the decoded JPEG data against
// src's colour channels.
func psnr(t *testing.T, src *image.RGBA, data []byte) float64 {
	t.Helper()
	dec, err := jpeg.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	var sum float64
	for y := range src.Rect.Dy() {
		for x := range src.Rect.Dx() {
			r, g, b, _ := dec.At(x, y).RGBA()
			o := src.PixOffset(x, y)
			for i, v := range []uint32{r >> 8, g >> 8, b >> 8} {
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
