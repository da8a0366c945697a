package api

import (
	"fmt"
	"strings"

	"github.com/orchard/orchard/faults"
)

// The kind settings of a create request (`browser`, `desktop`, `egress`)
// are typed here so that the server refuses a bad one with a 422 before
// any sandbox starts, and the agent's daemons decode the very same types.

// FieldError is one invalid field, located relative to the object that
// found it; the server prefixes where that object sits in the request.
// It is the detail item of a validation error (faults.FieldError).
type FieldError = faults.FieldError

// fieldErrors collects the failed checks of one object.
type fieldErrors []FieldError

func (e *fieldErrors) value(input any, msg string, loc ...any) {
	*e = append(*e, FieldError{Type: "value_error", Loc: loc, Msg: msg, Input: input})
}

// nonNegative checks a number whose 0 means "the default".
func (e *fieldErrors) nonNegative(v int, loc ...any) {
	if v < 0 {
		*e = append(*e, FieldError{Type: "greater_than_equal", Loc: loc, Msg: "Input should be greater than or equal to 0",
			Input: v, Ctx: map[string]any{"ge": 0}})
	}
}

// Viewport is a size in CSS pixels.
type Viewport struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// MaxViewport bounds each side of a browser's viewport: Chromium cannot
// draw a surface larger than its maximum texture size.
const MaxViewport = 16384

// RetryPolicy retries a page load that failed with a retryable error (a
// site's 5xx or 429, a reset, a timeout, a resolver that could not answer);
// a policy error, a 4xx or a name that does not exist is never retried.
type RetryPolicy struct {
	// Attempts counts the first try; 0 or 1 means no retry.
	Attempts int `json:"attempts"`
	// InitialMS and MaxMS bound the exponential backoff (full jitter)
	// between attempts; defaults 500 and 5000.
	InitialMS int `json:"initial_ms,omitempty"`
	MaxMS     int `json:"max_ms,omitempty"`
	// BudgetMS caps all attempts and waits together; 0 = no cap.
	BudgetMS int `json:"budget_ms,omitempty"`
}

// Validate reports the policy's invalid fields.
func (r RetryPolicy) Validate() []FieldError {
	var e fieldErrors
	e.nonNegative(r.Attempts, "attempts")
	e.nonNegative(r.InitialMS, "initial_ms")
	e.nonNegative(r.MaxMS, "max_ms")
	e.nonNegative(r.BudgetMS, "budget_ms")
	return e
}

// Browser engines (BrowserOptions.Engine).
const (
	// EngineAuto is the headless shell for a headless browser when one is
	// installed, else the whole browser.
	EngineAuto = ""
	// EngineChromium is the whole browser (new headless mode when headless).
	EngineChromium = "chromium"
	// EngineHeadlessShell is the headless shell; it has no window.
	EngineHeadlessShell = "headless-shell"
)

