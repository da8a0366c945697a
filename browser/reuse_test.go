package browser

import (
	"bytes"
	"fmt"
	"image"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/pixels"
)

// shotPixels decodes a screenshot.
func shotPixels(t *testing.T, shot *Screenshot) *image.RGBA {
	t.Helper()
	if shot == nil {
		t.Fatal("no screenshot")
	}
	return pixels.Decode(t, shot.Data)
}

// unsaturate forgets how long the active tab's captures took: a machine
// loaded by other tests must not turn early captures and reuse off
// (TestSaturation covers that).
func unsaturate(t *testing.T, s *Session) {
	t.Helper()
	tb, err := s.activeTab(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	tb.mu.Lock()
	tb.dmg.capMin, tb.dmg.capAvg = 0, 0
	tb.mu.Unlock()
}

// step clicks #b and observes with a JPEG, as an RL step does.
func step(t *testing.T, s *Session) Observation {
	t.Helper()
	resp, err := s.Run(ctxT(t), Request{
		Action:  &Action{Type: ActClick, Selector: "#b"},
		Observe: &ObserveOptions{Screenshot: "jpeg"},
	})
	if err != nil || !resp.OK || resp.Observation == nil {
		t.Fatalf("step: %v %+v", err, resp)
	}
	return *resp.Observation
}

// A step's observation is the same frame whether its capture started
// early, the tab's last capture was reused, or every frame was drawn anew
// (AlwaysCapture), compared pixel by pixel page by page; and pages that
// change or draw on their own always get a new frame.
func TestFramesMatchFreshCaptures(t *testing.T) {
	srv := pendingSite(t)
	out := "document.getElementById('out').textContent=%s"
	canvas := `<canvas id="c" width="200" height="100"></canvas>`
	draw := "var c=document.getElementById('c').getContext('2d');c.fillStyle='%s';c.fillRect(0,0,200,100)"
	cases := []struct {
		name, page, click, body string
		// frame is where the step's screenshot must come from by default;
		// "" for captured or early (a race with the page).
		frame string
		// same: the two runs' frames are compared (nothing on the page
		// moves on its own).
		same bool
	}{
		{name: "synchronous change", click: fmt.Sprintf(out, "'now'"), frame: frameEarly, same: true},
		{name: "click with no effect", frame: frameEarly, same: true},
		{name: "timer", click: "setTimeout(function(){" + fmt.Sprintf(out, "'late'") + "},60)", frame: frameCaptured, same: true},
		// Eight frames on: on a loaded machine two could pass before the
		// page is asked whether anything is pending, and a capture started
		// after the change would rightly serve.
		{name: "animation frames", click: "var n=0;(function f(){if(++n<8){requestAnimationFrame(f)}else{" + fmt.Sprintf(out, "'drawn'") + "}})()", frame: frameCaptured, same: true},
		{name: "fetch then change", click: "fetch('/fast').then(function(r){return r.text()}).then(function(x){" + fmt.Sprintf(out, "x") + "})", same: true},
		{name: "canvas drawn by the click", body: canvas, click: fmt.Sprintf(draw, "#0a0"), frame: frameEarly, same: true},
		{name: "canvas drawn by a timer", body: canvas, click: "setTimeout(function(){" + fmt.Sprintf(draw, "#00f") + "},40)", frame: frameCaptured, same: true},
		{name: "CSS animation", body: `<div style="width:50px;height:50px;background:red;animation:spin 1s linear infinite"></div><style>@keyframes spin{to{transform:rotate(360deg)}}</style>`, frame: frameCaptured},
		{name: "transition started by the click", body: `<div id="d" style="width:50px;height:50px;background:red;transition:width 2s linear"></div>`, click: "document.getElementById('d').style.width='400px'", frame: frameCaptured},
		{name: "video", body: canvas + `<video id="v" muted autoplay width="200" height="100"></video><script>var cv=document.getElementById('c'),x=cv.getContext('2d'),i=0;(function f(){x.fillStyle='hsl('+(i++%360)+',80%,50%)';x.fillRect(0,0,200,100);requestAnimationFrame(f)})();var v=document.getElementById('v');v.srcObject=cv.captureStream(30);v.play()</script>`, frame: frameCaptured},
		// The caret blinks: frames taken half a second apart may differ.
		{name: "focused field", body: `<input id="f" autofocus>`, click: "document.getElementById('f').focus()", frame: frameCaptured},
	}
	s := openPage(t, "/basic.html")
	defer func() { s.opts.AlwaysCapture = false }()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := srv.URL + "/?page=" + urlQuery(c.page) + "&click=" + urlQuery(c.click) + "&body=" + urlQuery(c.body)
			run := func(always bool) Observation {
				s.opts.AlwaysCapture = always
				mustDo(t, s, Action{Type: ActNavigate, URL: u})
				unsaturate(t, s)
				return step(t, s)
			}
			fresh := run(true)
			if fresh.Timing.Frame != frameCaptured {
				t.Errorf("with AlwaysCapture the frame was %q", fresh.Timing.Frame)
			}
			got := run(false)
			if c.frame != "" && got.Timing.Frame != c.frame {
				t.Errorf("frame %q, want %q", got.Timing.Frame, c.frame)
			}
			if c.same {
				if n := pixels.Differing(shotPixels(t, fresh.Screenshot), shotPixels(t, got.Screenshot)); n != 0 {
					t.Errorf("%d pixels differ from a fresh capture (frame %q)", n, got.Timing.Frame)
				}
			}
			// An observation right after: reused only when nothing draws.
			again := observe(t, s, ObserveOptions{Screenshot: "jpeg"})
			if !c.same && again.Timing.Frame == frameReused {
				t.Errorf("a page that draws on its own had its frame reused")
			}
			if c.same {
				if n := pixels.Differing(shotPixels(t, got.Screenshot), shotPixels(t, again.Screenshot)); n != 0 {
					t.Errorf("%d pixels differ in the observation after (frame %q)", n, again.Timing.Frame)
				}
			}
		})
	}
}

