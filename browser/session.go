package browser

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/inspector"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/chromium"
	"github.com/orchard/orchard/retry"
)

// Session is one running browser with its tabs. All methods are safe for
// concurrent use: actions on a tab run one at a time, observations run
// alongside them.
type Session struct {
	opts Options
	log  *slog.Logger
	// attached counts DevTools clients other than the session (Attached).
	attached atomic.Int64
	detached atomic.Int64 // when the last one left (unix ns)

	allocCancel context.CancelFunc
	// rootCtx is the chromedp context of the first tab; it owns the
	// browser process, which lives until rootCancel.
	rootCtx    context.Context
	rootCancel context.CancelFunc
	b          *chromedp.Browser
	pid        int
	dataDir    string
	ownDataDir bool
	// procName and procStart identify the browser's processes for
	// reaping (see reap).
	procName  string
	procStart uint64
	// shell: the browser is a headless shell, whose default fonts differ
	// from the whole browser's (shellFonts).
	shell bool
	// devToolsURL is the browser's DevTools WebSocket when Options.DevTools.
	devToolsURL string

	closing atomic.Bool
	// done closes when Close starts; background goroutines stop on it.
	done chan struct{}
	// dead closes when the browser is found dead or hung (see Dead).
	dead      chan struct{}
	deadOnce  sync.Once
	closeOnce sync.Once
	closeErr  error
	// wg counts background goroutines: the supervisor, tab adoption and
	// teardown, dialog answers. Start them with background.
	wg   sync.WaitGroup
	bgMu sync.Mutex // guards bgStopped against wg.Add racing Close's wg.Wait
	// bgStopped is set by Close before it waits for wg.
	bgStopped bool

	frameSeq atomic.Int64
	// vp is the viewport SetViewport set; nil: opts.Viewport.
	vp atomic.Pointer[Viewport]

	liveMu sync.Mutex // guards casts and each cast's viewer count
	// casts are the running live views, one per quality and width.
	casts map[liveKey]*screencast

	mu sync.Mutex // guards the fields below
	// tabs in the order they opened; a tab's index is its position.
	tabs   []*tab
	active *tab
	// front is the tab last brought to the front, nil when unknown (a page
	// opened a tab, which Chromium puts in front).
	front     *tab
	crashed   *faults.Error
	downloads []*download
	frames    map[int64]frameInfo
	frameRing []int64
	answer    *string
}

// keptFrames bounds the observation frames remembered for mapping
// coordinates: an agent acts on one of its last few observations, never
// on one from many steps ago.
const keptFrames = 16

// Launch starts a browser and returns a session with one blank tab. ctx
// bounds the start only; the browser lives until Close.
func Launch(ctx context.Context, opts Options) (*Session, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeBrowserLaunch, faults.Unavailable, faults.Browser, "launch browser: "+err.Error()).WithRetryable(false)
	}
	if err := os.MkdirAll(o.DownloadDir, 0o755); err != nil {
		return nil, faults.Wrap(err, faults.CodeBrowserLaunch, faults.Unavailable, faults.Browser, "launch browser: create download dir").WithRetryable(false)
	}
	s := &Session{
		opts:    o,
		log:     o.Logger.With("component", "browser"),
		done:    make(chan struct{}),
		dead:    make(chan struct{}),
		frames:  make(map[int64]frameInfo),
		dataDir: o.UserDataDir,
		shell:   chromium.IsHeadlessShell(o.ExecPath),
	}
	if s.dataDir == "" {
		dir, err := os.MkdirTemp("", "orchard-browser-")
		if err != nil {
			return nil, faults.Wrap(err, faults.CodeBrowserLaunch, faults.Unavailable, faults.Browser, "launch browser: create profile dir")
		}
		s.dataDir, s.ownDataDir = dir, true
	} else if o.DevTools {
		// A kept profile may hold the file of an earlier browser.
		_ = os.Remove(filepath.Join(s.dataDir, devToolsPortFile))
	}
	p := launchRetry
	p.Retryable = func(err error) bool { return exitedAtStart(err) && ctx.Err() == nil }
	p.OnRetry = func(_ int, err error) {
		s.log.Warn("browser exited while starting; starting it again", "error", err)
		for _, f := range []string{"SingletonLock", "SingletonSocket", "SingletonCookie"} {
			_ = os.Remove(filepath.Join(s.dataDir, f))
		}
	}
	res, err := retry.Do(ctx, p, func(ctx context.Context, _ int) error { return s.launchOnce(ctx) })
	if err == nil {
		return s, nil
	}
	if last := res.LastErr(); last != nil {
		err = last // the launch's own failure, as it gave it
	}
	if s.ownDataDir {
		os.RemoveAll(s.dataDir)
	}
	var fe *faults.Error
	if errors.As(err, &fe) {
		return nil, fe
	}
	return nil, faults.Wrap(err, faults.CodeBrowserLaunch, faults.Unavailable, faults.Browser, "launch browser: "+err.Error())
}

