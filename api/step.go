package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"math"

	"github.com/orchard/orchard/faults"
)

// The GUI step protocol: the bodies of POST /sandboxes/{id}/browser/actions
// and /desktop/actions, GET /browser/observation, and the observation an
// episode step returns.
//
// Browser and desktop share the envelope's shape ({actions, observe,
// frame, strict} in, {ok, results, observation?, timing} out) and the
// per-action core (ActionResult), but not their action vocabularies: a
// browser action names page elements and selectors and scrolls by
// fractional CSS pixels, a desktop action scrolls by whole wheel steps and
// arrives in three dialects. Their observations differ as much (a page
// with tabs and elements; a screen with a cursor). One type for both
// would either change the JSON each writes or need every field documented
// by kind, so each kind has its own types: BrowserAction,
// BrowserActionsRequest, BrowserActionResult, BrowserObservation,
// BrowserActionsResponse; DesktopAction, DesktopActionsRequest,
// DesktopActionResult, DesktopObservation, DesktopActionsResponse.
// StepObservation carries either in an episode step.

// BrowserAction is one step an agent asks of a browser. Type selects the
// action; the other fields are its arguments (API.md lists which belong
// to which):
//
//	navigate {url}                 click {x,y | element | selector, button, clicks}
//	double_click, hover {x,y | element | selector}
//	type {text, element?, selector?, clear?}   key {keys: "Enter" | "Control+a"}
//	scroll {x?,y?, dx, dy | element}           drag {path: [[x,y],...]}
//	select_option {element|selector, value}    upload_file {element|selector, path}
//	back, forward, reload, new_tab {url?}, switch_tab {index}, close_tab {index?}
//	wait {ms | until: "load"|"networkidle"|"settled"}
//	dialog {accept, text?}         answer {text}
//
// x, y, dx, dy and path are screenshot pixels of the observation named by
// Frame, or of the tab's latest observation. In JSON, "path" is drag's
// points or upload_file's file (Points, File); the browser validates the
// arguments when it runs the action.
type BrowserAction struct {
	Type string `json:"type"`

	URL      string   `json:"url,omitempty"`
	X        *float64 `json:"x,omitempty"`
	Y        *float64 `json:"y,omitempty"`
	Element  *int     `json:"element,omitempty" doc:"a set-of-marks element id of the latest observation"`
	Selector string   `json:"selector,omitempty"`
	// Button is left (default), right, middle, back or forward.
	Button string `json:"button,omitempty"`
	// Clicks is the click count (default 1; double_click makes it 2).
	Clicks int    `json:"clicks,omitempty"`
	Text   string `json:"text,omitempty"`
	Clear  bool   `json:"clear,omitempty"`
	// Keys is a chord ("Control+a") or chords separated by spaces
	// ("Tab Tab Enter").
	Keys  string  `json:"keys,omitempty"`
	DX    float64 `json:"dx,omitempty"`
	DY    float64 `json:"dy,omitempty"`
	Value string  `json:"value,omitempty"`
	// Points is drag's "path": [[x,y],...].
	Points [][2]float64 `json:"-"`
	// File is upload_file's "path": a file inside the sandbox.
	File  string `json:"-"`
	Index *int   `json:"index,omitempty"`
	MS    int    `json:"ms,omitempty"`
	Until string `json:"until,omitempty"`
	// Accept answers a dialog (default true).
	Accept *bool `json:"accept,omitempty"`

	// Frame is the observation frame the coordinates were computed on.
	Frame *int64 `json:"frame,omitempty"`
	// Strict refuses the action (action.stale_frame) when Frame is not the
	// tab's latest observation of the current page.
	Strict bool `json:"strict,omitempty"`
	// Retry overrides the session's navigation retry policy for this
	// navigate, reload, back or forward.
	Retry *RetryPolicy `json:"retry,omitempty"`
}

// browserActionJSON is BrowserAction without its methods, plus "path",
// whose type depends on the action (points for drag, a file for
// upload_file).
type browserActionJSON struct {
	*browserActionAlias
	Path json.RawMessage `json:"path,omitempty"`
}

type browserActionAlias BrowserAction

