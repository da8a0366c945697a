package browser

import (
	"context"
	"log/slog"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/chromium"
)

// Viewport is a size in CSS pixels.
type Viewport = api.Viewport

// Options configure a Session. The zero value is usable: Launch fills the
// defaults documented on each field.
type Options struct {
	// ExecPath is the browser binary. Default: the binary of Engine.
	ExecPath string
	// Engine picks the binary when ExecPath is empty: chromium.Auto (the
	// default: Debian's chromium-headless-shell for a headless session
	// when installed, else chromium), chromium.Browser or
	// chromium.HeadlessShell.
	Engine string
	// UserDataDir is the profile directory. Default: a fresh temporary
	// directory that Close removes. A directory given here is kept.
	UserDataDir string
	// Viewport is the size of every tab. Default 1280×720.
	Viewport Viewport
	// UserAgent overrides the browser's user agent when set.
	UserAgent string
	// Locale sets the browser's language and Intl locale ("en-US").
	Locale string
	// Timezone sets the IANA time zone pages see ("Europe/Berlin").
	Timezone string
	// Headless runs without a display. Default true; false needs DISPLAY.
	Headless *bool
	// ProxyServer routes all traffic through a proxy ("http://127.0.0.1:3128").
	ProxyServer string
	// Evidence reports what the proxy saw of host since a time: a failure
	// (classified where it happened) and the fault injected, if any. A
	// navigation that failed as "tunnel failed" or with the proxy's own
	// error page is attributed by it. Nil without a proxy.
	Evidence func(ctx context.Context, host string, since time.Time) (*faults.Error, *faults.Truth)
	// DownloadDir receives downloads. Default /workspace/downloads.
	DownloadDir string
	// AutoAcceptDialogs accepts every JavaScript dialog as it opens. When
	// false a dialog stays open, is reported in observations and is answered
	// with the dialog action.
	AutoAcceptDialogs bool
	// FocusNewTabs makes a tab opened by the page (a popup, a link with
	// target=_blank) the active tab. When false the agent stays on its tab
	// and sees the new one in the tab list.
	FocusNewTabs bool
	// Logger receives the session's diagnostics. Default: slog.Default().
	Logger *slog.Logger

	// SettleQuiet is how long the page must be quiet (no DOM mutation, no
	// request in flight) after an action before the action returns.
	// Default 250 ms.
	SettleQuiet time.Duration
	// SettleIdle ends the settle wait early when the page showed no
	// mutation and no request at all for this long: an action with no
	// effect need not wait the full quiet window. Default 100 ms; set it
	// to SettleQuiet or more to always wait SettleQuiet.
	SettleIdle time.Duration
	// SettleTimeout caps the wait for quiet after an action. Default 2.5 s.
	SettleTimeout time.Duration
	// PlainSettle leaves pages uninstrumented: the settle wait then always
	// runs out its idle or quiet window. By default a script installed in
	// every document (pending.js, which a page can see) counts the timers
	// and animation-frame callbacks it has scheduled and the navigation it
	// started, and the wait ends once none is left after a 10 ms floor.
	PlainSettle bool
	// NavigationTimeout caps a navigate, back, forward or reload waiting for
	// the load event. Default 30 s.
	NavigationTimeout time.Duration
	// NavigationRetry retries page loads that fail with a retryable error
	// (per action: Action.Retry). Default: no retry.
	NavigationRetry RetryPolicy
	// CallTimeout caps any single protocol call. Default 10 s.
	CallTimeout time.Duration
	// LaunchTimeout caps starting the browser. Default 30 s (eight
	// browsers starting at once on two cores take over 20 s).
	LaunchTimeout time.Duration
	// DevTools also opens a DevTools endpoint on 127.0.0.1 (a free port)
	// for other clients (Playwright's connectOverCDP, chromedp's
	// RemoteAllocator, rod); Session.DevToolsURL returns its address. The
	// session itself keeps driving the browser over its pipe.
	DevTools bool
	// FastFrames lets Chromium draw a frame as soon as one is asked for
	// (--disable-frame-rate-limit) instead of on its 60 Hz clock: a
	// screenshot no longer waits up to two ticks of that clock (an
	// observation of a simple page went from ≈40 to ≈19 ms). Pages' own
	// requestAnimationFrame loops are paced back to 60 Hz by a script
	// installed in every tab (pacer.js), which a page can see; animation
	// that script cannot reach (a cross-site iframe, a worker) then draws
	// as fast as the CPU allows.
	FastFrames bool
	// AlwaysCapture draws a new frame for every screenshot. By default an
	// observation reuses the tab's last capture when nothing was drawn
	// since (the page's tracker saw no change and nothing that draws on its
	// own, and the compositor drew no frame), and a step starts its capture
	// as soon as its action is answered, keeping it when the page changed
	// nothing while the settle wait ran (browser/reuse.go).
	AlwaysCapture bool
	// ExtraFlags are added to the command line ("name" or "name=value",
	// without the leading dashes).
	ExtraFlags []string
}

