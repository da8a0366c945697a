package desktop

import (
	"context"
	"errors"
	"fmt"
	"image"
	"time"

	"github.com/jezek/xgb/xproto"
	"github.com/jezek/xgb/xtest"

	"github.com/orchard/orchard/api"
)

// Button is an X pointer button.
type Button uint8

// Buttons. X reports wheel steps as clicks of buttons 4–7, and the side
// buttons that browsers map to back and forward as 8 and 9.
const (
	ButtonLeft       Button = 1
	ButtonMiddle     Button = 2
	ButtonRight      Button = 3
	ButtonWheelUp    Button = 4
	ButtonWheelDown  Button = 5
	ButtonWheelLeft  Button = 6
	ButtonWheelRight Button = 7
	ButtonBack       Button = 8
	ButtonForward    Button = 9
)

// remapSettle is how long a keycode borrowed for a character missing from
// the keyboard map keeps that mapping after its last use before it may be
// mapped to another character. A client learns of a mapping change from
// MappingNotify and re-reads the map when it handles that event; if the
// keycode were remapped before then, it would read the new map and type
// the later character in place of the earlier, or drop it. An idle client
// handles its events within a millisecond or two, but every mapping change
// also makes the window manager grab its key bindings afresh (openbox:
// hundreds of requests), and a text that borrows a few dozen keycodes
// keeps the server busy enough that xterm has been measured lagging past
// 60 ms; on a machine loaded 15–35 times over its cores (the test suite
// on two cores) it lagged past 150 ms and typed later characters in place
// of earlier ones. The wait is paid only by a text with more distinct
// missing characters than there are spare keycodes (19 in the default
// map), once per turn of them. Borrowed keycodes keep their mapping after
// the action (they are taken back least recently used first), so the last
// characters of a text never wait on it, nor race it.
const remapSettle = 400 * time.Millisecond

// syncEvery bounds how many synthetic events are sent between round trips,
// so a long text cannot queue an unbounded backlog in the server.
const syncEvery = 64

// pointerSettle bounds how long a pointer action waits for its button
// releases to be processed (see settle); settlePoll spaces the checks.
const (
	pointerSettle = 2 * time.Second
	settlePoll    = 2 * time.Millisecond
)

// dragStep is the longest pointer jump within a drag, in screen pixels:
// toolkits start a drag only after motion events past a threshold, and
// some ignore a single jump straight to the drop point.
const dragStep = 20

// keymap is the server's keyboard mapping, read once per change.
type keymap struct {
	min  xproto.Keycode
	per  int
	syms []xproto.Keysym
	// pos is where each keysym is found: the first keycode that has it
	// without shift, else the first that has it with shift.
	pos map[xproto.Keysym]keyPress
	// spare are the keycodes that may be borrowed to type keysyms the map
	// lacks, highest first: those with no keysym at all and those already
	// lent (xconn.loans).
	spare []xproto.Keycode
}

func allNoSymbol(syms []xproto.Keysym) bool {
	for _, ks := range syms {
		if ks != ksNoSymbol {
			return false
		}
	}
	return true
}

// lentAs reports whether syms is the mapping a loan of ks gave its
// keycode: ks on the first two levels, which the server's keyboard
// extension may copy to more (its second group).
func lentAs(syms []xproto.Keysym, ks xproto.Keysym) bool {
	if len(syms) == 0 || syms[0] != ks {
		return false
	}
	for _, s := range syms {
		if s != ks && s != ksNoSymbol {
			return false
		}
	}
	return true
}

// keyPress is a keycode and whether shift must be held to get the keysym.
type keyPress struct {
	code  xproto.Keycode
	shift bool
}

