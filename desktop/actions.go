package desktop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"math"
	"strings"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/ordered"
)

// Action types of the normalised set (the "type" of an Action).
const (
	ActClick          = "click"
	ActDoubleClick    = "double_click"
	ActTripleClick    = "triple_click"
	ActMouseMove      = "mouse_move"
	ActMouseDown      = "mouse_down"
	ActMouseUp        = "mouse_up"
	ActDrag           = "drag"
	ActScroll         = "scroll"
	ActType           = "type"
	ActKey            = "key"
	ActWait           = "wait"
	ActScreenshot     = "screenshot"
	ActCursorPosition = "cursor_position"
)

// Dialects an action can arrive in (Action.Dialect).
const (
	DialectOrchard   = "orchard"
	DialectAnthropic = "anthropic"
	DialectOpenAI    = "openai"
)

const (
	// maxWait bounds wait and hold durations: Anthropic's tool refuses
	// more than 100 s, and an agent that wants longer is better served by
	// looking in between.
	maxWait = 100 * time.Second
	// defaultWait is a wait without a duration: OpenAI's wait has none,
	// and its reference harnesses sleep one second.
	defaultWait = time.Second
	// maxTextRunes bounds one type action; longer text belongs in a file.
	maxTextRunes = 10000
	// maxClicks bounds a click's count: more is no gesture any toolkit
	// knows.
	maxClicks = 10
	// maxScrollSteps bounds the wheel steps of one scroll, per axis;
	// larger requests are clamped, since the page cannot scroll further
	// than its end anyway.
	maxScrollSteps = 100
	// maxPathPoints bounds a drag's path.
	maxPathPoints = 1000
	// pixelsPerWheelStep converts OpenAI's scroll_x/scroll_y, which are
	// page pixels (its reference harness passes them to
	// window.scrollBy), into wheel steps: X has only steps, each
	// scrolling as far as the app decides (a few lines). One step per
	// 100 px turns the usual few-hundred-pixel requests into a few steps;
	// any nonzero request scrolls at least one.
	pixelsPerWheelStep = 100
)

// Point is a position in screenshot pixels. In JSON it is {"x":..,"y":..};
// [x, y] is accepted too.
type Point = api.Point

// Action is one step for the desktop, in the normalised set that the
// three accepted dialects map to. In JSON, an Action is read from any of
// them (see ParseAction) and written in the normalised form.
//
// Coordinates (X, Y, Path) are pixels of a screenshot: of the frame named
// by Frame when it is still kept, else of the latest one; before the
// first screenshot they are screen pixels. With Strict, an action naming
// any frame but the latest fails with action.stale_frame.
//
// The dialects map as follows (a dash: no such action):
//
//	normalised                     | Anthropic computer use                    | OpenAI computer use
//	-------------------------------+-------------------------------------------+-----------------------------------
//	click {x,y,button,clicks,      | left_click, right_click, middle_click     | click {x,y,button: left|right|
//	  modifiers}                   |   {coordinate?, text|key = modifiers}     |   wheel→middle|back|forward, keys?}
//	double_click {x,y}             | double_click {coordinate?, text?}         | double_click {x,y}
//	triple_click {x,y}             | triple_click {coordinate?, text?} (2501)  | -
//	mouse_move {x,y}               | mouse_move {coordinate}                   | move {x,y}
//	mouse_down {x?,y?,button}      | left_mouse_down (2501)                    | -
//	mouse_up {x?,y?,button}        | left_mouse_up (2501)                      | -
//	drag {path:[{x,y},...]}        | left_click_drag {coordinate,              | drag {path:[{x,y},...]}
//	  (one point: from the cursor) |   start_coordinate?}                      |
//	scroll {x?,y?,dx,dy,modifiers} | scroll {coordinate?, scroll_direction,    | scroll {x,y,scroll_x,scroll_y}
//	  (dx, dy: wheel steps)        |   scroll_amount, text?} (2501)            |   (pixels; 100 px = 1 step)
//	type {text}                    | type {text}                               | type {text}
//	key {keys, hold_ms?}           | key {text}; hold_key {text, duration}     | keypress {keys:["CTRL","S"]}
//	wait {ms}                      | wait {duration: seconds} (2501)           | wait (1 s)
//	screenshot {format?,quality?,  | screenshot                                | screenshot
//	  width?,height?}              |                                           |
//	cursor_position                | cursor_position                           | -
//
// (2501) marks the actions computer_20250124 added to computer_20241022.
// Scroll directions map to wheel buttons up 4, down 5, left 6, right 7;
// dy > 0 scrolls down and dx > 0 right. Keys use xdotool names
// ("ctrl+s", "Return", "shift+Tab"), case-insensitive except single
// characters; OpenAI's key names ("CTRL", "ENTER", "ARROWLEFT") are
// read the same way, single letters in lowercase.
//
// Action is api.DesktopAction: the wire type. Reading it from any dialect
// (ParseAction, ParseRequest) needs this package's key names, so the
// parsing lives here rather than in an UnmarshalJSON of api's.
type Action = api.DesktopAction

