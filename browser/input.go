package browser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/chromedp/cdproto/cdp"
	jsonv2 "github.com/chromedp/cdproto/cdp/jsonv2"
	"github.com/chromedp/cdproto/dom"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/orchard/orchard/faults"
)

// send runs one input command. A dialog that opens in response ends the
// action successfully: the dialog is the page's answer, and the
// observation shows it.
func send[P, R any](ctx context.Context, s *Session, t *tab, what string, cmd cdp.Command[P, R], p P) error {
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	defer cancel()
	_, err := cdp.Call(cctx, t.target, cmd, p)
	if err == nil {
		return nil
	}
	if errors.Is(context.Cause(cctx), errDialogOpen) && ctx.Err() == nil {
		return nil
	}
	return s.classify(cctx, t, what, err)
}

// openedDialog reports a call of an action that a dialog interrupted: the
// action opened it (do refuses to start while one is open), so, as in
// send, the action ends successfully and the observation shows the dialog.
func openedDialog(ctx context.Context, t *tab, err error) bool {
	return err != nil && ctx.Err() == nil && faults.Is(err, faults.CodeActionDialogOpen) && t.openDialog() != nil
}

// queued marshals a command's parameters for chromedp and then arms its
// call's context.
type queued struct {
	p   any
	ctx *sentCtx
}

func (q queued) MarshalJSON() ([]byte, error) {
	b, err := jsonv2.Marshal(q.p, chromedp.DefaultMarshalOptions)
	q.ctx.arm()
	return b, err
}

// closed is a channel that is always ready.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// sentCtx is the context of a chromedp call that must return as soon as
// its command is queued. chromedp's Call asks for Done three times in one
// goroutine: when it derives its listener's context (before it marshals
// the parameters), in the select that queues the command, and in the one
// that waits for the answer. So: never done until the parameters are
// marshalled, not done at the next ask — the queueing select can only
// queue — and done from then on, which ends the wait at once. No timing is
// involved; TestClickMovesFirst fails if chromedp ever changes that order.
type sentCtx struct {
	context.Context // the caller's values

	mu    sync.Mutex // guards armed and asks
	armed bool
	asks  int
}

func (c *sentCtx) arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = true
}

func (c *sentCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed {
		return nil
	}
	if c.asks++; c.asks == 1 {
		return nil
	}
	return closed
}

func (c *sentCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armed && c.asks > 1 {
		return context.Canceled
	}
	return nil
}

// enqueue sends a command without waiting for its answer, so that the
// next command follows it on the wire at once (see sentCtx). The answer
// is dropped; the command's errors show on the next awaited call to the
// same target.
func enqueue(ctx context.Context, t *tab, method string, p any) {
	qctx := &sentCtx{Context: context.WithoutCancel(ctx)}
	_ = t.target.Call(qctx, method, queued{p: p, ctx: qctx}, nil)
}

// point resolves where a pointer action goes, in viewport CSS pixels.
func (s *Session) point(ctx context.Context, t *tab, fi frameInfo, a Action) (float64, float64, error) {
	if r := refOf(a); r != nil {
		return s.locate(ctx, t, a.Type, r)
	}
	return s.toViewport(ctx, t, fi, *a.X, *a.Y)
}

func buttonOf(name string) (input.MouseButton, int64) {
	switch name {
	case "right":
		return input.MouseButtonRight, 2
	case "middle":
		return input.MouseButtonMiddle, 4
	case "back":
		return input.MouseButtonBack, 8
	case "forward":
		return input.MouseButtonForward, 16
	}
	return input.MouseButtonLeft, 1
}