// keymap returns the keyboard mapping, reading it again after a change.
func (x *xconn) keymap() (*keymap, error) {
	if x.keys != nil && !x.keysStale.Load() {
		return x.keys, nil
	}
	x.keysStale.Store(false)
	count := int(x.maxKeycode) - int(x.minKeycode) + 1
	r, err := xproto.GetKeyboardMapping(x.c, x.minKeycode, byte(count)).Reply()
	if err := replyErr(r == nil, err); err != nil {
		return nil, err
	}
	km := &keymap{min: x.minKeycode, per: int(r.KeysymsPerKeycode), syms: r.Keysyms,
		pos: make(map[xproto.Keysym]keyPress, count*2)}
	if km.per == 0 {
		return nil, fmt.Errorf("empty keyboard mapping")
	}
	n := len(r.Keysyms) / km.per
	for level := 0; level < 2 && level < km.per; level++ {
		for i := range n {
			ks := r.Keysyms[i*km.per+level]
			if level == 1 && ks == ksNoSymbol {
				// The core protocol's rule: a lone lowercase letter implies
				// its uppercase on the shifted level.
				if l := r.Keysyms[i*km.per]; l >= 'a' && l <= 'z' {
					ks = l - 'a' + 'A'
				}
			}
			if ks == ksNoSymbol {
				continue
			}
			if _, ok := km.pos[ks]; !ok {
				km.pos[ks] = keyPress{code: km.min + xproto.Keycode(i), shift: level == 1}
			}
		}
	}
	for i := n - 1; i >= 0; i-- {
		kc := km.min + xproto.Keycode(i)
		syms := r.Keysyms[i*km.per : (i+1)*km.per]
		l := x.loans[kc]
		switch {
		case l != nil && lentAs(syms, l.ks):
			km.spare = append(km.spare, kc)
		case allNoSymbol(syms):
			delete(x.loans, kc)
			km.spare = append(km.spare, kc)
		default: // mapped by another client since
			delete(x.loans, kc)
		}
	}
	x.keys = km
	return km, nil
}

func (x *xconn) fake(typ byte, detail byte) {
	if typ == xproto.ButtonRelease && detail >= 1 && detail <= 5 {
		x.released |= xproto.ButtonMask1 << (detail - 1)
	}
	xtest.FakeInput(x.c, typ, detail, 0, x.root, 0, 0, 0)
}

// settle waits until the server has processed the button releases sent
// since the last settle, for up to pointerSettle. A round trip does not
// tell: a client's synchronous button grab freezes the pointer until that
// client lets the events through, and the window manager takes one on
// every click (openbox, to focus the window), so a release, and any move
// after it, can wait in the server's queue for a while, longer when the
// window manager is busy (with the mapping changes of typed characters
// the keyboard map lacks, say). The core protocol reports buttons 1–5.
func (x *xconn) settle(ctx context.Context) error {
	want := x.released
	x.released = 0
	if want == 0 {
		return nil
	}
	deadline := time.Now().Add(pointerSettle)
	for {
		r, err := xproto.QueryPointer(x.c, x.root).Reply()
		if err := replyErr(r == nil, err); err != nil {
			return err
		}
		if r.Mask&want == 0 || !time.Now().Before(deadline) {
			return nil
		}
		if err := sleepCtx(ctx, settlePoll); err != nil {
			return err
		}
	}
}

// moveTo moves the pointer to p (screen pixels) without a round trip.
func (x *xconn) moveTo(p image.Point) {
	xtest.FakeInput(x.c, xproto.MotionNotify, 0, 0, x.root, int16(p.X), int16(p.Y), 0)
}

// pointer returns the pointer's position in screen pixels.
func (x *xconn) pointer() (image.Point, error) {
	r, err := xproto.QueryPointer(x.c, x.root).Reply()
	if err := replyErr(r == nil, err); err != nil {
		return image.Point{}, err
	}
	return image.Pt(int(r.RootX), int(r.RootY)), nil
}

// click presses and releases b n times at the pointer's position.
func (x *xconn) click(b Button, n int) {
	for range n {
		x.fake(xproto.ButtonPress, byte(b))
		x.fake(xproto.ButtonRelease, byte(b))
	}
}