// wireAction holds the fields of all three dialects.
type wireAction struct {
	Type      string          `json:"type"`
	X         *float64        `json:"x"`
	Y         *float64        `json:"y"`
	Button    string          `json:"button"`
	Clicks    int             `json:"clicks"`
	Path      []Point         `json:"path"`
	DX        *float64        `json:"dx"`
	DY        *float64        `json:"dy"`
	Text      *string         `json:"text"`
	Keys      json.RawMessage `json:"keys"` // a string, or OpenAI's array
	HoldMS    int             `json:"hold_ms"`
	Modifiers string          `json:"modifiers"`
	MS        *int            `json:"ms"`
	Format    string          `json:"format"`
	Quality   int             `json:"quality"`
	Width     int             `json:"width"`
	Height    int             `json:"height"`
	Frame     *int64          `json:"frame"`
	Strict    bool            `json:"strict"`

	// OpenAI.
	ScrollX *float64 `json:"scroll_x"`
	ScrollY *float64 `json:"scroll_y"`

	// Anthropic.
	Action          json.RawMessage `json:"action"`
	Coordinate      *Point          `json:"coordinate"`
	StartCoordinate *Point          `json:"start_coordinate"`
	ScrollDirection string          `json:"scroll_direction"`
	ScrollAmount    *float64        `json:"scroll_amount"`
	Duration        *float64        `json:"duration"`
	Key             *string         `json:"key"`
}

// invalid is the error of a malformed action or request.
func invalid(format string, args ...any) *faults.Error {
	return faults.Newf(faults.CodeActionInvalid, faults.InvalidRequest, faults.Policy, format, args...)
}

// ParseAction reads one action in any dialect and normalises it; errors
// are action.invalid faults. An object whose "action" is itself an object
// (OpenAI's computer_call item, or {"action": {...}}) is read through to
// that object.
func ParseAction(b []byte) (Action, error) {
	var a Action
	if err := parseAction(&a, b); err != nil {
		return Action{}, err
	}
	return a, nil
}

// parseAction reads and normalises an action in any dialect into a.
func parseAction(a *Action, b []byte) error {
	var w wireAction
	if err := json.Unmarshal(b, &w); err != nil {
		return invalid("action: %v", err)
	}
	raw := bytes.TrimSpace(w.Action)
	var err error
	switch {
	case len(raw) > 0 && raw[0] == '{':
		return parseAction(a, raw)
	case len(raw) > 0 && raw[0] == '"':
		var name string
		if err := json.Unmarshal(raw, &name); err != nil {
			return invalid("action: %v", err)
		}
		*a, err = fromAnthropic(name, w)
	case len(raw) > 0 && string(raw) != "null":
		return invalid("action: \"action\" must be a string (Anthropic) or an object")
	case w.Type != "":
		*a, err = fromTyped(w)
	default:
		return invalid("action: no \"type\" (Orchard, OpenAI) or \"action\" (Anthropic)")
	}
	if err != nil {
		return err
	}
	return validate(a)
}

