package browser

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// launchFastFrames starts a browser of its own with FastFrames.
func launchFastFrames(t testing.TB) *Session {
	t.Helper()
	path := testenv.RequireChromium(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Launch(ctx, Options{ExecPath: path, DownloadDir: dir, FastFrames: true})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// frameRate counts the page's animation frames over d.
func frameRate(t testing.TB, s *Session, d time.Duration) float64 {
	t.Helper()
	before := js[int](t, s, "window.frames_seen")
	start := time.Now()
	time.Sleep(d)
	after := js[int](t, s, "window.frames_seen")
	r := float64(after-before) / time.Since(start).Seconds()
	t.Logf("animation frames: %.0f/s", r)
	return r
}

// With the frame clock off, a requestAnimationFrame loop still runs at
// about 60 Hz (unpaced it runs at hundreds or thousands per second), in the
// page, its iframes and pages it opens; and a screenshot taken right after
// an action shows the action's effect.
func TestFastFramesPacedAndFresh(t *testing.T) {
	s := launchFastFrames(t)
	// The page never goes quiet: do not wait long for it to.
	s.opts.SettleTimeout = 300 * time.Millisecond
	ctx := ctxT(t)
	if _, err := s.Do(ctx, []Action{{Type: ActNavigate, URL: site.URL + "/frames.html"}}); err != nil {
		t.Fatal(err)
	}
	// A loaded two-core machine gives fewer frames, never more than the
	// clock allows.
	if r := frameRate(t, s, time.Second); r < 10 || r > 75 {
		t.Errorf("animation frames at %.0f/s, want about 60", r)
	}
	if !js[bool](t, s, "window.__orchardPacer === true && document.getElementById('inner').contentWindow.__orchardPacer === true") {
		t.Error("the pacer is missing from the page or its iframe")
	}

	before := observe(t, s, ObserveOptions{Screenshot: "png"})
	if c := pixel(t, before.Screenshot.Data, 200, 150); c != (color.RGBA{255, 0, 0, 255}) {
		t.Fatalf("box before the click %v, want red", c)
	}
	mustDo(t, s, Action{Type: ActClick, Selector: "#flip"})
	after := observe(t, s, ObserveOptions{Screenshot: "jpeg"})
	if c := pixel(t, after.Screenshot.Data, 200, 150); c != (color.RGBA{0, 0, 255, 255}) {
		t.Errorf("box right after the click %v, want blue", c)
	}

	// A page opened by the page is paced too, its first document included.
	mustDo(t, s, Action{Type: ActNewTab, URL: site.URL + "/frames.html"})
	if r := frameRate(t, s, time.Second); r < 10 || r > 75 {
		t.Errorf("animation frames in a new tab at %.0f/s, want about 60", r)
	}
}

func pixel(t testing.TB, data []byte, x, y int) color.RGBA {
	t.Helper()
	img, _, err := image.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("decode screenshot: %v", err)
	}
	return rgb(img.At(x, y))
}