// launchAttempts bounds the starts of a browser that exits while starting:
// on a loaded machine one occasionally dies before it answers (seen once
// in several hundred starts, killed with no message of its own), and a
// second start succeeds. One that fails twice is reported.
const launchAttempts = 2

// launchRetry starts a browser that exited while starting again, after a
// pause of up to 100 ms for the machine to catch its breath.
var launchRetry = retry.Policy{Attempts: launchAttempts, Initial: 100 * time.Millisecond}

// exitedAtStart reports a browser that ended before it answered. chromedp
// says so only in its message.
func exitedAtStart(err error) bool {
	return err != nil && strings.Contains(err.Error(), "chrome failed to start")
}

// launchOnce starts the browser and attaches its first tab; on failure it
// leaves nothing running.
func (s *Session) launchOnce(ctx context.Context) error {
	allocCtx, allocCancel := chromedp.NewExecAllocator(context.Background(), s.allocatorOptions()...)
	s.allocCancel = allocCancel

	first := newTab(s, "")
	s.rootCtx, s.rootCancel = chromedp.NewContext(allocCtx,
		chromedp.WithListener(first.onEvent),
		chromedp.WithErrorf(func(f string, args ...any) { s.log.Debug("chromedp: " + fmt.Sprintf(f, args...)) }),
	)
	first.ctx, first.cancel = s.rootCtx, s.rootCancel

	if err := s.start(ctx, first); err != nil {
		s.rootCancel()
		allocCancel()
		s.killLeftovers()
		return err
	}
	return nil
}

// disabledFeatures are Chromium features every session turns off.
// SpareRendererForSitePerProcess: no idle renderer kept warm for the
// next navigation (20 MB PSS per browser, navigate time unchanged).
// WebUIOmniboxPopup, WebUIOmniboxAimPopup: headless Chromium 156
// preloads the omnibox popup of its hidden window as a WebUI page
// in a renderer of its own (chrome://omnibox-popup.top-chrome, 60–80
// MB PSS); nobody types in that omnibox. Both are needed.
// RenderDocument: Chromium 156 builds a new frame host, and a new
// frame in the renderer, for every document, even one that
// replaces a same-site page in the same process; without it the
// frame is reused, as Chromium did until 2024. A navigation to the
// load event takes 13.0 ms instead of 18.6 (BenchmarkNavigate); pages
// render the same (TestRenderAlike).
var disabledFeatures = []string{"Translate", "MediaRouter", "OptimizationHints", "DialMediaRouteProvider",
	"InterestFeedContentSuggestions", "CalculateNativeWinOcclusion", "SpareRendererForSitePerProcess",
	"WebUIOmniboxPopup", "WebUIOmniboxAimPopup", "RenderDocument"}

// enabledFeatures are Chromium features every session turns on.
// NetworkServiceInProcess2: the network service runs in the browser
// process, not a utility process of its own (a lone sandbox after 100
// steps: 212 → 202 MB PSS). Its crash is then the browser's, which the
// session restarts as it does any browser crash.
// CDPScreenshotNewSurface, which Playwright's launch turns on, is left
// off: a capture then takes the renderer's next frame, 12 % sooner on an
// idle machine, but at a higher cost in CPU, and 16 sandboxes stepping on
// two cores made 16-17 steps/s instead of 18-21 (docs/benchmarks.md).
// Features are one switch: another --enable-features replaces this list.
var enabledFeatures = []string{"NetworkServiceInProcess2"}