// fromAnthropic maps an Anthropic computer-use action (computer_20241022
// or computer_20250124).
func fromAnthropic(name string, w wireAction) (Action, error) {
	a := Action{Dialect: DialectAnthropic, Frame: w.Frame, Strict: w.Strict}
	at := func(required bool) error {
		if w.Coordinate == nil {
			if required {
				return invalid("%s: coordinate [x, y] is required", name)
			}
			return nil
		}
		a.X, a.Y = &w.Coordinate.X, &w.Coordinate.Y
		return nil
	}
	text := func() (string, error) {
		if w.Text == nil || *w.Text == "" {
			return "", invalid("%s: text is required", name)
		}
		return *w.Text, nil
	}
	seconds := func() (int, error) {
		if w.Duration == nil {
			return 0, invalid("%s: duration (seconds) is required", name)
		}
		d := *w.Duration
		if math.IsNaN(d) || d < 0 || d > maxWait.Seconds() {
			return 0, invalid("%s: duration %v: want 0 to %v seconds", name, d, maxWait.Seconds())
		}
		return int(math.Round(d * 1000)), nil
	}
	// Modifiers held during clicks and scrolls: "text" in the API's
	// definition, "key" in its reference implementation.
	mods := func() {
		switch {
		case w.Text != nil:
			a.Modifiers = *w.Text
		case w.Key != nil:
			a.Modifiers = *w.Key
		}
	}
	var err error
	switch name {
	case "key", "type":
		a.Type = map[string]string{"key": ActKey, "type": ActType}[name]
		var t string
		if t, err = text(); err == nil {
			if name == "key" {
				a.Keys = t
			} else {
				a.Text = t
			}
		}
	case "mouse_move":
		a.Type = ActMouseMove
		err = at(true)
	case "left_click", "right_click", "middle_click", "double_click", "triple_click":
		a.Type = ActClick
		a.Button = map[string]string{"right_click": "right", "middle_click": "middle"}[name]
		switch name {
		case "double_click":
			a.Type = ActDoubleClick
		case "triple_click":
			a.Type = ActTripleClick
		}
		mods()
		err = at(false)
	case "left_click_drag":
		a.Type = ActDrag
		if w.Coordinate == nil {
			return a, invalid("%s: coordinate [x, y] is required", name)
		}
		if w.StartCoordinate != nil {
			a.Path = append(a.Path, *w.StartCoordinate)
		}
		a.Path = append(a.Path, *w.Coordinate)
	case "left_mouse_down", "left_mouse_up":
		a.Type = map[string]string{"left_mouse_down": ActMouseDown, "left_mouse_up": ActMouseUp}[name]
		err = at(false)
	case "scroll":
		a.Type = ActScroll
		if err = at(false); err != nil {
			return a, err
		}
		if w.ScrollAmount == nil {
			return a, invalid("scroll: scroll_amount is required")
		}
		n := *w.ScrollAmount
		if math.IsNaN(n) || n < 0 || n != math.Trunc(n) {
			return a, invalid("scroll: scroll_amount %v: want a non-negative integer", n)
		}
		steps := int(min(n, maxScrollSteps))
		switch w.ScrollDirection {
		case "up":
			a.DY = -steps
		case "down":
			a.DY = steps
		case "left":
			a.DX = -steps
		case "right":
			a.DX = steps
		default:
			return a, invalid("scroll: scroll_direction %q: want up, down, left or right", w.ScrollDirection)
		}
		mods()
	case "hold_key":
		a.Type = ActKey
		if a.Keys, err = text(); err == nil {
			a.HoldMS, err = seconds()
		}
	case "wait":
		a.Type = ActWait
		var ms int
		if ms, err = seconds(); err == nil {
			a.MS = &ms
		}
	case "screenshot":
		a.Type = ActScreenshot
	case "cursor_position":
		a.Type = ActCursorPosition
	default:
		return a, invalid("action %q: not a computer-use action this desktop supports", name)
	}
	return a, err
}

