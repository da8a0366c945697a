package browser

// Frames that need not be drawn again. Page.captureScreenshot asks the
// compositor for a new frame and waits for it: one to two ticks of its
// 60 Hz clock, then a draw, a read-back and an encode — 33 ms on a fast
// machine, 60 ms and more on a slow one, whatever the page did. Two cases
// need no new frame:
//
//   - An observation when nothing was drawn since the tab's last capture:
//     it answers with that capture ("reused").
//   - A step whose page has nothing pending once the action is answered:
//     its capture starts then, while the settle wait runs, and is kept
//     when the page changed nothing since it was asked for ("early").
//
// "Nothing changed" is known from two sides. In the page, the tracker
// (pending.js) keeps the moment of the latest change in every document —
// a mutation, a timer or frame callback, a scroll, an edit, a load — and
// says what draws without one: animations, a playing video, a caret. In
// the compositor, a screencast of the tab at 8×8 pixels reports every
// frame drawn with damage (a frame costs a tiny copy; a still page sends
// none), which is what catches what the page cannot see: an image decoded
// after its load, a frame of an animated image. A capture draws one frame
// itself; any other after it means the kept capture is stale. A frame is
// reported a little after it is drawn, so a capture is reused only once
// frames drawn since it ended, or since the last input, would have been
// reported (reuseAtLocked). A document the tracker cannot look into
// (another origin, PlainSettle), a tab whose screencast is off (it stops
// while a page animates, see onCastFrame, and while captures are slow,
// see saturatedLocked) and a session with a DevTools client attached
// always get a new frame. Options.AlwaysCapture turns both off.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
)

// Where an observation's screenshot came from (ObserveTiming.Frame).
const (
	frameCaptured = "captured"
	frameEarly    = "early"
	frameReused   = "reused"
)

// frameState is the page's side (page.js frameCheck). Times are wall-clock
// milliseconds.
type frameState struct {
	Now     float64 `json:"now"`
	Changed float64 `json:"changed"`
	Pending int     `json:"pending"`
	Live    bool    `json:"live"`
	OK      bool    `json:"ok"`
}

// still reports a page that will not change on its own soon.
func (f *frameState) still() bool { return f != nil && f.OK && f.Pending == 0 && !f.Live }

// shotKey is what a capture shows; only captures of the whole viewport at
// scale 1 are kept.
type shotKey struct {
	format  string
	quality int
	vw, vh  float64
}

func keyable(o ObserveOptions) bool {
	return !o.FullPage && o.Width == 0 && (o.Scale == 0 || o.Scale == 1) && shotFormat(o) != "none"
}

func keyOf(o ObserveOptions, st pageState) shotKey {
	return shotKey{format: shotFormat(o), quality: shotQuality(o), vw: st.VW, vh: st.VH}
}

// keptShot is a tab's last capture and what the tab was when it was taken.
type keptShot struct {
	key  shotKey
	shot Screenshot
	// at: the frame shows the page as it was at this moment (page clock,
	// wall ms) or later.
	at            float64
	asked, done   time.Time
	docs, crashes int64
}

// castRing is how many frame times a tab remembers.
const castRing = 32

// damage is what the tab's 8×8 screencast has reported.
type damage struct {
	on    bool
	first chan struct{} // started, its first frame not yet reported
	since time.Time     // on since

	offUntil time.Time // stopped (the page animates) until
	ring     [castRing]time.Time
	n        int // frames since it started
	// lat is how late frames are reported (a decaying maximum of the time
	// from a frame's start to its report).
	lat time.Duration
	// capMin and capAvg are the fastest capture of the tab and a moving
	// average of the latest (see saturatedLocked).
	capMin, capAvg time.Duration
	// capAsked and capDone bracket the tab's latest capture (capDone
	// before capAsked while one runs): the compositor holds back the
	// frames it draws meanwhile, the capture's own among them, until the
	// capture is read back, so their delay is the capture's, not the
	// reporting's (see onCastFrame).
	capAsked, capDone time.Time
}

// capturing records the start of a capture of the tab.
func (t *tab) capturing(at time.Time) {
	t.mu.Lock()
	t.dmg.capAsked = at
	t.mu.Unlock()
}

// captureEnded records the end of the capture started at asked.
func (t *tab) captureEnded(asked, at time.Time) {
	t.mu.Lock()
	if t.dmg.capAsked.Equal(asked) {
		t.dmg.capDone = at
	}
	t.mu.Unlock()
}