// BrowserOptions are the `browser` settings of a create request; the
// browser daemon in the sandbox starts its session from them.
type BrowserOptions struct {
	Viewport Viewport `json:"viewport" doc:"CSS pixels, each side 0 (the default: 1280×720) to 16384"`
	// StartURL is the page the browser opens once it runs (and a warm
	// pool's claim navigates to).
	StartURL          string `json:"start_url,omitempty" doc:"http(s) page the browser opens at start; a pool claim opens it at the claim"`
	UserAgent         string `json:"user_agent,omitempty"`
	Locale            string `json:"locale,omitempty" doc:"the browser's language and Intl locale (\"en-US\")"`
	Timezone          string `json:"timezone,omitempty" doc:"IANA time zone pages see (\"Europe/Berlin\")"`
	Headless          *bool  `json:"headless,omitempty" doc:"default true"`
	AutoAcceptDialogs bool   `json:"auto_accept_dialogs,omitempty"`
	FocusNewTabs      bool   `json:"focus_new_tabs,omitempty"`
	// Engine picks the binary: EngineAuto, EngineChromium or
	// EngineHeadlessShell.
	Engine string `json:"engine,omitempty" doc:"\"chromium\", \"headless-shell\" or absent (the headless shell when headless and installed)"`
	// FastFrames lets Chromium draw a frame as soon as one is asked for
	// (see browser.Options.FastFrames).
	FastFrames bool `json:"fast_frames,omitempty"`
	// ProxyServer is the sandbox's egress proxy, set by the agent: a
	// request may not set it.
	ProxyServer string `json:"proxy_server,omitempty" doc:"set by the sandbox; refused in requests"`
	// Timeouts of the layers below an action, in milliseconds (0: the
	// browser package's defaults): one protocol call (a browser that does
	// not answer within it is probed and, when hung, restarted), a page
	// load, and the settle wait after an action.
	CallTimeoutMS       int `json:"call_timeout_ms,omitempty" openapi:"minimum=0"`
	NavigationTimeoutMS int `json:"navigation_timeout_ms,omitempty" openapi:"minimum=0"`
	SettleTimeoutMS     int `json:"settle_timeout_ms,omitempty" openapi:"minimum=0"`
	// SettleQuietMS and SettleIdleMS tune the settle wait (how long the
	// page must be quiet; when to stop early if nothing happened).
	SettleQuietMS int `json:"settle_quiet_ms,omitempty" openapi:"minimum=0"`
	SettleIdleMS  int `json:"settle_idle_ms,omitempty" openapi:"minimum=0"`
	// PlainSettle leaves pages uninstrumented (see browser.Options.PlainSettle).
	PlainSettle bool `json:"plain_settle,omitempty"`
	// AlwaysCapture draws a new frame for every screenshot (see
	// browser.Options.AlwaysCapture).
	AlwaysCapture bool `json:"always_capture,omitempty" doc:"capture a new frame for every screenshot: never reuse the last one, never start a step's capture before its settle wait ends"`
	// NavigationRetry retries page loads that fail with retryable site or
	// network errors.
	NavigationRetry *RetryPolicy `json:"navigation_retry,omitempty"`
}

// Validate reports the options' invalid fields: what the browser daemon
// would refuse or fail on after the sandbox started.
func (o *BrowserOptions) Validate() []FieldError {
	var e fieldErrors
	for _, side := range []struct {
		name string
		v    int
	}{{"width", o.Viewport.Width}, {"height", o.Viewport.Height}} {
		if side.v < 0 || side.v > MaxViewport {
			e.value(side.v, fmt.Sprintf("viewport %s must be 0 (the default) to %d CSS pixels", side.name, MaxViewport), "viewport", side.name)
		}
	}
	if o.StartURL != "" && !strings.HasPrefix(o.StartURL, "http://") && !strings.HasPrefix(o.StartURL, "https://") {
		e.value(o.StartURL, "start_url must be an http:// or https:// URL", "start_url")
	}
	switch o.Engine {
	case EngineAuto, EngineChromium:
	case EngineHeadlessShell:
		if o.Headless != nil && !*o.Headless {
			e.value(false, "engine \"headless-shell\" has no window: use \"chromium\" for a headed browser", "headless")
		}
	default:
		e.value(o.Engine, "browser.engine must be \"chromium\" or \"headless-shell\" (or absent)", "engine")
	}
	if o.ProxyServer != "" {
		e.value(o.ProxyServer, "proxy_server is set by the sandbox (its egress proxy), not by requests", "proxy_server")
	}
	e.nonNegative(o.CallTimeoutMS, "call_timeout_ms")
	e.nonNegative(o.NavigationTimeoutMS, "navigation_timeout_ms")
	e.nonNegative(o.SettleTimeoutMS, "settle_timeout_ms")
	e.nonNegative(o.SettleQuietMS, "settle_quiet_ms")
	e.nonNegative(o.SettleIdleMS, "settle_idle_ms")
	if o.NavigationRetry != nil {
		for _, fe := range o.NavigationRetry.Validate() {
			fe.Loc = append([]any{"navigation_retry"}, fe.Loc...)
			e = append(e, fe)
		}
	}
	return e
}

// Desktop apps (DesktopOptions.Apps).
const (
	AppXterm    = "xterm"
	AppChromium = "chromium"
)

// Desktop screen bounds: Xvfb refuses a screen much smaller, and each side
// beyond 8192 costs memory no agent needs.
const (
	MinScreenSide = 64
	MaxScreenSide = 8192
	// ScreenDepth is the only depth the capture path reads.
	ScreenDepth = 24
)