// fromTyped maps an action with a "type": the normalised set, with
// OpenAI's computer-use actions and fields read as well.
func fromTyped(w wireAction) (Action, error) {
	a := Action{Type: w.Type, Dialect: DialectOrchard, X: w.X, Y: w.Y, Button: w.Button, Clicks: w.Clicks,
		Path: w.Path, HoldMS: w.HoldMS, Modifiers: w.Modifiers, MS: w.MS, Format: w.Format,
		Quality: w.Quality, Width: w.Width, Height: w.Height, Frame: w.Frame, Strict: w.Strict}
	if w.Text != nil {
		a.Text = *w.Text
	}
	keys, list, err := readKeys(w.Keys)
	if err != nil {
		return a, err
	}
	switch a.Type {
	case "keypress": // OpenAI
		a.Type, a.Dialect = ActKey, DialectOpenAI
		if !list {
			return a, invalid("keypress: keys must be a list of key names")
		}
	case "move": // OpenAI
		a.Type, a.Dialect = ActMouseMove, DialectOpenAI
	}
	switch a.Type {
	case ActKey:
		a.Keys = keys
	case ActClick, ActDoubleClick, ActTripleClick, ActMouseMove, ActMouseDown, ActMouseUp, ActDrag, ActScroll:
		// OpenAI lists the keys held during a pointer action in "keys".
		if keys != "" && a.Modifiers == "" {
			a.Modifiers = keys
		}
	}
	if a.Button == "wheel" { // OpenAI's name for the middle button
		a.Button, a.Dialect = "middle", DialectOpenAI
	}
	if list {
		a.Dialect = DialectOpenAI
	}
	if a.Type == ActScroll {
		if w.ScrollX != nil || w.ScrollY != nil {
			a.Dialect = DialectOpenAI
			if w.DX != nil || w.DY != nil {
				return a, invalid("scroll: give dx/dy (wheel steps) or scroll_x/scroll_y (pixels), not both")
			}
			a.DX, a.DY = pixelsToSteps(w.ScrollX), pixelsToSteps(w.ScrollY)
		} else {
			if a.DX, err = steps("dx", w.DX); err == nil {
				a.DY, err = steps("dy", w.DY)
			}
		}
	}
	return a, err
}

// readKeys reads "keys": a string of xdotool-style chords, or a list of
// key names pressed together (OpenAI's keypress), which becomes one
// chord. list reports the second form.
func readKeys(raw json.RawMessage) (keys string, list bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &keys); err != nil {
			return "", false, invalid("keys: %v", err)
		}
		return keys, false, nil
	}
	var names []string
	if err := json.Unmarshal(raw, &names); err != nil {
		return "", false, invalid("keys: want a string or a list of key names")
	}
	if len(names) == 0 {
		return "", true, invalid("keys: empty list")
	}
	parts := make([]string, 0, len(names))
	for _, n := range names {
		n = strings.TrimSpace(n)
		// OpenAI writes letters in capitals ("CTRL", "S") without meaning
		// shift; a lone letter is taken in lowercase.
		if len(n) == 1 && n[0] >= 'A' && n[0] <= 'Z' {
			n = strings.ToLower(n)
		}
		ks, ok := keysymOf(n)
		if !ok {
			return "", true, invalid("keys: unknown key %q", n)
		}
		parts = append(parts, keyName(ks))
	}
	return strings.Join(parts, "+"), true, nil
}

func steps(name string, v *float64) (int, error) {
	if v == nil {
		return 0, nil
	}
	if math.IsNaN(*v) || math.IsInf(*v, 0) || *v != math.Trunc(*v) {
		return 0, invalid("scroll: %s %v: want a whole number of wheel steps", name, *v)
	}
	return int(max(-maxScrollSteps, min(*v, maxScrollSteps))), nil
}

// pixelsToSteps converts a scroll distance in pixels to wheel steps (see
// pixelsPerWheelStep).
func pixelsToSteps(px *float64) int {
	if px == nil || *px == 0 || math.IsNaN(*px) {
		return 0
	}
	n := max(1, int(math.Round(math.Abs(*px)/pixelsPerWheelStep)))
	n = min(n, maxScrollSteps)
	if *px < 0 {
		return -n
	}
	return n
}