// UnmarshalJSON reads "path" as drag points or as an upload file.
func (a *BrowserAction) UnmarshalJSON(b []byte) error {
	aux := browserActionJSON{browserActionAlias: (*browserActionAlias)(a)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	if len(aux.Path) == 0 || string(aux.Path) == "null" {
		return nil
	}
	if aux.Path[0] == '"' {
		return json.Unmarshal(aux.Path, &a.File)
	}
	var pts [][]float64
	if err := json.Unmarshal(aux.Path, &pts); err != nil {
		return fmt.Errorf("path: want [[x,y],...] or a file path: %w", err)
	}
	a.Points = make([][2]float64, len(pts))
	for i, p := range pts {
		if len(p) != 2 {
			return fmt.Errorf("path[%d]: want [x,y]", i)
		}
		a.Points[i] = [2]float64{p[0], p[1]}
	}
	return nil
}

// MarshalJSON writes Points or File as "path".
func (a BrowserAction) MarshalJSON() ([]byte, error) {
	aux := browserActionJSON{browserActionAlias: (*browserActionAlias)(&a)}
	var err error
	switch {
	case a.Points != nil:
		aux.Path, err = json.Marshal(a.Points)
	case a.File != "":
		aux.Path, err = json.Marshal(a.File)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(aux)
}

// BrowserActionsRequest is the body of POST /sandboxes/{id}/browser/actions:
// a list of actions (or a single one), an optional observation to take
// afterwards, and a frame and strictness that apply to every action that
// does not set its own.
type BrowserActionsRequest struct {
	Actions []BrowserAction `json:"actions,omitempty"`
	Action  *BrowserAction  `json:"action,omitempty"`
	Observe *Observe        `json:"observe,omitempty"`
	Frame   *int64          `json:"frame,omitempty"`
	Strict  bool            `json:"strict,omitempty"`
	// Settle overrides the session's settle wait for these actions.
	Settle *Settle `json:"settle,omitempty"`
}

// List returns the request's actions (Actions, then Action) with the
// request-level frame and strictness applied.
func (r BrowserActionsRequest) List() []BrowserAction {
	list := append([]BrowserAction(nil), r.Actions...)
	if r.Action != nil {
		list = append(list, *r.Action)
	}
	for i := range list {
		if list[i].Frame == nil && r.Frame != nil {
			f := *r.Frame
			list[i].Frame = &f
		}
		if r.Strict {
			list[i].Strict = true
		}
	}
	return list
}

// Settle tunes the wait after each browser action for the page to go quiet
// (no DOM mutation, no request in flight). Zero fields keep the session's.
type Settle struct {
	// QuietMS: how long the page must stay quiet.
	QuietMS int `json:"quiet_ms,omitempty"`
	// IdleMS: end early when nothing at all happened for this long.
	IdleMS int `json:"idle_ms,omitempty"`
	// TimeoutMS caps the wait.
	TimeoutMS int `json:"timeout_ms,omitempty"`
}

// ActionResult is what every action's result says, browser or desktop:
// its type, whether it succeeded, its classified error, and its time.
type ActionResult struct {
	Type  string       `json:"type"`
	OK    bool         `json:"ok"`
	Error *faults.Info `json:"error,omitempty"`
	// DurationMS is the action's time, a browser's settle wait included.
	DurationMS float64 `json:"duration_ms"`
}

// BrowserActionResult is the outcome of one browser action.
type BrowserActionResult struct {
	ActionResult
	// Injected is the fault a fault plan injected into this action, with
	// the attribution a correct system gives it.
	Injected *faults.Truth `json:"injected,omitempty"`
	// Attempts is how many times a page load was tried (with a retry
	// policy); Retries lists every attempt when there was more than one.
	Attempts int            `json:"attempts,omitempty"`
	Retries  []RetryAttempt `json:"retries,omitempty"`
}

// RetryAttempt is the record of one attempt of a retried page load (the
// wire form of retry.Attempt).
type RetryAttempt struct {
	// N counts from 1.
	N          int          `json:"attempt"`
	Error      *faults.Info `json:"error,omitempty"`
	DurationMS float64      `json:"duration_ms"`
	// WaitMS is the backoff that followed the attempt; 0 after the last.
	WaitMS float64 `json:"wait_ms,omitempty"`
}

// BrowserActionsResponse is the answer of POST /browser/actions.
type BrowserActionsResponse struct {
	OK          bool                  `json:"ok"`
	Results     []BrowserActionResult `json:"results"`
	Observation *BrowserObservation   `json:"observation,omitempty"`
	Timing      BrowserTiming         `json:"timing"`
}

// BrowserTiming is the time of a browser actions request, in milliseconds.
type BrowserTiming struct {
	TotalMS   float64 `json:"total_ms"`
	ActionsMS float64 `json:"actions_ms"`
	ObserveMS float64 `json:"observe_ms,omitempty"`
}

// BrowserObservation is what the agent sees of a browser's active tab:
// the answer of GET /browser/observation and the observation of POST
// /browser/actions.
type BrowserObservation struct {
	// Frame identifies this observation; actions may name it.
	Frame int64 `json:"frame"`
	// Scale is screenshot pixels per CSS pixel.
	Scale    float64       `json:"scale"`
	URL      string        `json:"url"`
	Title    string        `json:"title"`
	Tabs     []Tab         `json:"tabs"`
	Viewport ViewportState `json:"viewport"`
	// Screenshot is nil when none was asked for or a dialog blocks it.
	Screenshot *Screenshot `json:"screenshot,omitempty"`
	// AXTree is the compact accessibility tree, as text.
	AXTree string `json:"axtree,omitempty"`
	// Elements are the interactive elements in view (set-of-marks); ids
	// are valid for actions until the page changes.
	Elements  []Element     `json:"elements,omitempty"`
	Text      string        `json:"text,omitempty"`
	Dialog    *Dialog       `json:"dialog,omitempty"`
	Downloads []Download    `json:"downloads"`
	Timing    ObserveTiming `json:"timing"`
	// Blocked is the evidence that the page is a bot wall or a CAPTCHA
	// interstitial (site.blocked), whatever its HTTP status; empty for a
	// page of the site's own.
	Blocked string `json:"blocked,omitempty" doc:"evidence that the page is a bot wall or a CAPTCHA interstitial (an action that landed on it failed with site.blocked); empty otherwise"`
}

// ViewportState is a browser's viewport and the page under it, in CSS
// pixels.
type ViewportState struct {
	Width      int     `json:"width"`
	Height     int     `json:"height"`
	ScrollX    float64 `json:"scroll_x"`
	ScrollY    float64 `json:"scroll_y"`
	PageWidth  float64 `json:"page_width"`
	PageHeight float64 `json:"page_height"`
}

// Screenshot is an encoded image of a browser observation; Data is base64
// in JSON. Its frame and scale are the observation's.
type Screenshot struct {
	Format string `json:"format" doc:"jpeg or png"`
	Data   []byte `json:"data"`
	Width  int    `json:"width"`
	Height int    `json:"height"`
}

// Element is one set-of-marks element. BBox is [x, y, w, h] in screenshot
// pixels of the observation.
type Element struct {
	ID   int        `json:"id"`
	Role string     `json:"role"`
	Name string     `json:"name"`
	BBox [4]float64 `json:"bbox"`
}

// Dialog is an open JavaScript dialog.
type Dialog struct {
	// Type is alert, confirm, prompt or beforeunload.
	Type          string `json:"type"`
	Message       string `json:"message"`
	DefaultPrompt string `json:"default_prompt,omitempty"`
	URL           string `json:"url,omitempty"`
}

// Download is a file the browser downloaded or is downloading.
type Download struct {
	// Name is the file name the site suggested, as saved.
	Name string `json:"name"`
	// Path is where the file is on disk: the download directory's Name
	// once completed.
	Path string `json:"path"`
	// Size is the number of bytes received so far.
	Size int64 `json:"size"`
	// State is in_progress, completed or canceled.
	State string `json:"state"`
	URL   string `json:"url,omitempty"`
}

// ObserveTiming says where a browser observation's time went, in
// milliseconds.
type ObserveTiming struct {
	TotalMS      float64 `json:"total_ms"`
	PageMS       float64 `json:"page_ms"`
	ScreenshotMS float64 `json:"screenshot_ms"`
	MarksMS      float64 `json:"marks_ms,omitempty"`
	// Frame says where the screenshot came from: "captured" after the
	// page was read, "early" (captured while the step's settle wait ran,
	// kept because nothing changed since it was asked for), or "reused"
	// (the last capture: nothing was drawn since).
	Frame string `json:"frame,omitempty" doc:"captured, early or reused"`
}

// Point is a position in screenshot pixels. In JSON it is {"x":..,"y":..};
// [x, y] is accepted too.
type Point struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

// UnmarshalJSON reads {"x":..,"y":..} or [x, y].
func (p *Point) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var xy []float64
		if err := json.Unmarshal(b, &xy); err != nil {
			return err
		}
		if len(xy) != 2 {
			return fmt.Errorf("point %s: want [x, y]", b)
		}
		p.X, p.Y = xy[0], xy[1]
		return nil
	}
	var o struct{ X, Y *float64 }
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	if o.X == nil || o.Y == nil {
		return fmt.Errorf("point %s: want x and y", b)
	}
	p.X, p.Y = *o.X, *o.Y
	return nil
}

