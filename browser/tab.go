package browser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	jsonv2 "github.com/chromedp/cdproto/cdp/jsonv2"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/inspector"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"github.com/orchard/orchard/faults"
)

// tab is one page target and what the session knows about it.
type tab struct {
	s *Session
	// id is written once, under mu, before the tab is listed in the
	// session; onEvent reads it under mu.
	id     target.ID
	opener target.ID
	// ctx is the tab's chromedp context; cancel closes the tab (for the
	// first tab, ctx is the session's root context).
	ctx    context.Context
	cancel context.CancelFunc
	target *chromedp.Target
	// ready closes once the tab is attached and set up; readyErr says
	// whether that worked.
	ready    chan struct{}
	readyErr error
	// gone closes when the session forgets the tab (it closed).
	gone chan struct{}

	// act serialises actions on this tab; observations do not take it.
	act sync.Mutex

	mu         sync.Mutex // guards the fields below
	url, title string
	dialog     *Dialog
	crashed    bool
	crashes    int64 // renderer crashes so far
	// changed closes (and is replaced) whenever a field below changes, so
	// waiters can block on the next change.
	changed chan struct{}
	// intr is cancelled while a call must not proceed: a dialog is open,
	// the renderer crashed, the tab closed. Calls derive from it.
	intr       context.Context
	intrCancel context.CancelCauseFunc
	// inflight are network requests without an end yet, with their start.
	inflight map[network.RequestID]time.Time
	// docRequests are the main frame's document requests in flight.
	docRequests map[network.RequestID]string
	// reqs counts the requests sent; lastSettle is why the last settle
	// wait ended (settleJS).
	reqs       int64
	lastSettle string
	loading    bool
	// loads counts main-frame load events; loaded is the loader of the last.
	loads  int64
	loaded cdp.LoaderID
	// docs counts main-frame documents (cross-document navigations).
	docs int64
	// navs counts main-document outcomes; lastNav is the latest.
	navs    int64
	lastNav navOutcome
	// lastFrame is the latest observation frame taken on this tab.
	lastFrame int64
	// kept is the tab's last capture; dmg what its damage screencast
	// reported (reuse.go).
	kept *keptShot
	dmg  damage
	// lastInput is when the last action that sends input was answered.
	lastInput time.Time
}

// navOutcome is how the main document of a navigation ended.
type navOutcome struct {
	url        string
	loader     cdp.LoaderID
	status     int
	statusText string
	errorText  string
	canceled   bool
}

// failure returns the classified failure of a main-document load, or nil.
func (n navOutcome) failure() *faults.Error {
	switch {
	case n.errorText != "":
		if n.canceled || strings.Contains(n.errorText, "ERR_ABORTED") {
			return nil // replaced by another navigation, or became a download
		}
		return netError(n.errorText, n.url)
	case n.status >= 400:
		return httpError(n.status, n.statusText, n.url)
	}
	return nil
}

func newTab(s *Session, id target.ID) *tab {
	t := &tab{
		s:           s,
		id:          id,
		ready:       make(chan struct{}),
		gone:        make(chan struct{}),
		changed:     make(chan struct{}),
		inflight:    make(map[network.RequestID]time.Time),
		docRequests: make(map[network.RequestID]string),
	}
	t.intr, t.intrCancel = context.WithCancelCause(context.Background())
	return t
}

func (t *tab) markReady(err error) {
	t.readyErr = err
	close(t.ready)
}

// waitReady waits until the tab is attached.
func (t *tab) waitReady(ctx context.Context) error {
	select {
	case <-t.ready:
	case <-ctx.Done():
		return faults.Of(context.Cause(ctx))
	case <-t.s.done:
		return errClosed()
	}
	if t.readyErr != nil {
		return t.s.classify(ctx, t, "attach to tab", t.readyErr)
	}
	return nil
}

// shellFonts are the whole browser's default generic font families on
// Linux (Chromium's locale_settings_linux). The headless shell has other
// defaults (its monospace resolved to another font, so a textarea or a
// code block came out a different size); with these set on each tab it
// draws pages as the whole browser does (TestRenderAlike).
var shellFonts = page.FontFamilies{
	Standard: "Times New Roman", Fixed: "Monospace", Serif: "Times New Roman",
	SansSerif: "Arial", Cursive: "Comic Sans MS", Fantasy: "Impact",
}