// validate checks a normalised action and fills in its defaults.
func validate(a *Action) error {
	if (a.X == nil) != (a.Y == nil) {
		return invalid("%s: give both x and y or neither", a.Type)
	}
	if a.X != nil && (!finite(*a.X) || !finite(*a.Y)) {
		return invalid("%s: coordinates must be numbers", a.Type)
	}
	pointer := func() error {
		if _, err := buttonOf(a.Button); err != nil {
			return invalid("%s: %v", a.Type, err)
		}
		if _, err := parseModifiers(a.Modifiers); err != nil {
			return invalid("%s: %v", a.Type, err)
		}
		return nil
	}
	switch a.Type {
	case ActClick, ActDoubleClick, ActTripleClick:
		def := map[string]int{ActClick: 1, ActDoubleClick: 2, ActTripleClick: 3}[a.Type]
		if a.Clicks == 0 {
			a.Clicks = def
		}
		if a.Clicks < 1 || a.Clicks > maxClicks {
			return invalid("%s: clicks %d: want 1 to %d", a.Type, a.Clicks, maxClicks)
		}
		return pointer()
	case ActMouseMove:
		if a.X == nil {
			return invalid("mouse_move: x and y are required")
		}
		return pointer()
	case ActMouseDown, ActMouseUp, ActScroll:
		return pointer()
	case ActDrag:
		if len(a.Path) == 0 || len(a.Path) > maxPathPoints {
			return invalid("drag: path needs 1 to %d points", maxPathPoints)
		}
		for _, p := range a.Path {
			if !finite(p.X) || !finite(p.Y) {
				return invalid("drag: coordinates must be numbers")
			}
		}
		return pointer()
	case ActType:
		if a.Text == "" {
			return invalid("type: text is required")
		}
		n := 0
		for _, r := range a.Text {
			if n++; n > maxTextRunes {
				return invalid("type: text longer than %d characters", maxTextRunes)
			}
			if _, ok := runeKeysym(r); !ok {
				return invalid("type: cannot type %U", r)
			}
		}
	case ActKey:
		if _, err := parseKeys(a.Keys); err != nil {
			return invalid("key: %v", err)
		}
		if a.HoldMS < 0 || time.Duration(a.HoldMS)*time.Millisecond > maxWait {
			return invalid("key: hold_ms %d: want 0 to %d", a.HoldMS, maxWait.Milliseconds())
		}
	case ActWait:
		if a.MS == nil {
			ms := int(defaultWait.Milliseconds())
			a.MS = &ms
		}
		if *a.MS < 0 || time.Duration(*a.MS)*time.Millisecond > maxWait {
			return invalid("wait: ms %d: want 0 to %d", *a.MS, maxWait.Milliseconds())
		}
	case ActScreenshot:
		if _, err := shotOptions(a).normalize(); err != nil {
			return invalid("screenshot: %v", err)
		}
	case ActCursorPosition:
	default:
		return invalid("action type %q is unknown", a.Type)
	}
	return nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func shotOptions(a *Action) ShotOptions {
	return ShotOptions{Format: a.Format, Quality: a.Quality, Width: a.Width, Height: a.Height}
}

// buttonOf reads a button name; "" is left.
func buttonOf(name string) (Button, error) {
	switch strings.ToLower(name) {
	case "", "left":
		return ButtonLeft, nil
	case "middle", "wheel":
		return ButtonMiddle, nil
	case "right":
		return ButtonRight, nil
	case "back":
		return ButtonBack, nil
	case "forward":
		return ButtonForward, nil
	}
	return 0, fmt.Errorf("button %q: want left, middle, right, back or forward", name)
}

// Observe asks for an observation after a request's actions
// (api.Observe: the screenshot, none unless asked for, and its size).
type Observe = api.Observe

// shotOptions is the screenshot the observation asks for; ok is false
// for none.
func observeShot(o *Observe) (opts ShotOptions, ok bool) {
	if o == nil || o.Screenshot == "" || o.Screenshot == "none" {
		return ShotOptions{}, false
	}
	return ShotOptions{Format: o.Screenshot, Quality: o.Quality, Width: o.Width, Height: o.Height}, true
}

// validate checks the observation's screenshot options.
func validateObserve(o *Observe) error {
	if opts, ok := observeShot(o); ok {
		if _, err := opts.normalize(); err != nil {
			return invalid("observe: %v", err)
		}
	}
	return nil
}

// Request is the body of the desktop actions endpoint
// (api.DesktopActionsRequest): actions to run in order and an optional
// observation after them. Frame and Strict apply to every action that
// names no frame of its own.
//
// ParseRequest reads, besides {"actions": [...]}, {"action": {...}}, a
// bare action in any dialect (an Anthropic tool input, an OpenAI action),
// and a JSON list of actions.
type Request = api.DesktopActionsRequest

// ParseRequest reads a request; errors are action.invalid faults.
func ParseRequest(b []byte) (Request, error) {
	var r Request
	if err := parseRequest(&r, b); err != nil {
		return Request{}, err
	}
	return r, nil
}

// parseRequest reads any of the request forms (see Request) into r.
func parseRequest(r *Request, b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return invalid("request: empty body")
	}
	if b[0] == '[' {
		var list []json.RawMessage
		if err := json.Unmarshal(b, &list); err != nil {
			return invalid("request: %v", err)
		}
		return readActions(r, list)
	}
	var probe struct {
		Actions []json.RawMessage `json:"actions"`
		Action  json.RawMessage   `json:"action"`
		Type    string            `json:"type"`
		Observe *Observe          `json:"observe"`
		Frame   *int64            `json:"frame"`
		Strict  bool              `json:"strict"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return invalid("request: %v", err)
	}
	r.Observe, r.Frame, r.Strict = probe.Observe, probe.Frame, probe.Strict
	if err := validateObserve(r.Observe); err != nil {
		return err
	}
	act := bytes.TrimSpace(probe.Action)
	switch {
	case probe.Actions != nil:
		return readActions(r, probe.Actions)
	case len(act) > 0 && act[0] == '{' && probe.Type == "":
		return readActions(r, []json.RawMessage{act})
	case len(act) > 0 || probe.Type != "":
		// The body is one action; its frame fields are its own.
		r.Frame, r.Strict = nil, false
		return readActions(r, []json.RawMessage{b})
	}
	return invalid("request: no actions")
}

func readActions(r *Request, list []json.RawMessage) error {
	if len(list) == 0 {
		return invalid("request: no actions")
	}
	r.Actions = make([]Action, len(list))
	for i, raw := range list {
		if err := parseAction(&r.Actions[i], raw); err != nil {
			fe := faults.Of(err)
			return invalid("actions[%d]: %s", i, fe.Message)
		}
	}
	return nil
}

// Result is the outcome of one action.
type Result = api.DesktopActionResult

// Observation is what a request observes after its actions.
type Observation = api.DesktopObservation

// Timing is a request's time.
type Timing = api.DesktopTiming

// Response is the outcome of a request.
type Response = api.DesktopActionsResponse

// Run runs req's actions (see Do) and then, when asked, observes.
func (s *Session) Run(ctx context.Context, req Request) (Response, error) {
	start := time.Now()
	// A malformed observation refuses the request before any action runs,
	// as a malformed action does: its error answers the whole request, and
	// the caller must be able to take it that nothing happened.
	if err := validateObserve(req.Observe); err != nil {
		return Response{Timing: Timing{TotalMS: msSince(start)}}, err
	}
	actions := make([]Action, len(req.Actions))
	for i, a := range req.Actions {
		if a.Frame == nil {
			a.Frame, a.Strict = req.Frame, a.Strict || req.Strict
		}
		actions[i] = a
	}
	results, err := s.Do(ctx, actions)
	resp := Response{OK: err == nil, Results: results}
	for _, r := range results {
		resp.OK = resp.OK && r.OK
	}
	if err == nil && req.Observe != nil {
		var obs Observation
		if opts, ok := observeShot(req.Observe); ok {
			shot, oerr := s.Screenshot(ctx, opts)
			if oerr != nil {
				resp.Timing.TotalMS = msSince(start)
				return resp, oerr
			}
			obs.Screenshot = shot
		}
		if p, cerr := s.Cursor(ctx); cerr == nil {
			f, _ := s.frame(nil, false)
			obs.Cursor.X, obs.Cursor.Y = f.FromScreen(p)
		}
		resp.Observation = &obs
	}
	if err == nil {
		// Taken only for a response that is delivered: an error is
		// answered with its envelope instead.
		resp.Faults = s.takeFaults()
	}
	resp.Timing.TotalMS = msSince(start)
	return resp, err
}

// Do runs actions in order and stops at the first that fails. It returns
// one Result per action run: all of them, or up to and including the
// failed one, whose Error says why. Do's own error is non-nil only when
// the session cannot work (the X server is down, the session is closed)
// or ctx ended.
func (s *Session) Do(ctx context.Context, actions []Action) ([]Result, error) {
	return ordered.Run(ctx, actions, func(ctx context.Context, a Action) (Result, error) {
		start := time.Now()
		r := Result{ActionResult: api.ActionResult{Type: a.Type}}
		err := validate(&a)
		if err == nil {
			err = s.run(ctx, a, &r)
		}
		r.OK, r.DurationMS = err == nil, msSince(start)
		if err != nil {
			info := faults.Of(err).Info()
			r.Error = &info
		}
		return r, err
	}, s.Err, func(a Action, fe *faults.Error) {
		s.log.Debug("desktop action failed", "type", a.Type, "code", fe.Code, "category", fe.Category, "source", fe.Source, "error", fe)
	})
}

// run performs one validated action.
func (s *Session) run(ctx context.Context, a Action, r *Result) error {
	switch a.Type {
	case ActWait:
		if err := sleepCtx(ctx, time.Duration(*a.MS)*time.Millisecond); err != nil {
			return faults.Of(err)
		}
		return nil
	case ActScreenshot:
		shot, err := s.Screenshot(ctx, shotOptions(&a))
		r.Screenshot = shot
		return err
	case ActCursorPosition:
		c, err := s.CursorPosition(ctx)
		if err != nil {
			return err
		}
		r.Cursor = &Point{X: c.X, Y: c.Y}
		return nil
	}

	f, err := s.frame(a.Frame, a.Strict)
	if err != nil {
		return err
	}
	switch a.Type {
	case ActType:
		return s.Type(ctx, a.Text)
	case ActKey:
		chords, _ := parseKeys(a.Keys)
		return s.pressChords(ctx, chords, time.Duration(a.HoldMS)*time.Millisecond)
	}

	b, _ := buttonOf(a.Button)
	mods, _ := parseModifiers(a.Modifiers)
	at, err := screenPoint(&a, f)
	if err != nil {
		return err
	}
	switch a.Type {
	case ActClick, ActDoubleClick, ActTripleClick:
		return s.pointer(ctx, a.Type, at, mods, func(x *xconn) error { x.click(b, a.Clicks); return nil })
	case ActMouseMove:
		return s.pointer(ctx, a.Type, at, mods, nil)
	case ActMouseDown, ActMouseUp:
		ev := byte(xproto.ButtonPress)
		if a.Type == ActMouseUp {
			ev = xproto.ButtonRelease
		}
		return s.pointer(ctx, a.Type, at, mods, func(x *xconn) error { x.fake(ev, byte(b)); return nil })
	case ActScroll:
		return s.pointer(ctx, a.Type, at, mods, func(x *xconn) error { x.scroll(a.DX, a.DY); return nil })
	case ActDrag:
		path := make([]image.Point, 0, len(a.Path)+1)
		for _, p := range a.Path {
			if !contains(f, p.X, p.Y) {
				return offFrame(a.Type, p.X, p.Y, f)
			}
			path = append(path, f.ToScreen(p.X, p.Y))
		}
		return s.pointer(ctx, a.Type, nil, mods, func(x *xconn) error {
			if len(path) == 1 {
				cur, err := x.pointer()
				if err != nil {
					return err
				}
				path = append([]image.Point{cur}, path...)
			}
			return x.drag(b, path)
		})
	}
	return invalid("action type %q is unknown", a.Type)
}

// screenPoint maps the action's x, y through frame f; nil when it has
// none.
func screenPoint(a *Action, f Frame) (*image.Point, error) {
	if a.X == nil {
		return nil, nil
	}
	if !contains(f, *a.X, *a.Y) {
		return nil, offFrame(a.Type, *a.X, *a.Y, f)
	}
	p := f.ToScreen(*a.X, *a.Y)
	return &p, nil
}

func offFrame(typ string, x, y float64, f Frame) error {
	return invalid("%s: (%g, %g) is outside the %dx%d screenshot (frame %d)", typ, x, y, f.Width, f.Height, f.ID)
}
