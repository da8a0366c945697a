package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	_ "image/jpeg" // screenshot headers
	_ "image/png"
	"math"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/target"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// ObserveOptions choose the parts of an observation (api.Observe; the
// screenshot is a JPEG unless asked otherwise).
type ObserveOptions = api.Observe

// Observation is what the agent sees of the active tab.
type Observation = api.BrowserObservation

// ViewportState is the viewport and the page under it, in CSS pixels.
type ViewportState = api.ViewportState

// Screenshot is an encoded image; Data is base64 in JSON.
type Screenshot = api.Screenshot

// Element is one set-of-marks element.
type Element = api.Element

// Dialog is an open JavaScript dialog.
type Dialog = api.Dialog

// ObserveTiming says where an observation's time went, in milliseconds.
type ObserveTiming = api.ObserveTiming

// pageState is the page library's observe answer.
type pageState struct {
	URL      string  `json:"url"`
	Title    string  `json:"title"`
	VW       float64 `json:"vw"`
	VH       float64 `json:"vh"`
	SX       float64 `json:"sx"`
	SY       float64 `json:"sy"`
	PW       float64 `json:"pw"`
	PH       float64 `json:"ph"`
	Elements []Element
	AX       string `json:"ax"`
	Text     string `json:"text"`
	Wall     string `json:"wall"`
	// FC is the page's side of frame reuse, when asked for (reuse.go).
	FC *frameState `json:"fc"`
}

// Limits of an observation. maxShotPixels: Chromium cannot encode a
// screenshot taller than 16384 pixels. textMax bounds the visible text so
// one long page cannot flood a model's context.
const (
	maxShotPixels = 16384
	textMax       = 100_000
)

func validateObserve(o ObserveOptions) error {
	switch o.Screenshot {
	case "", "jpeg", "png", "none":
	default:
		return errInvalid("observe: screenshot must be jpeg, png or none")
	}
	if o.Quality < 0 || o.Quality > 100 {
		return errInvalid("observe: quality must be 1 to 100")
	}
	if o.Width < 0 {
		return errInvalid("observe: width must not be negative")
	}
	if o.Scale < 0 || o.Scale > 1 || math.IsNaN(o.Scale) {
		return errInvalid("observe: scale must be above 0 and at most 1")
	}
	return nil
}