func (s *Session) click(ctx context.Context, t *tab, fi frameInfo, a Action) error {
	x, y, err := s.point(ctx, t, fi, a)
	if err != nil {
		return err
	}
	move := input.DispatchMouseEventParams{Type: input.DispatchMouseEventTypeMouseMoved, X: x, Y: y}
	if a.Type == ActHover {
		return send(ctx, s, t, a.Type, input.DispatchMouseEvent, move)
	}
	// Chromium answers a mouse move only with the next animation frame
	// (≈16 ms), but a press dispatches the moves queued before it at once.
	// So the move and each press are queued without waiting, as Playwright
	// does, and the release that follows them on the wire is awaited: its
	// answer comes after theirs, and their errors show on it.
	enqueue(ctx, t, input.CommandDispatchMouseEvent, move)
	n := max(a.Clicks, 1)
	if a.Type == ActDoubleClick && a.Clicks == 0 {
		n = 2
	}
	btn, mask := buttonOf(a.Button)
	for i := 1; i <= n; i++ {
		enqueue(ctx, t, input.CommandDispatchMouseEvent, input.DispatchMouseEventParams{
			Type: input.DispatchMouseEventTypeMousePressed, X: x, Y: y, Button: btn, Buttons: mask, ClickCount: int64(i),
		})
		if err := send(ctx, s, t, a.Type, input.DispatchMouseEvent, input.DispatchMouseEventParams{
			Type: input.DispatchMouseEventTypeMouseReleased, X: x, Y: y, Button: btn, ClickCount: int64(i),
		}); err != nil {
			return err
		}
		if t.openDialog() != nil {
			return nil
		}
	}
	return nil
}

// typeText types with Input.insertText, one call per run of plain text
// (key events cost a round trip each); newlines and tabs are Enter and Tab
// key presses so forms and editors react to them as to a keyboard.
func (s *Session) typeText(ctx context.Context, t *tab, a Action) error {
	r := refOf(a)
	if r != nil || a.Clear {
		var res libErr
		if err := t.evalInto(ctx, libExpr(fmt.Sprintf("focus(%s,%t)", r.js(), a.Clear)), false, s.opts.CallTimeout, &res); err != nil {
			if openedDialog(ctx, t, err) {
				return nil
			}
			return s.classify(ctx, t, "type", err)
		}
		if res.Err != "" {
			if r == nil {
				r = &ref{Sel: ":focus"}
			}
			return res.class("type", r)
		}
	}
	text := strings.ReplaceAll(a.Text, "\r\n", "\n")
	if text == "" && a.Clear {
		return s.pressKeys(ctx, t, "Delete")
	}
	for text != "" {
		i := strings.IndexAny(text, "\n\t")
		chunk := text
		if i >= 0 {
			chunk = text[:i]
		}
		if chunk != "" {
			if err := send(ctx, s, t, "type", input.InsertText, input.InsertTextParams{Text: chunk}); err != nil {
				return err
			}
		}
		if i < 0 {
			break
		}
		key := "Enter"
		if text[i] == '\t' {
			key = "Tab"
		}
		if err := s.pressKeys(ctx, t, key); err != nil {
			return err
		}
		text = text[i+1:]
	}
	return nil
}

// chord is one key press with modifiers held.
type chord struct {
	mods []*kb.Key
	key  *kb.Key
}

var modifierKeys = map[string]*kb.Key{
	"control": {Code: "ControlLeft", Key: "Control", Windows: 17, Native: 17},
	"shift":   {Code: "ShiftLeft", Key: "Shift", Windows: 16, Native: 16},
	"alt":     {Code: "AltLeft", Key: "Alt", Windows: 18, Native: 18},
	"meta":    {Code: "MetaLeft", Key: "Meta", Windows: 91, Native: 91},
}

var keyAliases = map[string]string{
	"ctrl": "control", "cmd": "meta", "command": "meta", "super": "meta", "win": "meta", "option": "alt",
	"esc": "escape", "return": "enter", "del": "delete", "up": "arrowup", "down": "arrowdown",
	"left": "arrowleft", "right": "arrowright", "pgup": "pageup", "pgdn": "pagedown", "ins": "insert",
}