func (s *Session) allocatorOptions() []chromedp.ExecAllocatorOption {
	o := s.opts
	flags := map[string]any{
		// research/drivers.md: the flag set measured on Debian's chromium.
		"no-sandbox":                             true, // the sandbox is the container; Chromium's own needs privileges it lacks there
		"disable-gpu":                            true,
		"disable-quic":                           true, // all traffic stays TCP, so the egress proxy sees it
		"no-first-run":                           true,
		"no-default-browser-check":               true,
		"disable-background-networking":          true, // Debian's wrapper does not add it
		"disable-component-update":               true,
		"disable-sync":                           true,
		"disable-extensions":                     true,
		"disable-default-apps":                   true,
		"disable-breakpad":                       true,
		"disable-client-side-phishing-detection": true,
		"disable-hang-monitor":                   true,
		"disable-popup-blocking":                 true, // popups become tabs the agent can see
		"disable-prompt-on-repost":               true,
		"disable-ipc-flooding-protection":        true,
		// A tab the agent is not looking at must keep running its timers,
		// or its settle waits would stall.
		"disable-background-timer-throttling":    true,
		"disable-backgrounding-occluded-windows": true,
		"disable-renderer-backgrounding":         true,
		"disable-features":                       strings.Join(disabledFeatures, ","),
		"enable-features":                        strings.Join(enabledFeatures, ","),
		// The zygote that starts unsandboxed utility processes; with the
		// network service in the browser process there are none (a lone
		// sandbox: 202 → 191 MB PSS).
		"no-unsandboxed-zygote": true,
		// With no GPU the GPU process only rasterises in software; in the
		// browser process it saves its base cost (a browser sandbox went
		// from 440 to 400 MB PSS with both changes, BenchmarkBrowserStep/memory).
		"in-process-gpu":         true,
		"metrics-recording-only": true,
		"password-store":         "basic",
		"use-mock-keychain":      true,
		"force-color-profile":    "srgb",
		"mute-audio":             true,
		"hide-scrollbars":        true,
		"window-size":            fmt.Sprintf("%d,%d", o.Viewport.Width, o.Viewport.Height),
		// The headless shell hints glyphs fully unless told otherwise;
		// the whole browser takes fontconfig's hinting, slight on Debian
		// and most distributions. Full hinting rounds advances to whole
		// pixels, so a line of text came out 1 % narrower in the shell
		// (2.5 % of fonts.html's pixels). The whole browser ignores the
		// switch.
		"font-render-hinting": "slight",
		"user-data-dir":       s.dataDir,
	}
	if *o.Headless {
		flags["headless"] = true
	}
	if o.FastFrames {
		flags["disable-frame-rate-limit"] = true
	}
	if smallShm() {
		// Chromium crashes when a small /dev/shm (64 MB in a default
		// container) fills up; /tmp holds the shared memory instead.
		flags["disable-dev-shm-usage"] = true
	}
	if o.UserAgent != "" {
		flags["user-agent"] = o.UserAgent
	}
	if o.Locale != "" {
		flags["lang"] = o.Locale
	}
	if o.ProxyServer != "" {
		flags["proxy-server"] = o.ProxyServer
	}
	for _, f := range o.ExtraFlags {
		name, value, ok := strings.Cut(strings.TrimLeft(f, "-"), "=")
		if ok {
			flags[name] = value
		} else {
			flags[name] = true
		}
	}
	names := make([]string, 0, len(flags))
	for n := range flags {
		names = append(names, n)
	}
	slices.Sort(names)
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(o.ExecPath)}
	for _, n := range names {
		opts = append(opts, chromedp.Flag(n, flags[n]))
	}
	var env []string
	if o.Timezone != "" {
		env = append(env, "TZ="+o.Timezone)
	}
	if o.Locale != "" {
		env = append(env, "LANGUAGE="+strings.ReplaceAll(o.Locale, "-", "_"))
	}
	if len(env) > 0 {
		opts = append(opts, chromedp.Env(env...))
	}
	if o.DevTools {
		opts = append(opts, chromedp.ModifyCmdFunc(devToolsCmd))
	}
	return opts
}