// DesktopAction is one step for a desktop, in the normalised set that the
// three accepted dialects (ours, Anthropic computer use, OpenAI computer
// use; desktop/ACTIONS.md maps them) come down to. JSON writes it in the
// normalised form, and encoding/json reads back only that form; the
// desktop daemon reads every dialect, key names and validation included,
// with desktop.ParseRequest.
//
// Coordinates (X, Y, Path) are pixels of a screenshot: of the frame named
// by Frame when it is still kept, else of the latest one; before the
// first screenshot they are screen pixels. With Strict, an action naming
// any frame but the latest fails with action.stale_frame.
type DesktopAction struct {
	Type string   `json:"type"`
	X    *float64 `json:"x,omitempty"`
	Y    *float64 `json:"y,omitempty"`
	// Button is left (default), middle, right, back or forward.
	Button string `json:"button,omitempty"`
	// Clicks is the click count (default 1; double_click 2, triple_click 3).
	Clicks int `json:"clicks,omitempty"`
	// Path is drag's points; a single point drags from the cursor.
	Path []Point `json:"path,omitempty"`
	// DX and DY are wheel steps: positive scrolls right and down.
	DX int `json:"dx,omitempty"`
	DY int `json:"dy,omitempty"`
	// Text is type's text.
	Text string `json:"text,omitempty"`
	// Keys is key's xdotool-style chords, separated by spaces.
	Keys string `json:"keys,omitempty"`
	// HoldMS holds each chord of a key action down this long.
	HoldMS int `json:"hold_ms,omitempty"`
	// Modifiers are held during a pointer action: "shift", "ctrl+alt".
	Modifiers string `json:"modifiers,omitempty"`
	// MS is wait's duration (default 1000).
	MS *int `json:"ms,omitempty"`
	// Format, Quality, Width and Height are a screenshot action's image.
	Format  string `json:"format,omitempty"`
	Quality int    `json:"quality,omitempty"`
	Width   int    `json:"width,omitempty"`
	Height  int    `json:"height,omitempty"`

	Frame  *int64 `json:"frame,omitempty"`
	Strict bool   `json:"strict,omitempty"`

	// Dialect is the vocabulary the action arrived in (orchard, anthropic,
	// openai); informational, not sent.
	Dialect string `json:"-"`
}

