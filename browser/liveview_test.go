package browser

import (
	"bytes"
	"fmt"
	"image/jpeg"
	"testing"
	"time"
)

// The live view: viewers of one size share a screencast; a frame comes
// when the page changes and not while it is still; the cast follows the
// active tab; the last viewer's leaving stops it and leaves the tabs.
func TestLiveView(t *testing.T) {
	s := openPage(t, "/basic.html")
	ctx := ctxT(t)
	paint := func(rgb string) {
		t.Helper()
		if _, err := s.Evaluate(ctx, fmt.Sprintf("document.body.innerHTML=''; document.body.style.background='rgb(%s)'; 1", rgb)); err != nil {
			t.Fatal(err)
		}
	}
	// center reads the frame's middle pixel.
	center := func(b []byte) (r, g, bl uint32, w int) {
		t.Helper()
		img, err := jpeg.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		bd := img.Bounds()
		r, g, bl, _ = img.At(bd.Dx()/2, bd.Dy()/2).RGBA()
		return r >> 8, g >> 8, bl >> 8, bd.Dx()
	}
	// await takes frames from v until one is mostly of the channel
	// picked by want, and returns its number.
	await := func(v *LiveView, after uint64, want func(r, g, b uint32) bool) (uint64, int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			f, n, err := v.Next(ctx, after, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if r, g, b, w := center(f); want(r, g, b) {
				return n, w
			}
			after = n
		}
		t.Fatal("no frame with the new colour within 15 s")
		return 0, 0
	}
	red := func(r, g, b uint32) bool { return r > 200 && g < 60 && b < 60 }
	blue := func(r, g, b uint32) bool { return b > 200 && r < 60 && g < 60 }
	green := func(r, g, b uint32) bool { return g > 100 && r < 60 && b < 60 }

	a, err := s.Watch(60, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.Watch(60, 0)
	small, _ := s.Watch(60, 320)
	s.liveMu.Lock()
	casts := len(s.casts)
	s.liveMu.Unlock()
	if casts != 2 {
		t.Errorf("three viewers of two sizes run %d screencasts, want 2", casts)
	}
	paint("255,0,0")
	seqA, w := await(a, 0, red)
	if w != 1280 {
		t.Errorf("full-size frame %d wide, want 1280", w)
	}
	if _, w := await(small, 0, red); w != 320 {
		t.Errorf("scaled frame %d wide, want 320", w)
	}
	await(b, 0, red)

	// A still page sends nothing new.
	time.Sleep(300 * time.Millisecond)
	_, seq, _ := a.Next(ctx, 0, 0)
	if _, again, err := a.Next(ctx, seq, 400*time.Millisecond); err != nil || again != seq {
		t.Errorf("a still page: frame %d after %d (%v), want none new", again, seq, err)
	}
	paint("0,0,255")
	seqA, _ = await(a, seqA, blue)

	// A new tab becomes the active one, and the view follows it.
	mustDo(t, s, Action{Type: ActNewTab, URL: site.URL + "/basic.html"})
	paint("0,128,0")
	await(a, seqA, green)
	await(small, 0, green)

	tabs := len(s.Tabs())
	a.Close()
	b.Close()
	small.Close()
	small.Close() // twice is harmless
	s.liveMu.Lock()
	casts = len(s.casts)
	s.liveMu.Unlock()
	if casts != 0 {
		t.Errorf("%d screencasts left after every viewer left", casts)
	}
	if n := len(s.Tabs()); n != tabs {
		t.Errorf("leaving the live view changed the tabs: %d, want %d", n, tabs)
	}
	if _, err := s.Observe(ctx, ObserveOptions{Screenshot: "jpeg"}); err != nil {
		t.Errorf("observe after the live view: %v", err)
	}
}

// A viewer that has left cannot restart the cast.
func TestLiveViewClosed(t *testing.T) {
	s := openPage(t, "/basic.html")
	v, err := s.Watch(60, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.Next(ctxT(t), 0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	v.Close()
	if _, _, err := v.Next(ctxT(t), 0, time.Second); err == nil {
		t.Fatal("Next after Close answered")
	}
	s.liveMu.Lock()
	n := len(s.casts)
	s.liveMu.Unlock()
	if n != 0 {
		t.Fatalf("%d screencasts after the only viewer left", n)
	}
}