// start runs the browser, attaches the first tab and installs the
// browser-wide handlers. The browser's lifetime is bound to s.rootCtx, so
// the start runs on it and ctx only bounds the wait.
func (s *Session) start(ctx context.Context, first *tab) error {
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(s.rootCtx) }()
	timer := time.NewTimer(s.opts.LaunchTimeout)
	defer timer.Stop()
	select {
	case err := <-started:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		s.rootCancel()
		<-started
		return faults.Of(context.Cause(ctx))
	case <-timer.C:
		s.rootCancel()
		<-started
		return faults.New(faults.CodeBrowserLaunch, faults.Timeout, faults.Browser,
			fmt.Sprintf("launch browser: not ready after %s", s.opts.LaunchTimeout))
	}
	c := chromedp.FromContext(s.rootCtx)
	s.b = c.Browser
	if p := c.Browser.Process(); p != nil {
		s.pid = p.Pid
		s.noteBrowser()
	}
	first.mu.Lock()
	first.target = c.Target
	first.id = c.Target.TargetID
	first.mu.Unlock()

	if s.opts.DevTools {
		u, err := readDevToolsURL(ctx, s.dataDir)
		if err != nil {
			return err
		}
		s.devToolsURL = u
	}
	if err := chromedp.ListenBrowser(s.rootCtx, s.onBrowserEvent); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer cancel()
	if _, err := cdp.Call(cctx, s.b, target.SetDiscoverTargets, target.SetDiscoverTargetsParams{Discover: true}); err != nil {
		return err
	}
	if _, err := cdp.Call(cctx, s.b, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
		Behavior:      cdpbrowser.SetDownloadBehaviorBehaviorAllowAndName,
		DownloadPath:  s.opts.DownloadDir,
		EventsEnabled: new(true),
	}); err != nil {
		return err
	}
	if err := first.setup(cctx); err != nil {
		return err
	}
	first.markReady(nil)
	s.mu.Lock()
	s.tabs = append(s.tabs, first)
	s.active, s.front = first, first
	s.mu.Unlock()

	s.background(s.supervise)
	return nil
}

// background runs f on its own goroutine unless the session is closing;
// Close waits for it.
func (s *Session) background(f func()) {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgStopped {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// supervise notices a browser that died on its own and classifies it, so
// every later call fails at once with browser.crashed.
func (s *Session) supervise() {
	select {
	case <-s.done:
		return
	case <-s.b.LostConnection:
	}
	if s.isClosing() {
		return
	}
	s.markCrashed(errors.New("lost the connection to the browser"))
}

// markCrashed records the browser as dead (once) and returns the class.
func (s *Session) markCrashed(cause error) *faults.Error {
	if ce := s.crashError(); ce != nil {
		return ce
	}
	if !isExit(cause) {
		// A call on the dead browser returns the process's exit status
		// ("signal: killed") in its error.
		_, err := chromedp.Call(s.rootCtx, runtime.Evaluate, runtime.EvaluateParams{Expression: "0"})
		if isExit(err) {
			cause = err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.crashed != nil {
		return s.crashed
	}
	msg := "the browser process exited"
	var ee *exec.ExitError
	if errors.As(cause, &ee) {
		msg += " (" + ee.ProcessState.String() + ")"
	}
	s.crashed = faults.Wrap(cause, faults.CodeBrowserCrashed, faults.Unavailable, faults.Browser, msg)
	s.died()
	s.log.Warn("browser crashed", "pid", s.pid, "category", s.crashed.Category, "source", s.crashed.Source, "error", cause)
	for _, t := range s.tabs {
		t.interrupt(errTabClosed)
	}
	return s.crashed
}

// Dead closes once the browser has crashed, been killed or hung: Err then
// says why, and the session cannot be used again. Its owner restarts the
// browser on it rather than polling Err.
func (s *Session) Dead() <-chan struct{} { return s.dead }

func (s *Session) died() { s.deadOnce.Do(func() { close(s.dead) }) }

func (s *Session) crashError() *faults.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crashed
}

func (s *Session) isClosing() bool { return s.closing.Load() }

func (s *Session) browser() *chromedp.Browser { return s.b }

// lostConnection closes when the connection to the browser is gone (it
// crashed, was killed or closed); nil before the browser started.
func (s *Session) lostConnection() <-chan struct{} {
	if b := s.browser(); b != nil {
		return b.LostConnection
	}
	return nil
}

// Err reports why the session can no longer be used: browser.crashed
// after the browser died, browser.closed after Close, nil while usable.
func (s *Session) Err() error {
	if s.isClosing() {
		return errClosed()
	}
	if ce := s.crashError(); ce != nil {
		return ce
	}
	if lost(s) {
		return s.markCrashed(errors.New("lost the connection to the browser"))
	}
	return nil
}

// PID is the browser process id (0 if unknown).
func (s *Session) PID() int { return s.pid }

// Answer returns the text of the last answer action, if any.
func (s *Session) Answer() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.answer == nil {
		return "", false
	}
	return *s.answer, true
}

// Close stops the browser, kills any process it left behind, reaps them and
// removes a profile directory the session created. It is safe to call more
// than once and after a crash.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		close(s.done)
		// A graceful close lets the browser flush its profile; a bound
		// keeps a wedged browser from holding Close.
		ctx, cancel := context.WithTimeout(s.rootCtx, closeGrace)
		if s.crashError() == nil && !lost(s) {
			if err := chromedp.Cancel(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				s.log.Debug("graceful browser close", "error", err)
			}
		}
		cancel()
		s.rootCancel()
		s.allocCancel()
		s.killLeftovers()
		s.reap()
		s.bgMu.Lock()
		s.bgStopped = true
		s.bgMu.Unlock()
		s.wg.Wait()
		if s.ownDataDir {
			if err := os.RemoveAll(s.dataDir); err != nil {
				s.closeErr = fmt.Errorf("close browser: remove profile: %w", err)
			}
		}
	})
	return s.closeErr
}