// namedKeys maps lowercased DOM key names ("enter", "arrowleft", "f5") to
// their key definitions. Built on first use, not at start-up: every
// sandbox's agent links this package, and most never press a key.
var namedKeys = sync.OnceValue(func() map[string]*kb.Key {
	m := make(map[string]*kb.Key)
	for _, k := range kb.Keys {
		if utf8.RuneCountInString(k.Key) > 1 {
			name := strings.ToLower(k.Key)
			if _, ok := m[name]; !ok {
				m[name] = k
			}
		}
	}
	m["space"] = kb.Keys[' ']
	m["plus"] = kb.Keys['+']
	return m
})

// shiftedKeys maps a printable key's code ("KeyA", "Digit1") to the key
// it makes with Shift held on a US layout ("A", "!").
var shiftedKeys = sync.OnceValue(func() map[string]*kb.Key {
	m := make(map[string]*kb.Key)
	for _, k := range kb.Keys {
		if k.Shift && k.Print && k.Code != "" {
			m[k.Code] = k
		}
	}
	return m
})

// parseKeys reads "Control+a", "Enter" or "Tab Tab Enter".
func parseKeys(s string) ([]chord, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, errors.New("keys is required")
	}
	var out []chord
	for _, f := range fields {
		parts := strings.Split(f, "+")
		if strings.HasSuffix(f, "++") { // "Control++" presses plus
			parts = append(parts[:len(parts)-2], "+")
		}
		var c chord
		for i, p := range parts {
			name := strings.ToLower(p)
			if a, ok := keyAliases[name]; ok {
				name = a
			}
			if i < len(parts)-1 {
				m, ok := modifierKeys[name]
				if !ok {
					return nil, fmt.Errorf("%q is not a modifier (Control, Shift, Alt, Meta)", p)
				}
				c.mods = append(c.mods, m)
				continue
			}
			if m, ok := modifierKeys[name]; ok {
				c.key = m
			} else if k, ok := namedKeys()[name]; ok {
				c.key = k
			} else if utf8.RuneCountInString(p) == 1 {
				r, _ := utf8.DecodeRuneInString(p)
				k, ok := kb.Keys[r]
				if !ok {
					k = &kb.Key{Key: p, Text: p, Unmodified: p, Print: true}
				}
				c.key = k
			} else {
				return nil, fmt.Errorf("unknown key %q", p)
			}
		}
		out = append(out, c)
	}
	return out, nil
}

func modBit(k *kb.Key) int64 {
	switch k.Key {
	case "Alt":
		return int64(kb.ModifierAlt)
	case "Control":
		return int64(kb.ModifierCtrl)
	case "Meta":
		return int64(kb.ModifierMeta)
	case "Shift":
		return int64(kb.ModifierShift)
	}
	return 0
}

// pressKeys presses each chord: modifiers down, the key down and up,
// modifiers up.
func (s *Session) pressKeys(ctx context.Context, t *tab, keys string) error {
	chords, err := parseKeys(keys)
	if err != nil {
		return errInvalid("key: %v", err)
	}
	ev := func(typ input.DispatchKeyEventType, k *kb.Key, mods int64, text string, cmds []string) error {
		return send(ctx, s, t, "key", input.DispatchKeyEvent, input.DispatchKeyEventParams{
			Type: typ, Modifiers: mods, Key: k.Key, Code: k.Code, Text: text, UnmodifiedText: text,
			WindowsVirtualKeyCode: k.Windows, NativeVirtualKeyCode: k.Native, Commands: cmds,
		})
	}
	for _, c := range chords {
		var mods int64
		for _, m := range c.mods {
			mods |= modBit(m)
			if err := ev(input.DispatchKeyEventTypeRawKeyDown, m, mods, "", nil); err != nil {
				return err
			}
		}
		k := c.key
		if sk, ok := shiftedKeys()[k.Code]; ok && k.Print && mods&int64(kb.ModifierShift) != 0 {
			k = sk // Shift+a is "A", Shift+1 is "!", as a keyboard makes them
		}
		text := ""
		if k.Print && mods&^int64(kb.ModifierShift) == 0 {
			text = k.Text
		}
		var cmds []string
		// Editing shortcuts need their command named on Linux headless too;
		// only idempotent ones, so a page that also handles the key is safe.
		if mods == int64(kb.ModifierCtrl) && strings.EqualFold(k.Key, "a") {
			cmds = []string{"selectAll"}
		}
		typ := input.DispatchKeyEventTypeRawKeyDown
		if text != "" {
			typ = input.DispatchKeyEventTypeKeyDown
		}
		if err := ev(typ, k, mods, text, cmds); err != nil {
			return err
		}
		if err := ev(input.DispatchKeyEventTypeKeyUp, k, mods, "", nil); err != nil {
			return err
		}
		for i := len(c.mods) - 1; i >= 0; i-- {
			mods &^= modBit(c.mods[i])
			if err := ev(input.DispatchKeyEventTypeKeyUp, c.mods[i], mods, "", nil); err != nil {
				return err
			}
		}
		if t.openDialog() != nil {
			return nil
		}
	}
	return nil
}

