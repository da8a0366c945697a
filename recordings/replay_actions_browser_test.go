package recordings

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/docimg"
	"github.com/orchard/orchard/internal/testing/pagetest"
)

// actionsRecording records one step per action type the replay draws,
// over 400×200 screenshots of an 800×400 page (scale 0.5): the action
// coordinates are screenshot pixels, so the click at (100, 50) must land a
// quarter of the way across and down the rendered image whatever its size.
func actionsRecording(t *testing.T) *Recording {
	t.Helper()
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(Manifest{ID: "acts", TaskID: "shop/find-price", Question: "Find the price", Kind: "browser"})
	if err != nil {
		t.Fatal(err)
	}
	white := testImage(t, 400, 200, color.RGBA{255, 255, 255, 255}, "png")
	elements := `{"ok":true,"observation":{"elements":[{"id":7,"role":"button","name":"Buy","bbox":[200,100,80,40]}]}}`
	steps := []struct {
		st   Step
		shot bool
	}{
		{Step{N: 0, Width: 400, Height: 200, Scale: 0.5}, true},
		{Step{N: 1, Action: raw(`{"type":"click","x":100,"y":50}`), Result: raw(elements), StepMS: 120, Width: 400, Height: 200, Scale: 0.5}, true},
		{Step{N: 2, Action: raw(`{"type":"click","element":7}`), Result: raw(`{"ok":true,"results":[{"type":"click","ok":true,"settle":{"reason":"quiet"}}]}`), StepMS: 80, Width: 400, Height: 200, Scale: 0.5}, true},
		{Step{N: 3, Action: raw(`{"type":"type","text":"blue shoes"}`), Width: 400, Height: 200, Scale: 0.5}, true},
		{Step{N: 4, Action: raw(`{"type":"key","keys":"Enter"}`), Width: 400, Height: 200, Scale: 0.5}, true},
		{Step{N: 5, Action: raw(`{"type":"scroll","x":200,"y":100,"dx":0,"dy":60}`), Width: 400, Height: 200, Scale: 0.5}, true},
		{Step{N: 6, Action: raw(`{"type":"drag","path":[[10,10],[100,100],[300,150]]}`), Width: 400, Height: 200, Scale: 0.5,
			Error: &faults.Info{Category: faults.Timeout, Source: faults.Site, Code: "site.timeout", Message: "the page did not answer"}}, true},
		{Step{N: 7, Action: raw(`{"type":"exec","command":"ls /work"}`), Result: raw(`{"stdout":"a.txt\n","stderr":"warn\n","exit_code":2,"duration_ms":12}`)}, false},
		{Step{N: 8, Action: raw(`{"type":"write_file","path":"notes.txt","content":"price: $42"}`), Result: raw(`{"exit_code":0}`)}, false},
		{Step{N: 9, Action: raw(`{"type":"apply_patch","patch":"--- a/x\n+++ b/x\n"}`), Result: raw(`{"exit_code":0}`)}, false},
		{Step{N: 10, Action: raw(`{"type":"answer","text":"$42"}`)}, false},
	}
	for _, s := range steps {
		var shot []byte
		ext := ""
		if s.shot {
			shot, ext = white, "png"
		}
		if err := w.Append(s.st, shot, ext); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(func(m *Manifest) {
		m.Outcome = OutcomeFailure
		m.Evaluation = raw(`{"success":false,"reward":0,"type":"answer_match","details":{"expected":"$41","got":"$42"}}`)
	}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Open("acts")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func raw(s string) json.RawMessage { return json.RawMessage(s) }

// The replay in Chromium: the click marker sits at the mapped point of a
// downscaled screenshot, every action type is drawn or transcribed, the
// failed step shows its category, the evaluation shows expected vs got,
// arrow keys move between steps, and nothing is fetched from anywhere.
func TestReplayDrawsActionsInChromium(t *testing.T) {
	t.Parallel()
	r := actionsRecording(t)
	var page bytes.Buffer
	if _, err := r.Export(context.Background(), FormatHTML, &page); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "replay.html")
	if err := os.WriteFile(file, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, requests := pagetest.Open(t, "file://"+file, 1000, 900)

	var got struct {
		Kinds    []string `json:"kinds"`
		Box      bool     `json:"box"`
		Drag     bool     `json:"drag"`
		Scroll   bool     `json:"scroll"`
		Typed    []string `json:"typed"`
		Term     string   `json:"term"`
		Exit     string   `json:"exit"`
		Category string   `json:"category"`
		Eval     string   `json:"eval"`
		Settle   string   `json:"settle"`
		Thumbs   int      `json:"thumbs"`
		CSP      string   `json:"csp"`
		Rect     struct {
			X, Y, W, H float64
		} `json:"rect"`
	}
	js := `(() => {
	  const q = (s) => document.querySelector(s);
	  q('#step-0').scrollIntoView({block: 'start'});
	  const r = q('#step-0 .shot img').getBoundingClientRect();
	  return {
	    kinds: [...document.querySelectorAll('svg.overlay')].map(s => s.dataset.kind),
	    box: !!q('#step-1 rect.box'), drag: !!q('#step-5 polyline.drag'), scroll: !!q('#step-4 line.scroll'),
	    typed: [...document.querySelectorAll('.typed')].map(d => d.textContent),
	    term: [...document.querySelectorAll('pre.term')].map(p => p.textContent).join('|'),
	    exit: q('#step-7 [data-exit]').dataset.exit,
	    category: q('#step-6 .step-error .cat').textContent,
	    eval: q('#evaluation').textContent, settle: q('#step-2 .settle').textContent,
	    thumbs: document.querySelectorAll('#strip img').length,
	    csp: q('meta[http-equiv="Content-Security-Policy"]').content,
	    rect: {x: r.left, y: r.top, w: r.width, h: r.height},
	  };
	})()`
	v, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](js))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(v, &got); err != nil {
		t.Fatal(err)
	}
	wantKinds := []string{"click", "click", "type", "key", "scroll", "drag"}
	if strings.Join(got.Kinds, ",") != strings.Join(wantKinds, ",") {
		t.Errorf("overlays %v, want %v", got.Kinds, wantKinds)
	}
	if !got.Box || !got.Drag || !got.Scroll {
		t.Errorf("element box %v, drag path %v, scroll arrow %v", got.Box, got.Drag, got.Scroll)
	}
	if strings.Join(got.Typed, "|") != `type "blue shoes"|key Enter` {
		t.Errorf("typed captions %q", got.Typed)
	}
	for _, want := range []string{"$ ls /work", "a.txt", "warn", "exit 2", "write_file notes.txt", "price: $42", "apply_patch", "+++ b/x", "answer: $42"} {
		if !strings.Contains(got.Term, want) {
			t.Errorf("terminal transcript %q lacks %q", got.Term, want)
		}
	}
	if got.Exit != "2" || got.Category != "timeout" || !strings.Contains(got.Settle, "quiet") {
		t.Errorf("exit %q, category %q, settle %q", got.Exit, got.Category, got.Settle)
	}
	if !strings.Contains(got.Eval, "answer_match") || !strings.Contains(got.Eval, "$41") || !strings.Contains(got.Eval, "$42") {
		t.Errorf("evaluation %q", got.Eval)
	}
	// The thumbnails are made by the page's script, which its own policy
	// (no requests, only that script) lets run.
	if got.Thumbs != 7 {
		t.Errorf("%d thumbnails, want one per screenshot (7)", got.Thumbs)
	}
	if !strings.HasPrefix(got.CSP, "default-src 'none'; img-src data:;") || !strings.Contains(got.CSP, "script-src 'sha256-") {
		t.Errorf("policy %q", got.CSP)
	}

	// The click (100, 50) of a 400×200 screenshot: a quarter across and
	// down the image as rendered. The marker is a ring; its centre shows
	// the image through it.
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatal(err)
	}
	cx, cy := int(got.Rect.X+got.Rect.W/4), int(got.Rect.Y+got.Rect.H/4)
	for _, d := range [][2]int{{-10, 0}, {0, -10}, {0, 10}} {
		if !magentaNear(img, cx+d[0], cy+d[1], 2) {
			t.Errorf("no marker ring at (%d, %d) around the mapped click (%d, %d) of image %+v", cx+d[0], cy+d[1], cx, cy, got.Rect)
		}
	}
	if magentaNear(img, cx, cy, 3) {
		t.Errorf("the marker's centre (%d, %d) is not the click", cx, cy)
	}
	docimg.Save(t, "replay.png", shot)

	// Arrow keys move between steps.
	step := func() int {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.replayStep()`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := chromedp.Do(ctx, chromedp.KeyEvent(kb.ArrowRight), chromedp.KeyEvent(kb.ArrowRight)); err != nil {
		t.Fatal(err)
	}
	if n := step(); n != 2 {
		t.Errorf("after two right arrows, step %d", n)
	}
	if err := chromedp.Do(ctx, chromedp.KeyEvent(kb.ArrowLeft)); err != nil {
		t.Fatal(err)
	}
	if n := step(); n != 1 {
		t.Errorf("after a left arrow, step %d", n)
	}
	for _, u := range requests() {
		if !strings.HasPrefix(u, "file://") && !strings.HasPrefix(u, "data:") {
			t.Errorf("the replay requested %s", u)
		}
	}
}

func magentaNear(img image.Image, x, y, r int) bool {
	for dy := -r; dy <= r; dy++ {
		for dx := -r; dx <= r; dx++ {
			cr, cg, cb, _ := img.At(x+dx, y+dy).RGBA()
			if cr > 0xc000 && cg < 0x6000 && cb > 0xc000 {
				return true
			}
		}
	}
	return false
}
