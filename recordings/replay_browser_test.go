package recordings

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// The HTML replay, opened in a real headless Chromium with nothing else
// (no network, no files beside it), shows the first step's screenshot at
// the top: a rendered page, not just markup that mentions an image.
func TestHTMLReplayRendersInChromium(t *testing.T) {
	t.Parallel()
	chromium := testenv.RequireChromium(t)
	s, _ := record(t, "replay")
	r, err := s.Open("replay")
	if err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	if _, err := r.Export(context.Background(), FormatHTML, &page); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "replay.html")
	if err := os.WriteFile(file, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.WindowSize(1000, 1400), chromedp.Flag("proxy-server", "127.0.0.1:9"), chromedp.UserDataDir(t.TempDir()))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(ctx); err != nil { // the browser starts with no deadline of its own
		t.Fatal(err)
	}
	tctx, tcancel := context.WithTimeout(ctx, 60*time.Second)
	defer tcancel()
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(1000, 1400), chromedp.Navigate("file://"+file), chromedp.WaitReady("img")); err != nil {
		t.Fatal(err)
	}
	loaded, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`[...document.images].every(i => i.complete && i.naturalWidth > 0)`))
	if err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(tctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if !loaded {
		t.Fatal("some screenshot of the replay did not decode in Chromium")
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatal(err)
	}
	// record's steps are solid red, green and blue, in that order.
	red := region(img, func(r, g, b uint32) bool { return r > 0xe000 && g < 0x2000 && b < 0x2000 })
	green := region(img, func(r, g, b uint32) bool { return g > 0xe000 && r < 0x2000 && b < 0x2000 })
	if red.n < 100*100 {
		t.Fatalf("the first step's (red) screenshot covers %d pixels of the rendered replay", red.n)
	}
	if green.n > 0 && green.top < red.top {
		t.Fatalf("the second step's screenshot (y=%d) is above the first's (y=%d)", green.top, red.top)
	}
	t.Logf("first screenshot rendered: %d px from y=%d", red.n, red.top)
}

type area struct{ n, top int }

func region(img image.Image, match func(r, g, b uint32) bool) area {
	a := area{top: -1}
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if match(r, g, b) {
				if a.top < 0 {
					a.top = y
				}
				a.n++
			}
		}
	}
	return a
}
