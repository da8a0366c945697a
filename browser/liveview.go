package browser

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/orchard/orchard/faults"
)

// The live view is a CDP screencast (Page.startScreencast) of the active
// tab, on a DevTools session of its own so that it never queues behind the
// agent's calls, shared by every viewer that asks for the same quality and
// width. Chromium sends a frame when the page draws something new: a still
// page costs nothing, an animation arrives as it is drawn, and no capture
// forces a frame the page would not have drawn.
const (
	// liveMaxFPS caps the frames Chromium encodes for one screencast: each
	// frame is acknowledged no sooner than this allows, and Chromium sends
	// the next only once the last is acknowledged.
	liveMaxFPS = 10
	// liveRestart restarts a screencast that has sent nothing for this
	// long. A still page then yields a fresh frame now and then, and a
	// screencast that stopped (the tab's renderer was replaced) resumes.
	liveRestart = 2 * time.Second
	// livePoll is how often a waiting viewer checks that the cast still
	// follows the active tab.
	livePoll = 250 * time.Millisecond
)

type liveKey struct{ quality, width int }

// screencast is one running Page.startScreencast and its latest frame.
type screencast struct {
	s   *Session
	key liveKey

	op      sync.Mutex // serialises ensure: one (re)start at a time
	mu      sync.Mutex
	viewers int // guarded by s.liveMu, not mu
	frame   []byte
	seq     uint64
	fresh   chan struct{} // closed when a frame arrives, then replaced
	tab     *tab          // the tab cast; nil before the first start
	ctx     context.Context
	cancel  context.CancelFunc // detaches the cast's session
	last    time.Time          // the cast's start or its latest frame
	prev    time.Time          // when the latest frame came
}

// LiveView is one viewer of the session's live view. Close it when done.
type LiveView struct {
	c      *screencast
	once   sync.Once
	closed atomic.Bool // Next after Close must not start a cast nobody stops
}

// Watch joins (or starts) the live view at JPEG quality 1–100 (0 means
// 60), scaled down to width pixels when the viewport is wider (0 keeps the
// size).
func (s *Session) Watch(quality, width int) (*LiveView, error) {
	if err := s.Err(); err != nil {
		return nil, err
	}
	if quality <= 0 || quality > 100 {
		quality = 60
	}
	if width < 0 {
		width = 0
	}
	key := liveKey{quality, width}
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	if s.casts == nil {
		s.casts = map[liveKey]*screencast{}
	}
	c := s.casts[key]
	if c == nil {
		c = &screencast{s: s, key: key, fresh: make(chan struct{})}
		s.casts[key] = c
	}
	c.viewers++
	return &LiveView{c: c}, nil
}

// Close leaves the live view; the last viewer to leave stops the cast.
func (v *LiveView) Close() {
	v.once.Do(func() {
		v.closed.Store(true)
		c := v.c
		s := c.s
		s.liveMu.Lock()
		c.viewers--
		last := c.viewers == 0
		if last {
			delete(s.casts, c.key)
		}
		s.liveMu.Unlock()
		if last {
			c.stop()
		}
	})
}

// Next returns the newest frame and its number once there is one newer
// than after (0: any frame). When none comes within wait it returns the
// newest again, so a viewer of a still page can repeat it; before the
// first frame it keeps waiting, and fails after wait with no frame at all.
// A dialog that blocks the page before any frame, a crashed tab and a dead
// browser are errors.
func (v *LiveView) Next(ctx context.Context, after uint64, wait time.Duration) ([]byte, uint64, error) {
	c, s := v.c, v.c.s
	deadline := time.Now().Add(wait)
	for {
		if v.closed.Load() {
			return nil, 0, faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "live view: closed")
		}
		if err := s.Err(); err != nil {
			return nil, 0, err
		}
		t, err := s.activeTab(ctx)
		if err != nil {
			return nil, 0, err
		}
		if t.isCrashed() {
			return nil, 0, faults.New(faults.CodeBrowserTabCrashed, faults.Unavailable, faults.Browser,
				"live view: the tab's renderer crashed")
		}
		c.mu.Lock()
		frame, seq, fresh := c.frame, c.seq, c.fresh
		c.mu.Unlock()
		// A page blocked by a dialog cannot be attached to (attaching
		// evaluates a script): its last frame stays up, and with none yet
		// the dialog is the answer.
		if d := t.openDialog(); d != nil {
			if frame == nil {
				return nil, 0, faults.New(faults.CodeActionDialogOpen, faults.Conflict, faults.Policy,
					fmt.Sprintf("live view: a %s dialog blocks the page", d.Type))
			}
		} else if err := c.ensure(ctx, t); err != nil {
			return nil, 0, err
		}
		if frame != nil && seq > after {
			return frame, seq, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			if frame != nil {
				return frame, seq, nil
			}
			return nil, 0, faults.New(faults.CodeBrowserHung, faults.Unavailable, faults.Browser,
				fmt.Sprintf("live view: no frame from the browser within %s", wait))
		}
		timer := time.NewTimer(min(left, livePoll))
		select {
		case <-fresh:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, 0, faults.Of(context.Cause(ctx))
		}
		timer.Stop()
	}
}