// heldByCaptureLocked reports a frame drawn at at while a capture ran:
// one reported late because of it. Callers hold t.mu.
func (t *tab) heldByCaptureLocked(at time.Time) bool {
	d := &t.dmg
	if d.capAsked.IsZero() || at.Before(d.capAsked) {
		return false
	}
	return d.capDone.Before(d.capAsked) || !at.After(d.capDone)
}

// captured records how long a capture took.
func (t *tab) captured(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := &t.dmg
	if m.capMin == 0 || d < m.capMin {
		m.capMin = d
	}
	if m.capAvg == 0 {
		m.capAvg = d
	}
	m.capAvg = (4*m.capAvg + d) / 5
}

// saturatedLocked reports a tab whose captures take over three times as
// long as its fastest: the machine has no core to spare (a capture after a
// click that changed the page takes up to twice the fastest on an idle
// machine; under load, ten times). Starting a capture early
// then only competes with the settle wait for the same cores, and the
// damage screencast's frames (two per step) cost what a reuse would save,
// so both stop until captures are fast again (BenchmarkBrowserConcurrent:
// sixteen sandboxes stepping on two cores lost a quarter of their steps
// to them). Callers hold t.mu.
func (t *tab) saturatedLocked() bool {
	m := &t.dmg
	return m.capMin > 0 && m.capAvg > 3*m.capMin
}

// Screencast pacing: a page that draws this many frames in castBurst is
// animating; the cast stops for castPause (a frame costs a copy, and such
// a page cannot reuse frames anyway).
const (
	castBurstFrames = 8
	castBurst       = 500 * time.Millisecond
	castPause       = time.Second
	// castFirst bounds the wait for a cast's first frame (reported within
	// a millisecond or two on an idle machine).
	castFirst = 200 * time.Millisecond
)

// watchDamage starts the tab's screencast unless it runs or rests. A cast
// sends the frame shown when it starts: the cast counts as on from that
// frame's report, so that it is not taken for a frame drawn later.
func (s *Session) watchDamage(ctx context.Context, t *tab) {
	t.mu.Lock()
	d := &t.dmg
	if d.on && t.saturatedLocked() {
		d.on = false
		t.mu.Unlock()
		cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
		defer cancel()
		_, _ = cdp.Call(cctx, t.target, page.StopScreencast, cdp.Empty{})
		return
	}
	if d.on || d.first != nil || time.Now().Before(d.offUntil) || t.saturatedLocked() {
		t.mu.Unlock()
		return
	}
	first := make(chan struct{})
	d.first, d.n = first, 0
	t.mu.Unlock()
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	defer cancel()
	_, err := cdp.Call(cctx, t.target, page.StartScreencast, page.StartScreencastParams{
		Format: page.StartScreencastFormatJpeg, Quality: new(int64(10)), MaxWidth: 8, MaxHeight: 8,
	})
	if err != nil {
		s.log.Debug("damage screencast", "error", err)
		t.mu.Lock()
		d.first, d.offUntil = nil, time.Now().Add(castPause)
		t.mu.Unlock()
		return
	}
	timer := time.NewTimer(castFirst)
	defer timer.Stop()
	select {
	case <-first:
	case <-timer.C: // on when it comes
	case <-cctx.Done():
	}
}

// onCastFrame records a frame of the damage screencast. Called from
// onEvent with t.mu held: protocol calls go out from a goroutine.
func (t *tab) onCastFrame(e *page.EventScreencastFrame) {
	d := &t.dmg
	if d.first != nil {
		close(d.first)
		d.first = nil
		d.on, d.since = true, time.Now()
	}
	at := time.Now()
	if e.Metadata != nil && e.Metadata.Timestamp > 0 {
		at = time.UnixMicro(int64(float64(e.Metadata.Timestamp) * 1e6))
	}
	d.ring[d.n%castRing] = at
	d.n++
	if l := time.Since(at); l > 0 && l < time.Second && !t.heldByCaptureLocked(at) {
		d.lat = max(l, d.lat*9/10)
	}
	target, id := t.target, e.SessionID
	stop := false
	if d.on && d.n >= castBurstFrames {
		if at.Sub(d.ring[(d.n-castBurstFrames)%castRing]) < castBurst {
			d.on, stop = false, true
			d.offUntil = time.Now().Add(castPause)
		}
	}
	t.s.background(func() {
		ctx, cancel := context.WithTimeout(t.ctx, t.s.opts.CallTimeout)
		defer cancel()
		if stop {
			_, _ = cdp.Call(ctx, target, page.StopScreencast, cdp.Empty{})
			return
		}
		_, _ = cdp.Call(ctx, target, page.ScreencastFrameAck, page.ScreencastFrameAckParams{SessionID: id})
	})
}