// Observe captures the active tab. A tab blocked by a dialog is observed
// without its page (url, title, tabs and the dialog only), since the page
// cannot answer until the dialog is closed.
func (s *Session) Observe(ctx context.Context, o ObserveOptions) (Observation, error) {
	start := time.Now()
	if err := validateObserve(o); err != nil {
		return Observation{}, err
	}
	t, err := s.activeTab(ctx)
	if err != nil {
		return Observation{}, err
	}
	if t.isCrashed() {
		return Observation{}, faults.New(faults.CodeBrowserTabCrashed, faults.Unavailable, faults.Browser,
			"observe: the tab's renderer crashed; navigate or reload to revive it")
	}
	if d := t.openDialog(); d != nil {
		return s.dialogObservation(ctx, t, d, start), nil
	}
	if err := s.toFront(ctx, t); err != nil {
		return Observation{}, err
	}

	opts := map[string]any{"som": o.SOM || o.Marks, "ax": o.AXTree, "text": o.Text, "full": o.FullPage, "textMax": textMax}
	reuse := keyable(o) && !s.opts.AlwaysCapture
	if reuse {
		quiet, _, _ := s.settleParams(ctx, s.opts.SettleTimeout)
		opts["fc"] = max(quiet.Milliseconds(), 1)
	}
	js, _ := json.Marshal(opts)
	var st pageState
	pageStart := time.Now()
	if err := t.evalInto(ctx, libExpr("observe("+string(js)+")"), false, s.opts.CallTimeout, &st); err != nil {
		if d := t.openDialog(); d != nil {
			return s.dialogObservation(ctx, t, d, start), nil
		}
		return Observation{}, s.classify(ctx, t, "observe", err)
	}
	t.mu.Lock()
	t.url, t.title = st.URL, st.Title
	t.mu.Unlock()
	obs := Observation{
		URL: st.URL, Title: st.Title,
		Viewport: ViewportState{
			Width: int(st.VW), Height: int(st.VH), ScrollX: st.SX, ScrollY: st.SY, PageWidth: st.PW, PageHeight: st.PH,
		},
		AXTree: st.AX, Text: st.Text, Blocked: st.Wall,
	}
	obs.Timing.PageMS = msSince(pageStart)

	baseW, baseH := st.VW, st.VH
	if o.FullPage {
		baseW, baseH = st.PW, st.PH
	}
	scale := 1.0
	switch {
	case o.Width > 0:
		if float64(o.Width) < baseW {
			scale = float64(o.Width) / baseW
		}
	case o.Scale > 0:
		scale = o.Scale
	}
	if o.FullPage && baseH*scale > maxShotPixels {
		baseH = math.Floor(maxShotPixels / scale)
	}
	obs.Scale = scale

	if o.Screenshot != "none" {
		shotStart := time.Now()
		shot, frame, err := s.observeShot(ctx, t, o, st, reuse, scale, baseW, baseH)
		if err != nil {
			if d := t.openDialog(); d != nil {
				return s.dialogObservation(ctx, t, d, start), nil
			}
			return Observation{}, err
		}
		obs.Screenshot = shot
		obs.Timing.ScreenshotMS = msSince(shotStart)
		obs.Timing.Frame = frame
	}

	obs.Elements = make([]Element, 0, len(st.Elements))
	for _, e := range st.Elements {
		for i := range e.BBox {
			e.BBox[i] = math.Round(e.BBox[i]*scale*10) / 10
		}
		obs.Elements = append(obs.Elements, e)
	}
	if !(o.SOM || o.Marks) {
		obs.Elements = nil
	}
	if o.Marks && obs.Screenshot != nil && len(obs.Elements) > 0 {
		marksStart := time.Now()
		if err := drawMarks(obs.Screenshot, obs.Elements, shotQuality(o)); err != nil {
			s.log.Warn("draw marks", "error", err)
		}
		obs.Timing.MarksMS = msSince(marksStart)
	}

	obs.Frame = s.recordFrame(t, scale, o.FullPage)
	obs.Tabs = s.Tabs()
	obs.Downloads = s.Downloads()
	obs.Dialog = t.openDialog()
	obs.Timing.TotalMS = msSince(start)
	return obs, nil
}

// observeShot is the observation's screenshot: a step's early capture or
// the tab's last one when they still show the page (reuse.go), else a new
// one.
func (s *Session) observeShot(ctx context.Context, t *tab, o ObserveOptions, st pageState, reuse bool, scale, w, h float64) (*Screenshot, string, error) {
	if !reuse {
		shot, err := s.screenshot(ctx, t, o, st, scale, w, h)
		return shot, frameCaptured, err
	}
	k := keyOf(o, st)
	if shot, asked, done, ok := earlyOf(ctx).take(ctx, t, st.FC); ok {
		t.keep(k, shot, st.FC, asked, done)
		return shot, frameEarly, nil
	}
	fs := st.FC
	for range 2 {
		shot, wait := t.reusable(k, fs)
		if shot != nil {
			return shot, frameReused, nil
		}
		if wait <= 0 {
			break
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, "", faults.Of(context.Cause(ctx))
		}
		quiet, _, _ := s.settleParams(ctx, s.opts.SettleTimeout)
		var err error
		if fs, err = s.frameCheck(ctx, t, quiet); err != nil {
			break
		}
	}
	s.watchDamage(ctx, t)
	asked := time.Now()
	shot, err := s.screenshot(ctx, t, o, st, scale, w, h)
	if err != nil {
		return nil, "", err
	}
	done := time.Now()
	t.captured(done.Sub(asked))
	t.keep(k, shot, st.FC, asked, done)
	return shot, frameCaptured, nil
}