// ensure keeps the cast on t: started, following the active tab, and
// restarted after liveRestart without a frame.
func (c *screencast) ensure(ctx context.Context, t *tab) error {
	c.op.Lock()
	defer c.op.Unlock()
	c.mu.Lock()
	same := c.tab == t && c.ctx != nil && c.ctx.Err() == nil
	stale := time.Since(c.last) >= liveRestart
	cctx := c.ctx
	if same && stale {
		c.last = time.Now()
	}
	c.mu.Unlock()
	switch {
	case same && !stale:
		return nil
	case same:
		// Quiet for a while: start the cast again on the same session,
		// which sends the current frame.
		rctx, cancel := context.WithTimeout(ctx, c.s.opts.CallTimeout)
		defer cancel()
		target := chromedp.FromContext(cctx).Target
		_, err := cdp.Call(rctx, target, page.StopScreencast, cdp.Empty{})
		if err == nil {
			_, err = cdp.Call(rctx, target, page.StartScreencast, c.params())
		}
		if err == nil {
			return nil
		}
	}
	c.stop()
	return c.start(ctx, t)
}

func (c *screencast) params() page.StartScreencastParams {
	return page.StartScreencastParams{Format: page.StartScreencastFormatJpeg, Quality: new(int64(c.key.quality)),
		MaxWidth: int64(c.key.width), MaxFramesInFlight: 1}
}

func (c *screencast) start(ctx context.Context, t *tab) error {
	s := c.s
	// The listener knows its own session, so that a late frame of a cast
	// already replaced is dropped rather than taken or acknowledged.
	var cctx context.Context
	cctx, cancel := chromedp.NewContext(s.rootCtx, chromedp.WithTargetID(t.id), chromedp.WithDetachOnCancel(),
		chromedp.WithListener(func(ev any) { c.onEvent(cctx, ev) }))
	fail := func(err error) error {
		cancel()
		if s.Err() != nil {
			return s.Err()
		}
		return s.classify(ctx, t, "live view", err)
	}
	actx, acancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer acancel()
	done := make(chan error, 1)
	go func() { done <- chromedp.Do(cctx) }()
	select {
	case err := <-done:
		if err != nil {
			return fail(err)
		}
	case <-actx.Done():
		cancel()
		<-done
		return fail(context.Cause(actx))
	}
	c.mu.Lock()
	c.tab, c.ctx, c.cancel, c.last = t, cctx, cancel, time.Now()
	c.mu.Unlock()
	if _, err := cdp.Call(actx, chromedp.FromContext(cctx).Target, page.StartScreencast, c.params()); err != nil {
		c.stop()
		return fail(err)
	}
	return nil
}

// stop ends the cast and detaches its session; the tab stays.
func (c *screencast) stop() {
	c.mu.Lock()
	cctx, cancel := c.ctx, c.cancel
	c.ctx, c.cancel = nil, nil
	c.mu.Unlock()
	if cancel == nil {
		return
	}
	if cctx.Err() == nil {
		sctx, scancel := context.WithTimeout(cctx, time.Second)
		_, _ = cdp.Call(sctx, chromedp.FromContext(cctx).Target, page.StopScreencast, cdp.Empty{})
		scancel()
	}
	cancel()
}

// onEvent keeps each frame of the cast on session cctx. Chromium captures
// every frame the page draws while a cast runs, even those it then holds
// back for want of an acknowledgement, so pacing by acknowledgement alone
// would still capture an animation at 60 frames a second: a frame that
// comes sooner than liveMaxFPS allows stops the cast instead, and the cast
// starts again (sending the page as it is then) once the interval is over.
// A page that draws less often gets its frames as they come. onEvent runs
// on the session's event loop, so protocol calls go out from a goroutine.
func (c *screencast) onEvent(cctx context.Context, ev any) {
	e, ok := ev.(*page.EventScreencastFrame)
	if !ok {
		return
	}
	c.mu.Lock()
	if c.ctx != cctx {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	wait := c.prev.Add(time.Second / liveMaxFPS).Sub(now)
	c.frame, c.last, c.prev = e.Data, now, now
	c.seq++
	close(c.fresh)
	c.fresh = make(chan struct{})
	c.mu.Unlock()
	target := chromedp.FromContext(cctx).Target
	go func() {
		call := func(f func(ctx context.Context) error) bool {
			c.op.Lock()
			defer c.op.Unlock()
			c.mu.Lock()
			current := c.ctx == cctx
			c.mu.Unlock()
			if !current {
				return false
			}
			actx, cancel := context.WithTimeout(cctx, time.Second)
			defer cancel()
			return f(actx) == nil
		}
		if wait <= 0 {
			call(func(ctx context.Context) error {
				_, err := cdp.Call(ctx, target, page.ScreencastFrameAck, page.ScreencastFrameAckParams{SessionID: e.SessionID})
				return err
			})
			return
		}
		if !call(func(ctx context.Context) error {
			_, err := cdp.Call(ctx, target, page.StopScreencast, cdp.Empty{})
			return err
		}) {
			return
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-cctx.Done():
			return
		}
		call(func(ctx context.Context) error {
			_, err := cdp.Call(ctx, target, page.StartScreencast, c.params())
			return err
		})
	}()
}