func (s *Session) scroll(ctx context.Context, t *tab, fi frameInfo, a Action) error {
	var x, y float64
	switch {
	case refOf(a) != nil:
		var err error
		if x, y, err = s.locate(ctx, t, "scroll", refOf(a)); err != nil {
			return err
		}
		if a.DX == 0 && a.DY == 0 {
			return nil // scrolled into view
		}
	case a.X != nil:
		var err error
		if x, y, err = s.toViewport(ctx, t, fi, *a.X, *a.Y); err != nil {
			return err
		}
	default:
		vp := s.viewport()
		x, y = float64(vp.Width)/2, float64(vp.Height)/2
	}
	sc := fi.scale
	if sc <= 0 {
		sc = 1
	}
	return send(ctx, s, t, "scroll", mouseWheel, wheelParams{
		Type: input.DispatchMouseEventTypeMouseWheel, X: x, Y: y, DeltaX: a.DX / sc, DeltaY: a.DY / sc,
	})
}

// mouseWheel is Input.dispatchMouseEvent with both deltas always sent:
// the generated parameters drop a zero delta, which Chromium refuses.
var mouseWheel = cdp.Command[wheelParams, cdp.Empty]{Method: input.CommandDispatchMouseEvent}

type wheelParams struct {
	Type   input.DispatchMouseEventType `json:"type"`
	X      float64                      `json:"x"`
	Y      float64                      `json:"y"`
	DeltaX float64                      `json:"deltaX"`
	DeltaY float64                      `json:"deltaY"`
}

// dragSteps is how many moves a drag makes per path segment: enough for
// pages that track the pointer's path, few enough to stay fast.
const dragSteps = 5

func (s *Session) drag(ctx context.Context, t *tab, fi frameInfo, a Action) error {
	pts := make([][2]float64, len(a.Points))
	x0, y0, err := s.toViewport(ctx, t, fi, a.Points[0][0], a.Points[0][1])
	if err != nil {
		return err
	}
	sc := fi.scale
	if sc <= 0 {
		sc = 1
	}
	// Later points keep their offsets from the first (a full-page frame
	// scrolled the first into view).
	ox, oy := x0-a.Points[0][0]/sc, y0-a.Points[0][1]/sc
	for i, p := range a.Points {
		pts[i] = [2]float64{p[0]/sc + ox, p[1]/sc + oy}
	}
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	defer cancel()
	if len(pts) == 2 {
		// chromedp's drag also serves HTML5 drag and drop (it intercepts
		// the native drag and replays it as drag events).
		_, err := chromedp.DragAndDropXY(pts[0][0], pts[0][1], pts[1][0], pts[1][1])(cctx, t.target)
		if err != nil {
			if err := s.classify(cctx, t, "drag", err); !openedDialog(ctx, t, err) {
				return err
			}
		}
		return nil
	}
	mouse := func(typ input.DispatchMouseEventType, x, y float64) error {
		p := input.DispatchMouseEventParams{Type: typ, X: x, Y: y, Button: input.MouseButtonLeft}
		switch typ {
		case input.DispatchMouseEventTypeMousePressed:
			p.Buttons, p.ClickCount = 1, 1
		case input.DispatchMouseEventTypeMouseMoved:
			p.Buttons = 1
		case input.DispatchMouseEventTypeMouseReleased:
			p.ClickCount = 1
		}
		return send(ctx, s, t, "drag", input.DispatchMouseEvent, p)
	}
	if err := mouse(input.DispatchMouseEventTypeMouseMoved, pts[0][0], pts[0][1]); err != nil {
		return err
	}
	if err := mouse(input.DispatchMouseEventTypeMousePressed, pts[0][0], pts[0][1]); err != nil {
		return err
	}
	for i := 1; i < len(pts); i++ {
		for k := 1; k <= dragSteps; k++ {
			f := float64(k) / dragSteps
			x := pts[i-1][0] + (pts[i][0]-pts[i-1][0])*f
			y := pts[i-1][1] + (pts[i][1]-pts[i-1][1])*f
			if err := mouse(input.DispatchMouseEventTypeMouseMoved, x, y); err != nil {
				return err
			}
		}
	}
	last := pts[len(pts)-1]
	return mouse(input.DispatchMouseEventTypeMouseReleased, last[0], last[1])
}