// drag moves to path[0], holds b, moves through the rest of path in steps
// of at most dragStep pixels, and releases b at the last point.
func (x *xconn) drag(b Button, path []image.Point) error {
	x.moveTo(path[0])
	x.fake(xproto.ButtonPress, byte(b))
	// The press must reach the client before the motion that follows it,
	// or a toolkit may see the motion as a hover.
	if err := x.sync(); err != nil {
		return err
	}
	prev := path[0]
	for _, p := range path[1:] {
		d := p.Sub(prev)
		steps := max(abs(d.X), abs(d.Y))/dragStep + 1
		for i := 1; i <= steps; i++ {
			x.moveTo(image.Pt(prev.X+d.X*i/steps, prev.Y+d.Y*i/steps))
		}
		prev = p
	}
	if err := x.sync(); err != nil {
		return err
	}
	x.fake(xproto.ButtonRelease, byte(b))
	return nil
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// loan is a spare keycode mapped to a keysym the keyboard map lacks, and
// when it was last typed on (after the server had the events).
type loan struct {
	ks   xproto.Keysym
	used time.Time
}

// borrowed tracks the loans one action types on.
type borrowed struct {
	x    *xconn
	km   *keymap
	used map[xproto.Keycode]bool
}

// press returns how to type ks: from the keymap (where earlier loans
// are), or on a spare keycode mapped to it now. ok is false when every
// spare keycode is in use by this action.
func (b *borrowed) press(ks xproto.Keysym) (keyPress, bool, error) {
	if p, found := b.km.pos[ks]; found {
		if b.x.loans[p.code] != nil {
			b.mark(p.code)
		}
		return p, true, nil
	}
	if len(b.km.spare) == 0 {
		return keyPress{}, false, fmt.Errorf("keysym 0x%x is not in the keyboard map and no keycode is free to map it", uint32(ks))
	}
	kc, ok := b.pick()
	if !ok {
		return keyPress{}, false, nil
	}
	if l := b.x.loans[kc]; l != nil {
		if wait := remapSettle - time.Since(l.used); wait > 0 {
			b.x.extend(wait)
			time.Sleep(wait)
		}
		if p, ok := b.km.pos[l.ks]; ok && p.code == kc {
			delete(b.km.pos, l.ks)
		}
	}
	// Both levels carry the keysym, so a held shift does not change it.
	syms := []xproto.Keysym{ks, ks}
	xproto.ChangeKeyboardMapping(b.x.c, 1, kc, 2, syms)
	b.x.loans[kc] = &loan{ks: ks}
	b.km.pos[ks] = keyPress{code: kc}
	b.mark(kc)
	return keyPress{code: kc}, true, nil
}

func (b *borrowed) mark(kc xproto.Keycode) {
	if b.used == nil {
		b.used = make(map[xproto.Keycode]bool)
	}
	b.used[kc] = true
}

// pick returns a spare keycode never lent, else the loan used longest ago
// that this action has not typed on.
func (b *borrowed) pick() (xproto.Keycode, bool) {
	var best *loan
	var code xproto.Keycode
	for _, kc := range b.km.spare {
		l := b.x.loans[kc]
		if l == nil {
			return kc, true
		}
		if !b.used[kc] && (best == nil || l.used.Before(best.used)) {
			best, code = l, kc
		}
	}
	return code, best != nil
}

// finish ends the action's use of its loans: once the server has its
// events, their clocks start (see remapSettle).
func (b *borrowed) finish() error {
	if len(b.used) == 0 {
		return nil
	}
	err := b.x.sync()
	now := time.Now()
	for kc := range b.used {
		if l := b.x.loans[kc]; l != nil {
			l.used = now
		}
	}
	clear(b.used)
	// Our own changes mark the cached map stale; it is still right.
	b.x.keysStale.Store(false)
	return err
}

// restore makes every spare keycode this action typed on free to map
// again: it waits until the clients had time to read their mappings.
func (b *borrowed) restore() error {
	if err := b.finish(); err != nil {
		return err
	}
	// A long text of characters the map lacks waits here hundreds of
	// times: the waits are the action's own, not the X server's slowness.
	b.x.extend(remapSettle)
	time.Sleep(remapSettle)
	return nil
}

// typeText types text one character at a time: a key press and release
// per rune, with shift where the keymap puts the character on the
// shifted level.
func (x *xconn) typeText(ctx context.Context, text string) error {
	km, err := x.keymap()
	if err != nil {
		return err
	}
	shift, ok := km.pos[ksShiftL]
	if !ok {
		return fmt.Errorf("no Shift_L key in the keyboard map")
	}
	b := &borrowed{x: x, km: km}
	sent := 0
	for _, r := range text {
		if err := ctx.Err(); err != nil {
			return errors.Join(context.Cause(ctx), b.finish())
		}
		ks, ok := runeKeysym(r)
		if !ok {
			return errors.Join(fmt.Errorf("cannot type %U", r), b.finish())
		}
		p, ok, err := b.press(ks)
		if err != nil {
			return errors.Join(err, b.finish())
		}
		if !ok { // every spare keycode is taken: give them back and go on
			if err := b.restore(); err != nil {
				return err
			}
			if p, _, err = b.press(ks); err != nil {
				return err
			}
		}
		if p.shift {
			x.fake(xproto.KeyPress, byte(shift.code))
		}
		x.fake(xproto.KeyPress, byte(p.code))
		x.fake(xproto.KeyRelease, byte(p.code))
		if p.shift {
			x.fake(xproto.KeyRelease, byte(shift.code))
		}
		if sent++; sent%syncEvery == 0 {
			if err := x.sync(); err != nil {
				return err
			}
		}
	}
	if err := x.sync(); err != nil {
		return err
	}
	return b.finish()
}

// pressChords presses each chord in turn: its keys down in order, held
// for hold, then up in reverse order. Keys that need shift on their own
// (a capital letter) get it.
func (x *xconn) pressChords(ctx context.Context, chords []chord, hold time.Duration) error {
	km, err := x.keymap()
	if err != nil {
		return err
	}
	shift, ok := km.pos[ksShiftL]
	if !ok {
		return fmt.Errorf("no Shift_L key in the keyboard map")
	}
	b := &borrowed{x: x, km: km}
	for _, c := range chords {
		codes, ok, err := b.chordCodes(c, shift.code)
		if err == nil && !ok {
			// Earlier chords hold the spare keycodes: give them back,
			// as typing does, and map this chord's keys afresh.
			if err = b.restore(); err == nil {
				codes, ok, err = b.chordCodes(c, shift.code)
				if err == nil && !ok {
					err = fmt.Errorf("chord has more unmapped keys than free keycodes")
				}
			}
		}
		if err != nil {
			return errors.Join(err, b.finish())
		}
		if err := x.holdKeys(ctx, codes, hold); err != nil {
			return errors.Join(err, b.finish())
		}
	}
	return b.finish()
}

// chordCodes returns the keycodes to press for chord c, with shift where
// a key needs it. ok is false when the spare keycodes ran out.
func (b *borrowed) chordCodes(c chord, shift xproto.Keycode) (codes []xproto.Keycode, ok bool, err error) {
	for _, ks := range c {
		p, ok, err := b.press(ks)
		if err != nil || !ok {
			return nil, ok, err
		}
		if p.shift && !containsCode(codes, shift) {
			codes = append(codes, shift)
		}
		codes = append(codes, p.code)
	}
	return codes, true, nil
}

// holdKeys presses codes in order, waits hold, and releases them in
// reverse order. The keys are released even when ctx ends during the
// wait: a key left down would repeat, and a modifier would stick.
func (x *xconn) holdKeys(ctx context.Context, codes []xproto.Keycode, hold time.Duration) error {
	for _, kc := range codes {
		x.fake(xproto.KeyPress, byte(kc))
	}
	var waitErr error
	if hold > 0 {
		if err := x.sync(); err != nil {
			return err
		}
		waitErr = sleepCtx(ctx, hold)
	}
	for i := len(codes) - 1; i >= 0; i-- {
		x.fake(xproto.KeyRelease, byte(codes[i]))
	}
	return errors.Join(waitErr, x.sync())
}

// modifiersDown presses the modifier keys mods and returns the keycodes
// to release afterwards with modifiersUp.
func (x *xconn) modifiersDown(mods chord) ([]xproto.Keycode, error) {
	if len(mods) == 0 {
		return nil, nil
	}
	km, err := x.keymap()
	if err != nil {
		return nil, err
	}
	codes := make([]xproto.Keycode, 0, len(mods))
	for _, ks := range mods {
		p, ok := km.pos[ks]
		if !ok {
			return nil, fmt.Errorf("modifier %s is not in the keyboard map", keyName(ks))
		}
		codes = append(codes, p.code)
	}
	for _, kc := range codes {
		x.fake(xproto.KeyPress, byte(kc))
	}
	return codes, nil
}

func (x *xconn) modifiersUp(codes []xproto.Keycode) {
	for i := len(codes) - 1; i >= 0; i-- {
		x.fake(xproto.KeyRelease, byte(codes[i]))
	}
}

func containsCode(codes []xproto.Keycode, kc xproto.Keycode) bool {
	for _, c := range codes {
		if c == kc {
			return true
		}
	}
	return false
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// releaseAll releases every key and pointer button the server has down.
func (x *xconn) releaseAll() error {
	km, err := xproto.QueryKeymap(x.c).Reply()
	if err := replyErr(km == nil, err); err != nil {
		return err
	}
	for i, bits := range km.Keys {
		for b := range 8 {
			if bits&(1<<b) != 0 {
				x.fake(xproto.KeyRelease, byte(i*8+b))
			}
		}
	}
	p, err := xproto.QueryPointer(x.c, x.root).Reply()
	if err := replyErr(p == nil, err); err != nil {
		return err
	}
	for b := 1; b <= 5; b++ { // the core protocol reports buttons 1–5
		if p.Mask&(xproto.ButtonMask1<<(b-1)) != 0 {
			x.fake(xproto.ButtonRelease, byte(b))
		}
	}
	return x.sync()
}

// scroll clicks the wheel buttons: dy steps down (up when negative), dx
// steps right (left when negative).
func (x *xconn) scroll(dx, dy int) {
	if dy > 0 {
		x.click(ButtonWheelDown, dy)
	} else if dy < 0 {
		x.click(ButtonWheelUp, -dy)
	}
	if dx > 0 {
		x.click(ButtonWheelRight, dx)
	} else if dx < 0 {
		x.click(ButtonWheelLeft, -dx)
	}
}

// pointer runs a pointer action as one X operation: move to at (when
// given), press mods, fn, release mods, and a round trip so the server
// has processed it all when it returns.
func (s *Session) pointer(ctx context.Context, op string, at *image.Point, mods chord, fn func(x *xconn) error) error {
	if at != nil && !s.inScreen(*at) {
		return invalid("%s: (%d, %d) is outside the %dx%d screen", op, at.X, at.Y, s.width, s.height)
	}
	return s.withX(ctx, op, pointerSettle, func(ctx context.Context, x *xconn) error {
		if at != nil {
			x.moveTo(*at)
		}
		codes, err := x.modifiersDown(mods)
		if err != nil {
			return err
		}
		if fn != nil {
			err = fn(x)
		}
		if err == nil {
			// Before the modifiers go up: a release held back by a grab
			// still carries them when it is let through.
			err = x.settle(ctx)
		}
		x.modifiersUp(codes)
		return errors.Join(err, x.sync())
	})
}

// MouseMove moves the pointer to p, in screen pixels.
func (s *Session) MouseMove(ctx context.Context, p image.Point) error {
	return s.pointer(ctx, ActMouseMove, &p, nil, nil)
}

// Click moves the pointer to p (screen pixels) and clicks b count times:
// 2 is a double click, 3 a triple click.
func (s *Session) Click(ctx context.Context, p image.Point, b Button, count int) error {
	if count < 1 || count > maxClicks {
		return invalid("click: count %d: want 1 to %d", count, maxClicks)
	}
	return s.pointer(ctx, ActClick, &p, nil, func(x *xconn) error { x.click(b, count); return nil })
}

// MouseDown presses b where the pointer is.
func (s *Session) MouseDown(ctx context.Context, b Button) error {
	return s.pointer(ctx, ActMouseDown, nil, nil, func(x *xconn) error { x.fake(xproto.ButtonPress, byte(b)); return nil })
}

// MouseUp releases b where the pointer is.
func (s *Session) MouseUp(ctx context.Context, b Button) error {
	return s.pointer(ctx, ActMouseUp, nil, nil, func(x *xconn) error { x.fake(xproto.ButtonRelease, byte(b)); return nil })
}

// Drag presses the left button at path[0], moves through the rest of
// path and releases it at the last point (screen pixels).
func (s *Session) Drag(ctx context.Context, path []image.Point) error {
	if len(path) < 2 {
		return invalid("drag: path needs at least 2 points")
	}
	for _, p := range path {
		if !s.inScreen(p) {
			return invalid("drag: (%d, %d) is outside the %dx%d screen", p.X, p.Y, s.width, s.height)
		}
	}
	return s.pointer(ctx, ActDrag, nil, nil, func(x *xconn) error { return x.drag(ButtonLeft, path) })
}

// Scroll moves the pointer to p (screen pixels) and turns the wheel dy
// steps down (up when negative) and dx steps right (left when negative).
func (s *Session) Scroll(ctx context.Context, p image.Point, dx, dy int) error {
	dx = max(-maxScrollSteps, min(dx, maxScrollSteps))
	dy = max(-maxScrollSteps, min(dy, maxScrollSteps))
	return s.pointer(ctx, ActScroll, &p, nil, func(x *xconn) error { x.scroll(dx, dy); return nil })
}

// Type types text into the focused window. Characters missing from the
// keyboard map are typed on a spare keycode mapped to them for the time.
func (s *Session) Type(ctx context.Context, text string) error {
	return s.withX(ctx, ActType, 0, func(ctx context.Context, x *xconn) error { return x.typeText(ctx, text) })
}

// Key presses xdotool-style chords in turn: "ctrl+s", "Return",
// "shift+Tab", "ctrl+alt+Delete", "Tab Tab Return".
func (s *Session) Key(ctx context.Context, keys string) error {
	chords, err := parseKeys(keys)
	if err != nil {
		return invalid("key: %v", err)
	}
	return s.pressChords(ctx, chords, 0)
}

func (s *Session) pressChords(ctx context.Context, chords []chord, hold time.Duration) error {
	extra := time.Duration(len(chords))*hold + remapSettle
	return s.withX(ctx, ActKey, extra, func(ctx context.Context, x *xconn) error { return x.pressChords(ctx, chords, hold) })
}

// CursorPosition reads the pointer and maps it into the latest frame, as
// the cursor_position action does.
func (s *Session) CursorPosition(ctx context.Context) (api.Cursor, error) {
	p, err := s.Cursor(ctx)
	if err != nil {
		return api.Cursor{}, err
	}
	f, _ := s.frame(nil, false)
	x, y := f.FromScreen(p)
	return api.Cursor{X: x, Y: y, ScreenX: p.X, ScreenY: p.Y, Frame: f.ID, Scale: f.Scale}, nil
}

// Cursor returns the pointer's position in screen pixels.
func (s *Session) Cursor(ctx context.Context) (image.Point, error) {
	var p image.Point
	err := s.withX(ctx, ActCursorPosition, 0, func(_ context.Context, x *xconn) error {
		var err error
		p, err = x.pointer()
		return err
	})
	return p, err
}