// applyViewport sizes the tab's viewport (and screen) to v.
func (t *tab) applyViewport(ctx context.Context, v Viewport) error {
	if _, err := cdp.Call(ctx, t.target, emulation.SetDeviceMetricsOverride, emulation.SetDeviceMetricsOverrideParams{
		Width: int64(v.Width), Height: int64(v.Height), DeviceScaleFactor: 1,
		ScreenWidth: int64(v.Width), ScreenHeight: int64(v.Height),
	}); err != nil {
		return fmt.Errorf("set viewport: %w", err)
	}
	return nil
}

// setup applies the session's emulation to a freshly attached tab. The
// viewport is set explicitly: in new headless, --window-size gives a
// smaller viewport than asked.
func (t *tab) setup(ctx context.Context) error {
	o := t.s.opts
	if err := t.applyViewport(ctx, t.s.viewport()); err != nil {
		return err
	}
	if o.UserAgent != "" || o.Locale != "" {
		ua := o.UserAgent
		if ua == "" {
			v, err := cdp.Call(ctx, t.s.b, cdpbrowser.GetVersion, cdp.Empty{})
			if err != nil {
				return fmt.Errorf("get version: %w", err)
			}
			ua = v.UserAgent
		}
		if _, err := cdp.Call(ctx, t.target, emulation.SetUserAgentOverride, emulation.SetUserAgentOverrideParams{
			UserAgent: ua, AcceptLanguage: o.Locale,
		}); err != nil {
			return fmt.Errorf("set user agent: %w", err)
		}
	}
	if o.Locale != "" {
		if _, err := cdp.Call(ctx, t.target, emulation.SetLocaleOverride, emulation.SetLocaleOverrideParams{Locale: o.Locale}); err != nil {
			return fmt.Errorf("set locale: %w", err)
		}
	}
	if o.Timezone != "" {
		if _, err := cdp.Call(ctx, t.target, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: o.Timezone}); err != nil {
			return fmt.Errorf("set timezone: %w", err)
		}
	}
	if t.s.shell {
		if _, err := cdp.Call(ctx, t.target, page.SetFontFamilies, page.SetFontFamiliesParams{FontFamilies: &shellFonts}); err != nil {
			return fmt.Errorf("set font families: %w", err)
		}
	}
	if !o.PlainSettle {
		if _, err := cdp.Call(ctx, t.target, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: pendingJS, RunImmediately: new(true),
		}); err != nil {
			return fmt.Errorf("install pending-work tracker: %w", err)
		}
	}
	if o.FastFrames {
		// Installed in every document the tab loads from now on, and in the
		// one it shows (a popup is attached after its page started).
		if _, err := cdp.Call(ctx, t.target, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: pacerJS, RunImmediately: new(true),
		}); err != nil {
			return fmt.Errorf("install frame pacer: %w", err)
		}
	}
	// A page opened by another may already show a dialog or be loading.
	t.mu.Lock()
	t.url = ""
	t.mu.Unlock()
	info, err := cdp.Call(ctx, t.s.b, target.GetTargetInfo, target.GetTargetInfoParams{TargetID: t.id})
	if err == nil && info.TargetInfo != nil {
		t.mu.Lock()
		t.url, t.title = info.TargetInfo.URL, info.TargetInfo.Title
		t.mu.Unlock()
	}
	return nil
}

// signal wakes waiters. Callers hold t.mu.
func (t *tab) signal() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// interrupt fails calls in flight and new ones with cause until resume.
func (t *tab) interrupt(cause error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.interruptLocked(cause)
}

func (t *tab) interruptLocked(cause error) {
	if t.intr.Err() == nil {
		t.intrCancel(cause)
	}
	t.signal()
}

// resumeLocked lifts an interrupt whose cause is gone.
func (t *tab) resumeLocked(cause error) {
	if t.intr.Err() != nil && errors.Is(context.Cause(t.intr), cause) {
		t.intr, t.intrCancel = context.WithCancelCause(context.Background())
	}
}