func (s *Session) selectOption(ctx context.Context, t *tab, a Action) error {
	r := refOf(a)
	v, _ := jsonString(a.Value)
	var res libErr
	if err := t.evalInto(ctx, libExpr("selectOption("+r.js()+","+v+")"), false, s.opts.CallTimeout, &res); err != nil {
		if openedDialog(ctx, t, err) {
			return nil
		}
		return s.classify(ctx, t, "select_option", err)
	}
	if res.Err != "" {
		return res.class("select_option", r)
	}
	return nil
}

func (s *Session) uploadFile(ctx context.Context, t *tab, a Action) error {
	path, err := filepath.Abs(a.File)
	if err != nil {
		return errInvalid("upload_file: path %q: %v", a.File, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return faults.Newf(faults.CodeFileNotFound, faults.NotFound, faults.Policy, "upload_file: no file %s", a.File)
	}
	if fi.IsDir() {
		return errInvalid("upload_file: %s is a directory", a.File)
	}
	r := refOf(a)
	var res libErr
	if err := t.evalInto(ctx, libExpr("fileInput("+r.js()+")"), false, s.opts.CallTimeout, &res); err != nil {
		return s.classify(ctx, t, "upload_file", err)
	}
	if res.Err != "" {
		return res.class("upload_file", r)
	}
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	defer cancel()
	obj, err := cdp.Call(cctx, t.target, runtime.Evaluate, runtime.EvaluateParams{Expression: libExpr("picked()")})
	if err != nil {
		return s.classify(cctx, t, "upload_file", err)
	}
	if obj.Result == nil || obj.Result.ObjectID == "" {
		return errNoSuchElement("upload_file: the file input went away")
	}
	defer cdp.Call(cctx, t.target, runtime.ReleaseObject, runtime.ReleaseObjectParams{ObjectID: obj.Result.ObjectID})
	if _, err := cdp.Call(cctx, t.target, dom.SetFileInputFiles, dom.SetFileInputFilesParams{
		Files: []string{path}, ObjectID: obj.Result.ObjectID,
	}); err != nil {
		if err := s.classify(cctx, t, "upload_file", err); !openedDialog(ctx, t, err) {
			return err
		}
	}
	return nil
}

func (s *Session) answerDialog(ctx context.Context, t *tab, a Action) error {
	d := t.openDialog()
	if d == nil {
		return faults.New(faults.CodeActionNoDialog, faults.ActionFailed, faults.Policy, "dialog: no dialog is open")
	}
	accept := a.Accept == nil || *a.Accept
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout, errDialogOpen)
	defer cancel()
	if _, err := cdp.Call(cctx, t.target, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{
		Accept: accept, PromptText: a.Text,
	}); err != nil {
		return s.classify(cctx, t, "dialog", err)
	}
	t.waitUntil(ctx, s.opts.CallTimeout, func() bool { return t.dialog != d })
	return nil
}