// drawnSinceLocked reports whether the compositor drew a frame, other than
// the capture's own, since kp was asked for, or cannot tell. Callers hold
// t.mu.
func (t *tab) drawnSinceLocked(kp *keptShot) bool {
	d := &t.dmg
	if !d.on || !d.since.Before(kp.asked) {
		return true
	}
	own := 0
	for i := 1; i <= min(d.n, castRing); i++ {
		at := d.ring[(d.n-i)%castRing]
		if !at.After(kp.asked) {
			return false
		}
		if !at.Before(kp.done) {
			return true
		}
		if own++; own > 1 {
			return true
		}
	}
	// Every frame remembered is younger than the capture: older ones were
	// forgotten, so one of them may have come after it.
	return d.n > castRing
}

// reuseAtLocked is when the kept capture may be reused: a frame is
// reported a little after it is drawn, so a frame drawn after the capture
// ended, or because of input sent since, may not have been reported yet.
// The wait is half as long again as frames were reported late lately
// (before any was, as long as the capture took, which reads back and
// encodes the whole frame). Callers hold t.mu.
func (t *tab) reuseAtLocked(kp *keptShot) time.Time {
	g := kp.done.Sub(kp.asked)
	if t.dmg.lat > 0 {
		g = t.dmg.lat * 3 / 2
	}
	g = min(max(g, 16*time.Millisecond), 500*time.Millisecond)
	from := kp.done
	if t.lastInput.After(from) {
		from = t.lastInput
	}
	return from.Add(g)
}

// stillShowsLocked reports whether kp still shows the page as fs sees it,
// as far as is known now. Callers hold t.mu.
func (t *tab) stillShowsLocked(kp *keptShot, fs *frameState) bool {
	// A request that ended since is not a change in itself: what the page
	// did with its answer is (a mutation, a load event, a frame drawn).
	return kp != nil && fs.still() && fs.Changed <= kp.at &&
		kp.docs == t.docs && kp.crashes == t.crashes &&
		!t.loading && t.dialog == nil && !t.busyLocked() && !t.drawnSinceLocked(kp)
}

// reusable returns the tab's kept capture when it still shows the page,
// or how long to wait before it may (0: capture anew).
func (t *tab) reusable(k shotKey, fs *frameState) (*Screenshot, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	kp := t.kept
	if kp == nil || kp.key != k || !t.s.reuses() || kp.asked.UnixNano() <= t.s.detached.Load() || !t.stillShowsLocked(kp, fs) {
		return nil, 0
	}
	if wait := time.Until(t.reuseAtLocked(kp)); wait > 0 {
		// Not worth more than a capture.
		if wait > kp.done.Sub(kp.asked) {
			return nil, 0
		}
		return nil, wait
	}
	shot := kp.shot
	return &shot, 0
}

// keep records a capture that shows the page as of fs.Now.
func (t *tab) keep(k shotKey, shot *Screenshot, fs *frameState, asked, done time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !fs.still() || t.s.opts.AlwaysCapture {
		t.kept = nil
		return
	}
	t.kept = &keptShot{key: k, shot: *shot, at: fs.Now, asked: asked, done: done, docs: t.docs, crashes: t.crashes}
}

// frameCheck asks the page for its side (quiet: how far ahead a timer
// counts as pending).
func (s *Session) frameCheck(ctx context.Context, t *tab, quiet time.Duration) (*frameState, error) {
	var fs frameState
	if err := t.evalInto(ctx, libExpr(fmt.Sprintf("frameCheck(%d)", quiet.Milliseconds())), false, s.opts.CallTimeout, &fs); err != nil {
		return nil, err
	}
	return &fs, nil
}

// earlyShot is a step's capture started when its action was answered.
type earlyShot struct {
	o ObserveOptions

	mu                  sync.Mutex
	t                   *tab
	at                  float64
	docs, reqs, crashes int64
	asked               time.Time
	res                 chan earlyResult
}

type earlyResult struct {
	shot *Screenshot
	done time.Time
	err  error
}

type earlyKey struct{}

// withEarly lets the actions of a request with observation o start its
// capture.
func (s *Session) withEarly(ctx context.Context, o *ObserveOptions) context.Context {
	if o == nil || s.opts.AlwaysCapture || !keyable(*o) {
		return ctx
	}
	return context.WithValue(ctx, earlyKey{}, &earlyShot{o: *o})
}