// closeGrace bounds the graceful close: it takes ~300 ms on an idle
// machine (research/drivers.md) and a few times that under load.
const closeGrace = 3 * time.Second

// --- tabs --------------------------------------------------------------

// onBrowserEvent runs on the browser's read loop: it must return fast and
// never call the browser.
func (s *Session) onBrowserEvent(ev any) {
	switch ev := ev.(type) {
	case *target.EventTargetCreated:
		info := ev.TargetInfo
		if info.Type != "page" || info.OpenerID == "" {
			return // our own tabs are registered by whoever created them
		}
		if s.isClosing() {
			return
		}
		s.mu.Lock()
		if s.tabByIDLocked(info.TargetID) != nil {
			s.mu.Unlock()
			return
		}
		t := newTab(s, info.TargetID)
		t.url, t.title, t.opener = info.URL, info.Title, info.OpenerID
		s.tabs = append(s.tabs, t)
		s.front = nil
		if s.opts.FocusNewTabs {
			s.active = t
		}
		s.mu.Unlock()
		s.background(func() { s.adopt(t) })
	case *target.EventTargetInfoChanged:
		if t := s.tabByID(ev.TargetInfo.TargetID); t != nil {
			t.mu.Lock()
			t.url, t.title = ev.TargetInfo.URL, ev.TargetInfo.Title
			t.mu.Unlock()
		}
	case *target.EventTargetDestroyed:
		if t := s.tabByID(ev.TargetID); t != nil {
			s.forget(t)
		}
	case *target.EventTargetCrashed:
		if t := s.tabByID(ev.TargetID); t != nil {
			t.onEvent(&inspector.EventTargetCrashed{})
		}
	case *cdpbrowser.EventDownloadWillBegin:
		s.downloadBegin(ev)
	case *cdpbrowser.EventDownloadProgress:
		s.downloadProgress(ev)
	}
}

// adopt attaches to a tab that a page opened.
func (s *Session) adopt(t *tab) {
	ctx, cancel := chromedp.NewContext(s.rootCtx, chromedp.WithTargetID(t.id), chromedp.WithListener(t.onEvent))
	t.ctx, t.cancel = ctx, cancel
	err := s.attach(t)
	t.markReady(err)
	if err != nil && !s.isClosing() {
		s.log.Warn("attach to new tab", "target", t.id, "error", err)
	}
}

// attach runs the first chromedp call on t.ctx (which binds the tab's
// event loop to t.ctx) within the call timeout, then sets the tab up.
func (s *Session) attach(t *tab) error {
	done := make(chan error, 1)
	go func() { done <- chromedp.Do(t.ctx) }()
	timer := time.NewTimer(s.opts.CallTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-timer.C:
		t.cancel()
		<-done
		return faults.New(faults.CodeBrowserTimeout, faults.Timeout, faults.Browser, "attach to tab: the browser did not answer in time")
	case <-s.done:
		t.cancel()
		<-done
		return errClosed()
	}
	c := chromedp.FromContext(t.ctx)
	t.mu.Lock()
	t.target = c.Target
	if t.id == "" {
		t.id = c.Target.TargetID
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.ctx, s.opts.CallTimeout)
	defer cancel()
	return t.setup(ctx)
}