// An observation reuses the tab's last capture while nothing is drawn,
// and captures anew once something is: a DOM change, a canvas drawn by a
// script the page's tracker cannot see (the compositor's frames tell),
// another viewport size or quality.
func TestObserveReusesOnlyWhatStillShows(t *testing.T) {
	srv := pendingSite(t)
	s := openPage(t, "/basic.html")
	mustDo(t, s, Action{Type: ActNavigate, URL: srv.URL + "/?body=" + urlQuery(`<canvas id="c" width="300" height="150"></canvas>`)})
	jpeg := ObserveOptions{Screenshot: "jpeg"}
	unsaturate(t, s)
	first := observe(t, s, jpeg)
	if first.Timing.Frame != frameCaptured {
		t.Fatalf("first observation: frame %q", first.Timing.Frame)
	}
	// An agent thinks between observations: by then any frame drawn since
	// has been reported, and waiting costs nothing.
	time.Sleep(300 * time.Millisecond)
	unsaturate(t, s)
	second := observe(t, s, jpeg)
	if second.Timing.Frame != frameReused || !bytes.Equal(first.Screenshot.Data, second.Screenshot.Data) {
		t.Errorf("second observation of a still page: frame %q, same bytes %v", second.Timing.Frame, bytes.Equal(first.Screenshot.Data, second.Screenshot.Data))
	}
	if o := observe(t, s, ObserveOptions{Screenshot: "jpeg", Quality: 50}); o.Timing.Frame != frameCaptured {
		t.Errorf("another quality: frame %q", o.Timing.Frame)
	}
	if o := observe(t, s, ObserveOptions{Screenshot: "png"}); o.Timing.Frame != frameCaptured {
		t.Errorf("png after jpeg: frame %q", o.Timing.Frame)
	}

	check := func(what, change string) {
		t.Helper()
		before := observe(t, s, jpeg)
		js[any](t, s, change)
		time.Sleep(300 * time.Millisecond) // the frame is drawn and reported
		after := observe(t, s, jpeg)
		if after.Timing.Frame == frameReused {
			t.Errorf("%s: the frame before it was reused", what)
		}
		if n := pixels.Differing(shotPixels(t, before.Screenshot), shotPixels(t, after.Screenshot)); n == 0 {
			t.Errorf("%s: the new frame shows no change", what)
		}
	}
	check("a DOM change", "document.getElementById('out').textContent='changed'; 1")
	// Drawn by an evaluation: no mutation and no callback the tracker
	// wraps; only the compositor's frame shows it.
	check("a canvas drawn unseen", "document.getElementById('c').getContext('2d').fillRect(0,0,300,150); 1")

	s.opts.AlwaysCapture = true
	defer func() { s.opts.AlwaysCapture = false }()
	observe(t, s, jpeg)
	if o := observe(t, s, jpeg); o.Timing.Frame != frameCaptured {
		t.Errorf("AlwaysCapture: frame %q", o.Timing.Frame)
	}
}