// OptionsOf returns the session options a create request's `browser`
// settings ask for. The caller adds what only it knows: the proxy and its
// evidence, a logger, the profile directory.
func OptionsOf(o api.BrowserOptions) Options {
	bo := Options{
		Viewport: o.Viewport, UserAgent: o.UserAgent, Locale: o.Locale, Timezone: o.Timezone,
		Headless: o.Headless, Engine: o.Engine, AutoAcceptDialogs: o.AutoAcceptDialogs, FocusNewTabs: o.FocusNewTabs,
		FastFrames: o.FastFrames, PlainSettle: o.PlainSettle, AlwaysCapture: o.AlwaysCapture,
		CallTimeout:       time.Duration(o.CallTimeoutMS) * time.Millisecond,
		NavigationTimeout: time.Duration(o.NavigationTimeoutMS) * time.Millisecond,
		SettleTimeout:     time.Duration(o.SettleTimeoutMS) * time.Millisecond,
		SettleQuiet:       time.Duration(o.SettleQuietMS) * time.Millisecond,
		SettleIdle:        time.Duration(o.SettleIdleMS) * time.Millisecond,
	}
	if o.NavigationRetry != nil {
		bo.NavigationRetry = *o.NavigationRetry
	}
	return bo
}

// Defaults. Each says why it has its value.
const (
	// DefaultDownloadDir is the sandbox's conventional download folder.
	DefaultDownloadDir = "/workspace/downloads"
	// defaultSettleQuiet: long enough for a click handler's follow-up work
	// (a fetch started from a microtask or a short timer) to show, short
	// enough to keep a step well under a second.
	defaultSettleQuiet = 250 * time.Millisecond
	// defaultSettleIdle: the page's own reaction to input (handlers,
	// microtasks, a fetch started from them) begins within a frame or two;
	// nothing by 100 ms almost always means nothing is coming.
	defaultSettleIdle = 100 * time.Millisecond
	// defaultSettleTimeout: pages that never go quiet (tickers, long polls)
	// must not stall every step.
	defaultSettleTimeout = 2500 * time.Millisecond
	// defaultNavigationTimeout: the usual browser-automation bound for a
	// full page load on the open web.
	defaultNavigationTimeout = 30 * time.Second
	// defaultCallTimeout: a healthy browser answers any single command in
	// well under a second; 10 s leaves room for a loaded machine and a
	// full-page screenshot while still catching a hung renderer.
	defaultCallTimeout = 10 * time.Second
	// defaultLaunchTimeout: see Options.LaunchTimeout.
	defaultLaunchTimeout = 30 * time.Second
)

func (o Options) withDefaults() (Options, error) {
	if o.Viewport.Width <= 0 {
		o.Viewport.Width = 1280
	}
	if o.Viewport.Height <= 0 {
		o.Viewport.Height = 720
	}
	if o.Headless == nil {
		t := true
		o.Headless = &t
	}
	if o.ExecPath == "" {
		p, err := chromium.Find(o.Engine, *o.Headless)
		if err != nil {
			return o, err
		}
		o.ExecPath = p
	}
	if o.DownloadDir == "" {
		o.DownloadDir = DefaultDownloadDir
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.SettleQuiet <= 0 {
		o.SettleQuiet = defaultSettleQuiet
	}
	if o.SettleIdle <= 0 {
		o.SettleIdle = defaultSettleIdle
	}
	if o.SettleTimeout <= 0 {
		o.SettleTimeout = defaultSettleTimeout
	}
	if o.NavigationTimeout <= 0 {
		o.NavigationTimeout = defaultNavigationTimeout
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = defaultCallTimeout
	}
	if o.LaunchTimeout <= 0 {
		o.LaunchTimeout = defaultLaunchTimeout
	}
	return o, nil
}