// DesktopActionsRequest is the body of POST /sandboxes/{id}/desktop/actions:
// actions to run in order and an optional observation after them. Frame
// and Strict apply to every action that names no frame of its own.
//
// Besides {"actions": [...]}, the daemon reads {"action": {...}}, a bare
// action in any dialect (an Anthropic tool input, an OpenAI action), and
// a JSON list of actions (desktop.ParseRequest); encoding/json reads only
// the first form, in the normalised vocabulary.
type DesktopActionsRequest struct {
	Actions []DesktopAction `json:"actions"`
	Observe *Observe        `json:"observe,omitempty"`
	Frame   *int64          `json:"frame,omitempty"`
	Strict  bool            `json:"strict,omitempty"`
}

// Frame identifies a desktop screenshot and maps its pixels to the
// screen's: actions give coordinates in the pixels of a frame.
type Frame struct {
	// ID increases with every screenshot of the session.
	ID int64 `json:"frame"`
	// Scale is screenshot pixels per screen pixel: 1 at full size, 0.5
	// for a 640-wide shot of a 1280-wide screen.
	Scale float64 `json:"scale"`
	// Width and Height are the screenshot's size.
	Width  int `json:"width"`
	Height int `json:"height"`
	// ScreenWidth and ScreenHeight are the screen's size.
	ScreenWidth  int `json:"screen_width"`
	ScreenHeight int `json:"screen_height"`
}

// ToScreen maps a point in the frame's pixels to the screen pixel under
// it, clamped to the screen. Each axis scales by its own ratio, so the
// rounding of the screenshot's size does not skew the far edge.
func (f Frame) ToScreen(x, y float64) image.Point {
	p := image.Pt(toScreen(x, f.Width, f.ScreenWidth), toScreen(y, f.Height, f.ScreenHeight))
	if f.ScreenWidth > 0 {
		p.X = min(max(p.X, 0), f.ScreenWidth-1)
	}
	if f.ScreenHeight > 0 {
		p.Y = min(max(p.Y, 0), f.ScreenHeight-1)
	}
	return p
}