func (t *tab) isCrashed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.crashed
}

func (t *tab) openDialog() *Dialog {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dialog
}

// callCtx derives the context of one protocol call: it ends at ctx's end,
// after d (cause errCallTimeout), or when the tab is interrupted, unless
// the interrupt's cause is one of immune.
func (t *tab) callCtx(ctx context.Context, d time.Duration, immune ...error) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	tctx, tcancel := context.WithTimeoutCause(cctx, d, errCallTimeout)
	t.mu.Lock()
	intr := t.intr
	t.mu.Unlock()
	fire := func() {
		cause := context.Cause(intr)
		for _, e := range immune {
			if errors.Is(cause, e) {
				return
			}
		}
		cancel(cause)
	}
	if intr.Err() != nil {
		fire()
		return tctx, func() { tcancel(); cancel(nil) }
	}
	stop := context.AfterFunc(intr, fire)
	return tctx, func() { stop(); tcancel(); cancel(nil) }
}

// onEvent runs on the tab's read loop: it must return fast and never call
// the browser.
func (t *tab) onEvent(ev any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// A page's main frame has the target's id. Until the id is known (the
	// first moments of an attach) every frame counts as the main one.
	main := cdp.FrameID(t.id)
	isMain := func(id cdp.FrameID) bool { return main == "" || id == main }
	switch ev := ev.(type) {
	case *page.EventScreencastFrame:
		t.onCastFrame(ev)
		return
	case *page.EventJavascriptDialogOpening:
		t.dialog = &Dialog{Type: string(ev.Type), Message: ev.Message, DefaultPrompt: ev.DefaultPrompt, URL: ev.URL}
		if t.s.opts.AutoAcceptDialogs {
			prompt, text := ev.Type == page.DialogTypePrompt, ev.DefaultPrompt
			t.s.background(func() { t.autoAccept(prompt, text) })
		} else {
			t.interruptLocked(errDialogOpen)
		}
	case *page.EventJavascriptDialogClosed:
		t.dialog = nil
		t.resumeLocked(errDialogOpen)
	case *inspector.EventTargetCrashed:
		t.crashed = true
		t.crashes++
		t.interruptLocked(errTabCrashed)
	case *page.EventFrameNavigated:
		if ev.Frame == nil || ev.Frame.ParentID != "" || !isMain(ev.Frame.ID) {
			return
		}
		t.url = ev.Frame.URL + ev.Frame.URLFragment
		t.docs++
		if t.crashed {
			t.crashed = false
			t.resumeLocked(errTabCrashed)
		}
	case *page.EventNavigatedWithinDocument:
		if isMain(ev.FrameID) {
			t.url = ev.URL
		}
	case *page.EventFrameStartedLoading:
		if isMain(ev.FrameID) {
			t.loading = true
		}
	case *page.EventFrameStoppedLoading:
		if isMain(ev.FrameID) {
			t.loading = false
		}
	case *page.EventLifecycleEvent:
		if ev.Name == "load" && isMain(ev.FrameID) {
			t.loads++
			t.loaded = ev.LoaderID
		}
	case *network.EventRequestWillBeSent:
		if ev.Type == network.ResourceTypeWebSocket || ev.Type == network.ResourceTypeEventSource {
			return
		}
		t.inflight[ev.RequestID] = time.Now()
		t.reqs++
		if ev.Type == network.ResourceTypeDocument && isMain(ev.FrameID) && ev.Request != nil {
			t.docRequests[ev.RequestID] = ev.Request.URL
		}
	case *network.EventResponseReceived:
		if _, ok := t.docRequests[ev.RequestID]; ok && ev.Response != nil {
			t.lastNav = navOutcome{url: ev.Response.URL, loader: ev.LoaderID, status: int(ev.Response.Status), statusText: ev.Response.StatusText}
			t.navs++
		}
	case *network.EventLoadingFinished:
		delete(t.inflight, ev.RequestID)
		delete(t.docRequests, ev.RequestID)
	case *network.EventLoadingFailed:
		delete(t.inflight, ev.RequestID)
		if u, ok := t.docRequests[ev.RequestID]; ok {
			delete(t.docRequests, ev.RequestID)
			t.lastNav = navOutcome{url: u, errorText: ev.ErrorText, canceled: ev.Canceled}
			t.navs++
		}
	default:
		return
	}
	t.signal()
}