func earlyOf(ctx context.Context) *earlyShot {
	e, _ := ctx.Value(earlyKey{}).(*earlyShot)
	return e
}

// Attached tells the session a DevTools client of its own is connected
// (the /browser/cdp proxy) until the returned func is called. What such a
// client changes (emulation, styles, a canvas drawn from an evaluation)
// the page's tracker need not see, so meanwhile every screenshot is a new
// capture.
func (s *Session) Attached() (detach func()) {
	s.attached.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			s.detached.Store(time.Now().UnixNano())
			s.attached.Add(-1)
		})
	}
}

// reuses reports whether captures may be reused or started early now.
func (s *Session) reuses() bool { return !s.opts.AlwaysCapture && s.attached.Load() == 0 }

// touch records that the tab was just driven (an action, an evaluation):
// what that drew may not be reported yet.
func (t *tab) touch() {
	t.mu.Lock()
	t.lastInput = time.Now()
	t.mu.Unlock()
}

// startsEarly lists the actions after which a capture may start before
// the settle wait: those that stay in the document.
func startsEarly(typ string) bool {
	switch typ {
	case ActClick, ActDoubleClick, ActHover, ActType, ActKey, ActScroll, ActDrag, ActSelectOption:
		return true
	}
	return false
}

// beginEarly starts the capture of the request's observation now, when
// the page has nothing pending and nothing drawing on its own; a capture
// started by an earlier action of the request is dropped.
func (s *Session) beginEarly(ctx context.Context, t *tab) {
	e := earlyOf(ctx)
	if e == nil || !s.reuses() {
		return
	}
	e.mu.Lock()
	e.t, e.res = nil, nil
	e.mu.Unlock()
	t.mu.Lock()
	saturated := t.saturatedLocked()
	t.mu.Unlock()
	if saturated {
		return
	}
	quiet, _, _ := s.settleParams(ctx, s.opts.SettleTimeout)
	fs, err := s.frameCheck(ctx, t, quiet)
	if err != nil || !fs.still() {
		return
	}
	t.mu.Lock()
	busy := t.busyLocked() || t.loading || t.dialog != nil || t.crashed
	docs, reqs, crashes := t.docs, t.reqs, t.crashes
	// The tab's last capture may serve (a click that changed nothing):
	// no capture then, unless the compositor reports a frame meanwhile.
	kp := t.kept
	reusable := kp != nil && kp.key.format == shotFormat(e.o) && kp.key.quality == shotQuality(e.o) && t.stillShowsLocked(kp, fs)
	t.mu.Unlock()
	if busy || reusable {
		return
	}
	s.watchDamage(ctx, t)
	res := make(chan earlyResult, 1)
	asked := time.Now()
	e.mu.Lock()
	e.t, e.at, e.docs, e.reqs, e.crashes, e.asked, e.res = t, fs.Now, docs, reqs, crashes, asked, res
	e.mu.Unlock()
	o := e.o
	go func() {
		shot, err := s.screenshot(ctx, t, o, pageState{}, 1, 0, 0)
		done := time.Now()
		if err == nil {
			t.captured(done.Sub(asked))
		}
		res <- earlyResult{shot: shot, done: done, err: err}
	}()
}

// take returns the early capture when it shows the page as fs sees it:
// nothing changed on the tab since it was asked for.
func (e *earlyShot) take(ctx context.Context, t *tab, fs *frameState) (*Screenshot, time.Time, time.Time, bool) {
	if e == nil {
		return nil, time.Time{}, time.Time{}, false
	}
	e.mu.Lock()
	et, at, docs, reqs, crashes, asked, res := e.t, e.at, e.docs, e.reqs, e.crashes, e.asked, e.res
	e.t, e.res = nil, nil
	e.mu.Unlock()
	if et != t || res == nil || !fs.still() || fs.Changed > at {
		return nil, time.Time{}, time.Time{}, false
	}
	t.mu.Lock()
	same := t.docs == docs && t.reqs == reqs && t.crashes == crashes && !t.loading && t.dialog == nil && !t.busyLocked()
	t.mu.Unlock()
	if !same {
		return nil, time.Time{}, time.Time{}, false
	}
	select {
	case r := <-res:
		if r.err != nil {
			return nil, time.Time{}, time.Time{}, false
		}
		return r.shot, asked, r.done, true
	case <-ctx.Done():
		return nil, time.Time{}, time.Time{}, false
	}
}