// A tab stops starting captures early and watching damage while its
// captures take far longer than its fastest, and starts again once they
// are fast.
func TestSaturation(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name      string
		captures  []time.Duration
		saturated bool
	}{
		{"no capture yet", nil, false},
		{"steady", []time.Duration{60 * ms, 62 * ms, 58 * ms, 61 * ms}, false},
		{"captures after clicks, twice the fastest", []time.Duration{40 * ms, 80 * ms, 85 * ms, 80 * ms, 90 * ms, 85 * ms}, false},
		{"a slow one among fast", []time.Duration{60 * ms, 60 * ms, 900 * ms, 60 * ms, 60 * ms, 60 * ms, 60 * ms}, false},
		{"sixteen sandboxes on two cores", []time.Duration{60 * ms, 500 * ms, 600 * ms, 700 * ms, 650 * ms}, true},
		{"the load went away", []time.Duration{60 * ms, 600 * ms, 700 * ms, 650 * ms, 60 * ms, 60 * ms, 60 * ms, 60 * ms, 60 * ms, 60 * ms, 60 * ms}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := &tab{}
			for _, d := range c.captures {
				tb.captured(d)
			}
			tb.mu.Lock()
			got := tb.saturatedLocked()
			tb.mu.Unlock()
			if got != c.saturated {
				t.Errorf("saturated %v after %v (average %v, fastest %v)", got, c.captures, tb.dmg.capAvg, tb.dmg.capMin)
			}
		})
	}
}

// The compositor holds back the frames it draws while a capture runs, the
// capture's own among them, until the capture is read back: their delay
// is the capture's and must not count as how late frames are reported,
// or every reuse would wait about as long as a capture (with Chromium's
// CDPScreenshotNewSurface feature a still step took 85 ms instead of 39).
func TestCaptureFramesDoNotCountAsLate(t *testing.T) {
	s := openPage(t, "/basic.html")
	unsaturate(t, s)
	tb, err := s.activeTab(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	jpeg := ObserveOptions{Screenshot: "jpeg"}
	observe(t, s, jpeg) // starts the damage screencast
	time.Sleep(300 * time.Millisecond)
	state := func() (int, time.Duration) {
		tb.mu.Lock()
		defer tb.mu.Unlock()
		return tb.dmg.n, tb.dmg.lat
	}
	for i := range 3 {
		n0, lat0 := state()
		unsaturate(t, s)
		asked := time.Now()
		if _, err := s.screenshot(ctxT(t), tb, jpeg, pageState{}, 1, 0, 0); err != nil {
			t.Fatal(err)
		}
		took := time.Since(asked)
		time.Sleep(300 * time.Millisecond) // the held frames are reported
		n, lat := state()
		if n == n0 {
			t.Fatalf("capture %d: the screencast reported no frame for it", i)
		}
		if lat > lat0 {
			t.Errorf("capture %d (%v): frames counted %v late after it, %v before", i, took, lat, lat0)
		}
	}
}

func TestHeldByCapture(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	cases := []struct {
		name          string
		asked, done   time.Time
		frame         time.Time
		heldByCapture bool
	}{
		{"no capture yet", time.Time{}, time.Time{}, at(5), false},
		{"drawn before the capture", at(10), at(80), at(5), false},
		{"drawn during it", at(10), at(80), at(37), true},
		{"drawn as it ended", at(10), at(80), at(80), true},
		{"drawn after it", at(10), at(80), at(81), false},
		{"drawn while one runs", at(100), at(80), at(120), true},
		{"drawn before the running one", at(100), at(80), at(90), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := &tab{}
			tb.dmg.capAsked, tb.dmg.capDone = c.asked, c.done
			tb.mu.Lock()
			got := tb.heldByCaptureLocked(c.frame)
			tb.mu.Unlock()
			if got != c.heldByCapture {
				t.Errorf("held %v, want %v", got, c.heldByCapture)
			}
		})
	}
}