// autoAccept answers a dialog as it opens (Options.AutoAcceptDialogs).
func (t *tab) autoAccept(prompt bool, text string) {
	ctx, cancel := context.WithTimeout(context.Background(), t.s.opts.CallTimeout)
	defer cancel()
	p := page.HandleJavaScriptDialogParams{Accept: true}
	if prompt {
		p.PromptText = text
	}
	select {
	case <-t.ready:
	case <-t.s.done:
		return
	}
	if _, err := cdp.Call(ctx, t.target, page.HandleJavaScriptDialog, p); err != nil && !t.s.isClosing() {
		t.s.log.Debug("auto-accept dialog", "error", err)
	}
}

// waitUntil blocks until cond (called with t.mu held) is true, d passes,
// ctx ends or the session does (closed, or the browser gone). It reports
// whether cond became true.
func (t *tab) waitUntil(ctx context.Context, d time.Duration, cond func() bool) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	lost := t.s.lostConnection()
	for {
		t.mu.Lock()
		ok := cond()
		ch := t.changed
		t.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			t.mu.Lock()
			defer t.mu.Unlock()
			return cond()
		case <-ctx.Done():
			return false
		case <-t.s.done:
			return false
		case <-lost:
			return false
		}
	}
}

// longRequest is how old a request in flight may be before the idle check
// ignores it: long polls and streams never end and must not block every
// step.
const longRequest = 5 * time.Second

// busyLocked reports requests in flight that are not long-running.
func (t *tab) busyLocked() bool {
	now := time.Now()
	for _, start := range t.inflight {
		if now.Sub(start) < longRequest {
			return true
		}
	}
	return false
}

// settleJS resolves once the document has had no mutation for quiet ms
// after its last one, or saw none at all for idle ms, or after max ms —
// or, with floor ≥ 0, as soon as a frame was drawn (what input changes
// without script, a scroll, shows then) and floor ms have passed (since
// the start and since the last mutation) with no work pending in the
// document or its frames (pending.js: timers due within quiet ms, frame
// callbacks, a navigation under way). A frame without the tracker
// (cross-origin, not yet scripted) makes the pending work unknown: the
// windows apply. It resolves to why it ended.
const settleJS = `(function(quiet, idle, max, floor){return new Promise(function(resolve){
var K=Symbol.for('orchard.pending'), T=window[K], st=T?T.setTimeout:setTimeout;
var start=performance.now(), last=start, seen=false, mo=null, framed=false;
if(floor>=0&&T&&T.requestAnimationFrame)T.requestAnimationFrame.call(window,function(){framed=true});
try{mo=new MutationObserver(function(){last=performance.now();seen=true});mo.observe(document,{subtree:true,childList:true,attributes:true,characterData:true});}catch(e){}
function pend(win,depth){var P=win[K];if(!P)return -1;var n=P.pending(quiet);
for(var i=0;i<win.frames.length;i++){if(depth>3||i>=50)return -1;var c;try{c=pend(win.frames[i],depth+1)}catch(e){return -1}if(c<0)return -1;n+=c}return n}
function end(how){if(mo)mo.disconnect();resolve(how)}
function tick(){var now=performance.now(),p=-1;
if(floor>=0&&framed&&now-start>=floor&&(!seen||now-last>=floor)){try{p=pend(window,0)}catch(e){}if(p===0)return end('nothing pending')}
if(seen?now-last>=quiet:now-start>=idle)return end(seen?'quiet':'idle');
if(now-start>=max)return end('timeout');
var next=seen?quiet-(now-last):idle-(now-start);if(floor>=0)next=Math.min(next,5);
st.call(window,tick,Math.max(floor>=0?1:5,Math.min(next,50)))}
st.call(window,tick,floor>=0?Math.min(floor,idle,max):Math.min(idle,max));})})`