// openTab creates a blank tab, registers it and makes it active.
func (s *Session) openTab(ctx context.Context) (*tab, error) {
	t := newTab(s, "")
	tctx, cancel := chromedp.NewContext(s.rootCtx, chromedp.WithListener(t.onEvent))
	t.ctx, t.cancel = tctx, cancel
	if err := s.attach(t); err != nil {
		cancel()
		t.markReady(err)
		return nil, s.classify(ctx, nil, "new tab", err)
	}
	t.markReady(nil)
	s.mu.Lock()
	s.tabs = append(s.tabs, t)
	s.active, s.front = t, t
	s.mu.Unlock()
	return t, nil
}

// forget drops a tab that is gone and frees its chromedp context.
func (s *Session) forget(t *tab) {
	s.mu.Lock()
	i := slices.Index(s.tabs, t)
	if i < 0 {
		s.mu.Unlock()
		return
	}
	s.tabs = slices.Delete(s.tabs, i, i+1)
	if s.front == t {
		s.front = nil
	}
	if s.active == t {
		s.active = nil
		if op := s.tabByIDLocked(t.opener); op != nil {
			s.active = op
		} else if len(s.tabs) > 0 {
			s.active = s.tabs[max(i-1, 0)]
		}
	}
	s.mu.Unlock()
	close(t.gone)
	t.interrupt(errTabClosed)
	s.background(func() {
		// The chromedp context is set once the tab is attached.
		<-t.ready
		if t.cancel != nil && t.ctx != s.rootCtx {
			t.cancel()
		}
	})
}

func (s *Session) tabByID(id target.ID) *tab {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tabByIDLocked(id)
}

func (s *Session) tabByIDLocked(id target.ID) *tab {
	if id == "" {
		return nil
	}
	for _, t := range s.tabs {
		if t.id == id {
			return t
		}
	}
	return nil
}

// activeTab returns the tab actions go to, attached and ready.
func (s *Session) activeTab(ctx context.Context) (*tab, error) {
	if err := s.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	t := s.active
	s.mu.Unlock()
	if t == nil {
		return nil, faults.New(faults.CodeActionNoSuchTab, faults.ActionFailed, faults.Policy, "no tab is open")
	}
	if err := t.waitReady(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

// toFront brings t to the front when another tab may be there: a page in
// a background tab stops producing frames, and screenshots of it stall.
func (s *Session) toFront(ctx context.Context, t *tab) error {
	s.mu.Lock()
	n, front := len(s.tabs), s.front
	s.mu.Unlock()
	if front == t || n <= 1 && front != nil {
		return nil
	}
	// The browser brings a tab to the front even when its renderer crashed
	// or a dialog blocks its page: the agent must be able to switch to it,
	// then navigate to revive it or answer the dialog.
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout, errTabCrashed, errDialogOpen)
	defer cancel()
	if _, err := cdp.Call(cctx, t.target, page.BringToFront, cdp.Empty{}); err != nil {
		return s.classify(cctx, t, "bring tab to front", err)
	}
	s.mu.Lock()
	s.front = t
	s.mu.Unlock()
	return nil
}

// Tab is one open tab as observations list it.
type Tab = api.Tab

// Tabs lists the open tabs.
func (s *Session) Tabs() []Tab {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Tab, 0, len(s.tabs))
	for i, t := range s.tabs {
		t.mu.Lock()
		out = append(out, Tab{Index: i, URL: t.url, Title: t.title, Active: t == s.active})
		t.mu.Unlock()
	}
	return out
}

// viewport is the size of every tab: the options', or the one SetViewport
// set since.
func (s *Session) viewport() Viewport {
	if v := s.vp.Load(); v != nil {
		return *v
	}
	return s.opts.Viewport
}

// SetViewport resizes every open tab and every tab opened later to v (a
// warm pool's claim gives its sandbox the viewport the client asked for).
func (s *Session) SetViewport(ctx context.Context, v Viewport) error {
	if v.Width <= 0 || v.Height <= 0 || v.Width > api.MaxViewport || v.Height > api.MaxViewport {
		return errInvalid("viewport must be 1 to %d CSS pixels each side", api.MaxViewport)
	}
	s.vp.Store(&v)
	s.mu.Lock()
	tabs := slices.Clone(s.tabs)
	s.mu.Unlock()
	for _, t := range tabs {
		if err := t.waitReady(ctx); err != nil {
			continue // a tab that never attached has nothing to resize
		}
		if err := t.applyViewport(ctx, v); err != nil {
			return err
		}
	}
	return nil
}