// DesktopOptions are the `desktop` settings of a create request; the
// desktop daemon in the sandbox starts its X session from them.
type DesktopOptions struct {
	Width  int      `json:"width,omitempty" doc:"screen pixels, 64 to 8192; 0 or absent: 1280"`
	Height int      `json:"height,omitempty" doc:"screen pixels, 64 to 8192; 0 or absent: 800"`
	Depth  int      `json:"depth,omitempty" doc:"24 (the only depth supported) or absent"`
	Apps   []string `json:"apps,omitempty" doc:"started once the window manager is up: \"xterm\", \"chromium\""`
	// WindowManager is "" (openbox when installed), "none", or the
	// command of another window manager.
	WindowManager string `json:"window_manager,omitempty"`
	// URL is what the chromium app opens, as an app window (no tabs or
	// address bar) filling the screen.
	URL string `json:"url,omitempty"`
}

// Validate reports the options' invalid fields: what the desktop daemon
// would refuse after the sandbox started.
func (o *DesktopOptions) Validate() []FieldError {
	var e fieldErrors
	for _, side := range []struct {
		name string
		v    int
	}{{"width", o.Width}, {"height", o.Height}} {
		if side.v != 0 && (side.v < MinScreenSide || side.v > MaxScreenSide) {
			e.value(side.v, fmt.Sprintf("screen %s must be %d to %d pixels (or absent)", side.name, MinScreenSide, MaxScreenSide), side.name)
		}
	}
	if o.Depth != 0 && o.Depth != ScreenDepth {
		e.value(o.Depth, fmt.Sprintf("screen depth must be %d (the only one supported) or absent", ScreenDepth), "depth")
	}
	for i, a := range o.Apps {
		if a != AppXterm && a != AppChromium {
			e.value(a, fmt.Sprintf("app must be %q or %q", AppXterm, AppChromium), "apps", i)
		}
	}
	return e
}

// Egress modes (Egress.Mode).
const (
	EgressProxy = "proxy"
	EgressFull  = "full"
)

// Validate reports the egress object's invalid fields. Host patterns are
// checked by ValidHostPattern, where the proxy that matches them is.
func (e *Egress) Validate() []FieldError {
	var fe fieldErrors
	switch e.Mode {
	case "", EgressProxy:
	case EgressFull:
		if len(e.Allow) > 0 {
			fe.value(e.Allow, "egress.allow needs mode \"proxy\": full-network mode cannot filter by host name", "allow")
		}
	default:
		fe.value(e.Mode, "egress.mode must be \"proxy\" or \"full\"", "mode")
	}
	return fe
}

// ValidHostPattern reports whether p is an egress allow-list entry: a host
// name or "*.domain". The glob characters that matching would otherwise
// honour (? [ ] \) are refused, not silently meant.
func ValidHostPattern(p string) bool {
	q := strings.TrimSuffix(strings.TrimPrefix(p, "*."), ".")
	return q != "" && !strings.ContainsAny(q, "*/ :@?[]\\") && !strings.Contains(q, "..")
}

// Observe chooses what the observation after a GUI request holds: the
// `observe` object of POST /sandboxes/{id}/browser/actions, of
// /desktop/actions and of episodes, and the query parameters of GET
// /browser/observation. A kind ignores the parts it cannot show.
type Observe struct {
	// Screenshot is "jpeg", "png" or "none". Absent: jpeg for a browser,
	// none for a desktop.
	Screenshot string `json:"screenshot,omitempty"`
	// Quality is the JPEG quality, 1–100 (default 80).
	Quality int `json:"quality,omitempty" openapi:"minimum=0"`
	// Width downscales the screenshot to this many pixels wide (never up).
	Width int `json:"width,omitempty" openapi:"minimum=0"`
	// Height downscales a desktop's screenshot to this many pixels high.
	Height int `json:"height,omitempty" openapi:"minimum=0" doc:"desktop only"`
	// Scale downscales a browser's screenshot by this factor, above 0 and
	// at most 1 (API.md's screenshot ?scale=); Width wins when both are set.
	Scale float64 `json:"scale,omitempty" doc:"browser only"`
	// FullPage captures the whole document instead of the viewport.
	FullPage bool `json:"full_page,omitempty" doc:"browser only"`
	// AXTree adds the compact accessibility tree as text.
	AXTree bool `json:"axtree,omitempty" doc:"browser only"`
	// SOM adds the interactive elements in view (set-of-marks).
	SOM bool `json:"som,omitempty" doc:"browser only"`
	// Marks draws the set-of-marks boxes and ids on the screenshot
	// (implies SOM).
	Marks bool `json:"marks,omitempty" doc:"browser only"`
	// Text adds the page's visible text.
	Text bool `json:"text,omitempty" doc:"browser only"`
}