// settleFloor is the least the settle wait lasts when the page's tracker
// sees nothing pending: time for what the tracker cannot see (a message
// posted to the page itself, a worker's answer) to begin.
const settleFloor = 10 * time.Millisecond

// settle waits, within limit, for the page to be quiet: loaded, no
// request in flight, and no DOM mutation for SettleQuiet after the last
// one (or none at all for SettleIdle) — or nothing pending in the page
// (pending.js) after settleFloor. It never fails the action: a page that
// does not settle in time is observed as it is.
func (t *tab) settle(ctx context.Context, limit time.Duration) {
	t.settleAfter(ctx, limit, t.requests())
}

// requests is how many requests the tab has sent so far.
func (t *tab) requests() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reqs
}

// settleAfter is settle for an action that began when the tab had sent
// reqs requests: one the action itself sent counts as seen.
func (t *tab) settleAfter(ctx context.Context, limit time.Duration, reqs int64) {
	quiet, idle, limit := t.s.settleParams(ctx, limit)
	deadline := time.Now().Add(limit)
	// The tracker cannot follow a response into the page's handlers (its
	// body read, the parse): once a request was seen during the wait, the
	// rest of it keeps to the windows.
	floor := min(settleFloor, idle).Milliseconds() // -1: keep to the windows
	if t.s.opts.PlainSettle {
		floor = -1
	}
	for i := 0; i < 4; i++ {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return
		}
		if t.openDialog() != nil || t.isCrashed() {
			return
		}
		// A navigation in progress: wait for it first.
		if !t.waitUntil(ctx, left, func() bool { return !t.loading || t.dialog != nil }) {
			return
		}
		left = time.Until(deadline)
		if left <= 0 {
			return
		}
		expr := fmt.Sprintf("%s(%d,%d,%d,%d)", settleJS, quiet.Milliseconds(), idle.Milliseconds(), left.Milliseconds(), floor)
		how, err := t.eval(ctx, expr, true, left+time.Second)
		if err != nil && (t.openDialog() != nil || ctx.Err() != nil) {
			return
		}
		// err: the document went away under the script (a navigation);
		// the loop waits for the new one.
		var busy, loading, requested bool
		t.mu.Lock()
		busy, loading, requested = t.busyLocked(), t.loading, t.reqs != reqs
		t.lastSettle = string(how)
		t.mu.Unlock()
		early := string(how) == `"nothing pending"`
		if err == nil && !busy && !loading && !(early && requested) {
			return
		}
		if requested {
			floor = -1
		}
		t.waitUntil(ctx, time.Until(deadline), func() bool { return !t.busyLocked() && !t.loading || t.dialog != nil })
	}
}

// eval evaluates expr in the page's main world and returns its value
// (JSON), awaiting a promise when await is set. A thrown exception is an
// error.
func (t *tab) eval(ctx context.Context, expr string, await bool, d time.Duration) (jsonv2.Value, error) {
	cctx, cancel := t.callCtx(ctx, d)
	defer cancel()
	res, err := cdp.Call(cctx, t.target, runtime.Evaluate, runtime.EvaluateParams{
		Expression:    expr,
		ReturnByValue: new(true),
		AwaitPromise:  new(await),
		UserGesture:   new(true),
	})
	if err != nil {
		return nil, t.s.classify(cctx, t, "evaluate", err)
	}
	if res.ExceptionDetails != nil {
		return nil, fmt.Errorf("script error: %s", exceptionText(res.ExceptionDetails))
	}
	if res.Result == nil {
		return nil, nil
	}
	return res.Result.Value, nil
}

// evalInto evaluates expr and decodes its JSON value into v.
func (t *tab) evalInto(ctx context.Context, expr string, await bool, d time.Duration, v any) error {
	raw, err := t.eval(ctx, expr, await, d)
	if err != nil {
		return err
	}
	if len(raw) == 0 {
		return errors.New("script returned nothing")
	}
	return json.Unmarshal(raw, v)
}

func exceptionText(d *runtime.ExceptionDetails) string {
	if d.Exception != nil && d.Exception.Description != "" {
		return d.Exception.Description
	}
	return d.Text
}