func shotQuality(o ObserveOptions) int {
	if o.Quality <= 0 {
		return 80
	}
	return o.Quality
}

func shotFormat(o ObserveOptions) string {
	if o.Screenshot == "" {
		return "jpeg"
	}
	return o.Screenshot
}

func (s *Session) screenshot(ctx context.Context, t *tab, o ObserveOptions, st pageState, scale, w, h float64) (*Screenshot, error) {
	p := page.CaptureScreenshotParams{OptimizeForSpeed: new(true)}
	format := shotFormat(o)
	if format == "png" {
		p.Format = page.CaptureScreenshotFormatPng
	} else {
		p.Format = page.CaptureScreenshotFormatJpeg
		p.Quality = new(int64(shotQuality(o)))
	}
	switch {
	case o.FullPage:
		p.CaptureBeyondViewport = new(true)
		p.Clip = &page.Viewport{X: 0, Y: 0, Width: w, Height: h, Scale: scale}
	case scale != 1:
		// The clip is in document coordinates: the viewport as scrolled.
		p.Clip = &page.Viewport{X: st.SX, Y: st.SY, Width: w, Height: h, Scale: scale}
	}
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	defer cancel()
	asked := time.Now()
	t.capturing(asked)
	res, err := cdp.Call(cctx, t.target, page.CaptureScreenshot, p)
	t.captureEnded(asked, time.Now())
	if err != nil {
		return nil, s.classify(cctx, t, "screenshot", err)
	}
	cfg, _, err := image.DecodeConfig(bytes.NewReader(res.Data))
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeBrowserProtocol, faults.Internal, faults.Browser, "screenshot: undecodable image")
	}
	return &Screenshot{Format: format, Data: res.Data, Width: cfg.Width, Height: cfg.Height}, nil
}

// dialogObservation is the observation of a tab that a dialog blocks. The
// page cannot answer; the browser still knows its URL and title.
func (s *Session) dialogObservation(ctx context.Context, t *tab, d *Dialog, start time.Time) Observation {
	cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	info, err := cdp.Call(cctx, s.b, target.GetTargetInfo, target.GetTargetInfoParams{TargetID: t.id})
	cancel()
	t.mu.Lock()
	if err == nil && info.TargetInfo != nil {
		t.url, t.title = info.TargetInfo.URL, info.TargetInfo.Title
	}
	url, title := t.url, t.title
	t.mu.Unlock()
	fi, _ := s.frameFor(t, Action{})
	scale := fi.scale
	if scale <= 0 {
		scale = 1
	}
	return Observation{
		Frame:     s.recordFrame(t, scale, fi.fullPage),
		Scale:     scale,
		URL:       url,
		Title:     title,
		Tabs:      s.Tabs(),
		Viewport:  ViewportState{Width: s.viewport().Width, Height: s.viewport().Height},
		Dialog:    d,
		Downloads: s.Downloads(),
		Timing:    ObserveTiming{TotalMS: msSince(start)},
	}
}

// Screenshot is a convenience for GET /browser/screenshot: an observation
// with a screenshot and nothing else, so that its frame and scale go with
// the image.
func (s *Session) Screenshot(ctx context.Context, o ObserveOptions) (Observation, error) {
	if o.Screenshot == "none" {
		return Observation{}, errInvalid("screenshot: format none")
	}
	obs, err := s.Observe(ctx, ObserveOptions{Screenshot: shotFormat(o), Quality: o.Quality, Width: o.Width, Scale: o.Scale, FullPage: o.FullPage})
	if err != nil {
		return Observation{}, err
	}
	if obs.Screenshot == nil {
		return Observation{}, faults.New(faults.CodeActionDialogOpen, faults.Conflict, faults.Policy,
			fmt.Sprintf("screenshot: a %s dialog blocks the page", obs.Dialog.Type))
	}
	return obs, nil
}
