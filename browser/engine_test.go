package browser

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/chromium"
	"github.com/orchard/orchard/internal/testenv"
)

// The headless shell, the default engine of headless sessions, draws the
// test pages as the whole browser does. Without shellFonts a textarea and
// every monospace text came out in another font (1 % of form.html's
// pixels, 5 % of fonts.html's); what remains is right-to-left and CJK text
// placed a pixel apart (≈0.4 % of fonts.html) and frames.html's animated
// bar caught at another moment.
func TestEnginesRenderAlike(t *testing.T) {
	shell, err := chromium.Find(chromium.HeadlessShell, true)
	testenv.Require(t, "chromium", err == nil, "no chromium-headless-shell (apt-get install chromium-headless-shell)")
	full, err := chromium.Find(chromium.Browser, true)
	testenv.Require(t, "chromium", err == nil, "no chromium (apt-get install chromium)")
	pages := []string{"/basic.html", "/form.html", "/long.html", "/shadow.html", "/frames.html", "/wrap.html", "/fonts.html"}
	shots := map[string][]image.Image{}
	for _, exe := range []string{shell, full} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		s, err := Launch(ctx, Options{ExecPath: exe, DownloadDir: t.TempDir(), Viewport: Viewport{Width: 800, Height: 600}})
		if err != nil {
			cancel()
			t.Fatalf("launch %s: %v", exe, err)
		}
		for _, p := range pages {
			mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + p})
			obs := observe(t, s, ObserveOptions{Screenshot: "png"})
			img, err := png.Decode(bytes.NewReader(obs.Screenshot.Data))
			if err != nil {
				t.Fatal(err)
			}
			shots[exe] = append(shots[exe], img)
		}
		s.Close()
		cancel()
	}
	for i, p := range pages {
		a, b := shots[shell][i], shots[full][i]
		if a.Bounds() != b.Bounds() {
			t.Errorf("%s: %v against %v", p, a.Bounds(), b.Bounds())
			continue
		}
		differ := 0
		r := a.Bounds()
		for y := r.Min.Y; y < r.Max.Y; y++ {
			for x := r.Min.X; x < r.Max.X; x++ {
				ar, ag, ab, _ := a.At(x, y).RGBA()
				br, bg, bb, _ := b.At(x, y).RGBA()
				if absDiff(ar, br) > 0x1000 || absDiff(ag, bg) > 0x1000 || absDiff(ab, bb) > 0x1000 {
					differ++
				}
			}
		}
		share := float64(differ) / float64(r.Dx()*r.Dy())
		t.Logf("%s: %d pixels differ (%.4f %%)", p, differ, 100*share)
		if share > 0.005 {
			t.Errorf("%s: %.3f %% of pixels differ between the engines", p, 100*share)
		}
	}
}

func absDiff(a, b uint32) uint32 {
	if a > b {
		return a - b
	}
	return b - a
}