// toScreen maps v on a frame side of n pixels to the screen pixel under it
// on a screen side of sn. The product is taken before the quotient, and a
// value a rounding error short of a pixel's edge counts as on it, so that
// FromScreen's answer maps back to the pixel it came from.
func toScreen(v float64, n, sn int) int {
	if n > 0 && sn > 0 {
		v = v * float64(sn) / float64(n)
	}
	return int(math.Floor(v + 1e-7))
}

// FromScreen maps a screen pixel to the frame's pixels.
func (f Frame) FromScreen(p image.Point) (x, y float64) {
	if f.ScreenWidth == 0 || f.ScreenHeight == 0 {
		return float64(p.X), float64(p.Y)
	}
	return float64(p.X) * float64(f.Width) / float64(f.ScreenWidth),
		float64(p.Y) * float64(f.Height) / float64(f.ScreenHeight)
}

// DesktopScreenshot is an encoded image of the screen and the frame it
// defines (a browser's Screenshot leaves frame and scale to its
// observation).
type DesktopScreenshot struct {
	Frame
	Format string `json:"format" doc:"png or jpeg"`
	// Data is the encoded image (base64 in JSON).
	Data []byte `json:"data"`
}

// DesktopActionResult is the outcome of one desktop action.
type DesktopActionResult struct {
	ActionResult
	// Screenshot is the screenshot action's image.
	Screenshot *DesktopScreenshot `json:"screenshot,omitempty"`
	// Cursor is cursor_position's answer, in pixels of the latest frame.
	Cursor *Point `json:"cursor,omitempty"`
}

// DesktopObservation is what a desktop request observes after its
// actions: the screenshot asked for and the pointer in its pixels.
type DesktopObservation struct {
	Screenshot *DesktopScreenshot `json:"screenshot,omitempty"`
	Cursor     Point              `json:"cursor"`
}

// DesktopTiming is the time of a desktop actions request.
type DesktopTiming struct {
	TotalMS float64 `json:"total_ms"`
}

// DesktopActionsResponse is the answer of POST /desktop/actions.
type DesktopActionsResponse struct {
	OK          bool                  `json:"ok"`
	Results     []DesktopActionResult `json:"results"`
	Observation *DesktopObservation   `json:"observation,omitempty"`
	// Faults are those the session recovered from since the previous
	// response (a window manager or X server that died and was
	// restarted): the actions did not fail for them, but what is on the
	// screen may have changed.
	Faults []SessionFault `json:"faults,omitempty"`
	Timing DesktopTiming  `json:"timing"`
}

// StepObservation is the observation of an episode step: a browser's or a
// desktop's, in JSON exactly as its daemon wrote it, or a shell's (null
// when the step observed nothing). Decoding tells them apart by shape: a
// shell's has an "exit_code", a desktop's a "cursor" and no "url".
type StepObservation struct {
	Browser *BrowserObservation
	Desktop *DesktopObservation
	Shell   *ShellObservation
}

// MarshalJSON writes the observation that is set, or null.
func (o StepObservation) MarshalJSON() ([]byte, error) {
	switch {
	case o.Browser != nil:
		return json.Marshal(o.Browser)
	case o.Desktop != nil:
		return json.Marshal(o.Desktop)
	case o.Shell != nil:
		return json.Marshal(o.Shell)
	}
	return []byte("null"), nil
}

// UnmarshalJSON reads a browser's or a desktop's observation.
func (o *StepObservation) UnmarshalJSON(b []byte) error {
	*o = StepObservation{}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || string(b) == "null" {
		return nil
	}
	var probe struct {
		URL      *string         `json:"url"`
		Cursor   json.RawMessage `json:"cursor"`
		ExitCode json.RawMessage `json:"exit_code"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return err
	}
	if probe.ExitCode != nil && probe.URL == nil {
		o.Shell = new(ShellObservation)
		return json.Unmarshal(b, o.Shell)
	}
	if probe.Cursor != nil && probe.URL == nil {
		o.Desktop = new(DesktopObservation)
		return json.Unmarshal(b, o.Desktop)
	}
	o.Browser = new(BrowserObservation)
	return json.Unmarshal(b, o.Browser)
}

// IsZero reports whether no observation is set.
func (o StepObservation) IsZero() bool { return o.Browser == nil && o.Desktop == nil && o.Shell == nil }
