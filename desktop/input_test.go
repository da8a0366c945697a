package desktop

import (
	"context"
	"fmt"
	"image"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/orchard/orchard/faults"
)

// An XTest move lands where QueryPointer then says the pointer is.
func TestMoveThenQueryPointer(t *testing.T) {
	s := sharedSession(t)
	for _, p := range []image.Point{{X: 0, Y: 0}, {X: 1, Y: 1}, {X: 512, Y: 384}, {X: 1023, Y: 767}, {X: 17, Y: 700}, {X: 1000, Y: 3}} {
		if err := s.MouseMove(ctxT(t), p); err != nil {
			t.Fatalf("move to %v: %v", p, err)
		}
		got, err := s.Cursor(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if got != p {
			t.Errorf("moved to %v, pointer at %v", p, got)
		}
	}
	for _, p := range []image.Point{{X: -1, Y: 0}, {X: 1024, Y: 0}, {X: 0, Y: 768}} {
		err := s.MouseMove(ctxT(t), p)
		if fe := faults.Of(err); err == nil || fe.Code != faults.CodeActionInvalid {
			t.Errorf("move to %v off screen = %v, want action.invalid", p, err)
		}
	}
}

// Coordinates in a scaled screenshot's pixels map back to the screen: on
// a 512-wide shot of the 1024-wide screen, (100, 100) is (200, 200), and
// the click reaches the window there at that point.
func TestClickAfterScaledScreenshot(t *testing.T) {
	s := sharedSession(t)
	pr := newProbe(t, s, image.Rect(150, 150, 260, 260), xproto.EventMaskButtonPress|xproto.EventMaskButtonRelease)
	res := mustDo(t, s, Action{Type: ActScreenshot, Format: FormatJPEG, Width: 512})
	if f := res[0].Screenshot.Frame; f.Width != 512 || f.Height != 384 || f.Scale != 0.5 {
		t.Fatalf("screenshot frame %+v, want 512x384 at scale 0.5", f)
	}
	for _, tc := range []struct {
		a      Action
		button xproto.Button
		count  int
	}{
		{Action{Type: ActClick, X: fp(100), Y: fp(100)}, 1, 1},
		{Action{Type: ActClick, X: fp(100), Y: fp(100), Button: "right"}, 3, 1},
		{Action{Type: ActDoubleClick, X: fp(100), Y: fp(100)}, 1, 2},
		{Action{Type: ActTripleClick, X: fp(100), Y: fp(100)}, 1, 3},
	} {
		pr.drain()
		mustDo(t, s, tc.a)
		for i := range tc.count {
			ev := pr.next(t, "ButtonPress", func(ev xgb.Event) bool { _, ok := ev.(xproto.ButtonPressEvent); return ok }).(xproto.ButtonPressEvent)
			if ev.RootX != 200 || ev.RootY != 200 || ev.EventX != 50 || ev.EventY != 50 || ev.Detail != tc.button {
				t.Errorf("%s press %d: button %d at root (%d,%d) window (%d,%d); want button %d at (200,200) / (50,50)",
					tc.a.Type, i+1, ev.Detail, ev.RootX, ev.RootY, ev.EventX, ev.EventY, tc.button)
			}
		}
		p, err := s.Cursor(ctxT(t))
		if err != nil || p != image.Pt(200, 200) {
			t.Errorf("pointer at %v (%v), want (200,200)", p, err)
		}
	}
	// cursor_position answers in the latest frame's pixels.
	res = mustDo(t, s, Action{Type: ActCursorPosition})
	if c := res[0].Cursor; c == nil || c.X != 100 || c.Y != 100 {
		t.Errorf("cursor_position = %+v, want (100,100)", c)
	}
	// Off the screenshot is refused before anything moves.
	res, _ = s.Do(ctxT(t), []Action{{Type: ActClick, X: fp(600), Y: fp(10)}})
	if res[0].OK || res[0].Error.Code != faults.CodeActionInvalid {
		t.Errorf("click off the frame = %+v, want action.invalid", res[0])
	}
}

// A strict action naming an older frame is refused; a lax one uses that
// frame's scale.
func TestStaleFrame(t *testing.T) {
	s := sharedSession(t)
	old := mustDo(t, s, Action{Type: ActScreenshot, Width: 256})[0].Screenshot.ID
	latest := mustDo(t, s, Action{Type: ActScreenshot})[0].Screenshot.ID
	if latest <= old {
		t.Fatalf("frame ids %d then %d: want increasing", old, latest)
	}
	res, err := s.Do(ctxT(t), []Action{{Type: ActClick, X: fp(10), Y: fp(10), Frame: &old, Strict: true}, {Type: ActWait, MS: ip(0)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].OK || res[0].Error.Code != faults.CodeActionStaleFrame || res[0].Error.Source != faults.Policy {
		t.Fatalf("strict click on a stale frame = %+v, want one failed result, action.stale_frame", res)
	}
	mustDo(t, s, Action{Type: ActMouseMove, X: fp(10), Y: fp(10), Frame: &old})
	if p, _ := s.Cursor(ctxT(t)); p != image.Pt(40, 40) {
		t.Errorf("move on frame %d (scale 0.25) to (10,10): pointer at %v, want (40,40)", old, p)
	}
	mustDo(t, s, Action{Type: ActMouseMove, X: fp(10), Y: fp(10), Frame: &latest, Strict: true})
	if p, _ := s.Cursor(ctxT(t)); p != image.Pt(10, 10) {
		t.Errorf("move on frame %d (scale 1) to (10,10): pointer at %v", latest, p)
	}
}

// Drags, scrolls and held modifiers reach a window as the events they
// stand for.
func TestPointerGestures(t *testing.T) {
	s := sharedSession(t)
	mustDo(t, s, Action{Type: ActScreenshot}) // frame pixels = screen pixels
	pr := newProbe(t, s, image.Rect(300, 300, 700, 500),
		xproto.EventMaskButtonPress|xproto.EventMaskButtonRelease|xproto.EventMaskButtonMotion)
	isPress := func(ev xgb.Event) bool { _, ok := ev.(xproto.ButtonPressEvent); return ok }
	isRelease := func(ev xgb.Event) bool { _, ok := ev.(xproto.ButtonReleaseEvent); return ok }

	t.Run("drag", func(t *testing.T) {
		pr.drain()
		mustDo(t, s, Action{Type: ActDrag, Path: []Point{{X: 320, Y: 320}, {X: 500, Y: 400}, {X: 680, Y: 480}}})
		press := pr.next(t, "ButtonPress", isPress).(xproto.ButtonPressEvent)
		motions := 0
		var release xproto.ButtonReleaseEvent
		pr.next(t, "ButtonRelease", func(ev xgb.Event) bool {
			if _, ok := ev.(xproto.MotionNotifyEvent); ok {
				motions++
			}
			r, ok := ev.(xproto.ButtonReleaseEvent)
			release = r
			return ok
		})
		if press.RootX != 320 || press.RootY != 320 || release.RootX != 680 || release.RootY != 480 {
			t.Errorf("drag pressed at (%d,%d), released at (%d,%d); want (320,320) → (680,480)",
				press.RootX, press.RootY, release.RootX, release.RootY)
		}
		if motions < 3 {
			t.Errorf("drag of 360 px sent %d motion events, want several", motions)
		}
	})
	t.Run("drag from the cursor", func(t *testing.T) {
		mustDo(t, s, Action{Type: ActMouseMove, X: fp(400), Y: fp(350)})
		pr.drain()
		mustDo(t, s, Action{Type: ActDrag, Path: []Point{{X: 450, Y: 420}}})
		press := pr.next(t, "ButtonPress", isPress).(xproto.ButtonPressEvent)
		release := pr.next(t, "ButtonRelease", isRelease).(xproto.ButtonReleaseEvent)
		if press.RootX != 400 || press.RootY != 350 || release.RootX != 450 || release.RootY != 420 {
			t.Errorf("drag from the cursor: (%d,%d) → (%d,%d), want (400,350) → (450,420)",
				press.RootX, press.RootY, release.RootX, release.RootY)
		}
	})
	t.Run("scroll", func(t *testing.T) {
		for _, tc := range []struct {
			dx, dy int
			button xproto.Button
			n      int
		}{{0, 3, 5, 3}, {0, -2, 4, 2}, {2, 0, 7, 2}, {-1, 0, 6, 1}} {
			pr.drain()
			mustDo(t, s, Action{Type: ActScroll, X: fp(500), Y: fp(400), DX: tc.dx, DY: tc.dy})
			for range tc.n {
				ev := pr.next(t, "ButtonPress", isPress).(xproto.ButtonPressEvent)
				if ev.Detail != tc.button || ev.RootX != 500 || ev.RootY != 400 {
					t.Errorf("scroll dx=%d dy=%d: button %d at (%d,%d), want button %d at (500,400)",
						tc.dx, tc.dy, ev.Detail, ev.RootX, ev.RootY, tc.button)
				}
			}
		}
	})
	t.Run("modifiers held", func(t *testing.T) {
		pr.drain()
		mustDo(t, s, Action{Type: ActClick, X: fp(350), Y: fp(350), Modifiers: "ctrl+shift"})
		ev := pr.next(t, "ButtonPress", isPress).(xproto.ButtonPressEvent)
		want := uint16(xproto.ModMaskControl | xproto.ModMaskShift)
		if ev.State&want != want {
			t.Errorf("click with ctrl+shift: state %#x, want control and shift", ev.State)
		}
		pr.drain()
		mustDo(t, s, Action{Type: ActClick, X: fp(350), Y: fp(350)})
		if ev := pr.next(t, "ButtonPress", isPress).(xproto.ButtonPressEvent); ev.State&want != 0 {
			t.Errorf("modifiers still held after the click: state %#x", ev.State)
		}
	})
	t.Run("mouse down and up", func(t *testing.T) {
		pr.drain()
		mustDo(t, s, Action{Type: ActMouseDown, X: fp(600), Y: fp(450)}, Action{Type: ActMouseUp, X: fp(610), Y: fp(460)})
		press := pr.next(t, "ButtonPress", isPress).(xproto.ButtonPressEvent)
		release := pr.next(t, "ButtonRelease", isRelease).(xproto.ButtonReleaseEvent)
		if press.RootX != 600 || release.RootX != 610 || press.Detail != 1 {
			t.Errorf("down at %d (button %d), up at %d", press.RootX, press.Detail, release.RootX)
		}
	})
}

// A click returns once the server has processed it, release included,
// also when the window manager's synchronous button grab holds the
// pointer frozen for a while (openbox, busy with the mapping changes a
// typed "é" brings): the next move lands at once and the button reads up.
func TestClickReturnsProcessed(t *testing.T) {
	s := sharedSession(t)
	win := findClient(t, s, "xterm")
	center := win.Min.Add(win.Size().Div(2))
	mustDo(t, s, Action{Type: ActScreenshot})
	for i := range 5 {
		mustDo(t, s,
			Action{Type: ActType, Text: "é"},
			Action{Type: ActClick, X: fp(float64(center.X)), Y: fp(float64(center.Y))},
		)
		var mask uint16
		err := s.withX(ctxT(t), "query", 0, func(_ context.Context, x *xconn) error {
			r, err := xproto.QueryPointer(x.c, x.root).Reply()
			if err == nil {
				mask = r.Mask
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		target := image.Pt(5+i, 5)
		mustDo(t, s, Action{Type: ActMouseMove, X: fp(float64(target.X)), Y: fp(float64(target.Y))})
		p, _ := s.Cursor(ctxT(t))
		if mask&xproto.ButtonMask1 != 0 || p != target {
			t.Errorf("round %d: after the click the left button reads down (mask %#x); a move to %v then left the pointer at %v", i, mask, target, p)
		}
		mustDo(t, s, Action{Type: ActKey, Keys: "ctrl+u"})
	}
}

// Key chords arrive as the keys and modifier state they name.
func TestKeyChords(t *testing.T) {
	s := sharedSession(t)
	pr := newProbe(t, s, image.Rect(700, 50, 800, 150), xproto.EventMaskKeyPress|xproto.EventMaskKeyRelease)
	pr.focus(t)
	km, err := xproto.GetKeyboardMapping(pr.c, xproto.Setup(pr.c).MinKeycode,
		byte(xproto.Setup(pr.c).MaxKeycode-xproto.Setup(pr.c).MinKeycode+1)).Reply()
	if err != nil {
		t.Fatal(err)
	}
	keysym := func(kc xproto.Keycode) xproto.Keysym {
		i := int(kc-xproto.Setup(pr.c).MinKeycode) * int(km.KeysymsPerKeycode)
		return km.Keysyms[i]
	}
	for _, tc := range []struct {
		keys  string
		last  xproto.Keysym // the last key pressed (level 0 keysym)
		state uint16        // modifiers held when it is pressed
	}{
		{"ctrl+s", 's', xproto.ModMaskControl},
		{"Return", ksReturn, 0},
		{"shift+Tab", ksTab, xproto.ModMaskShift},
		{"ctrl+alt+Delete", ksDelete, xproto.ModMaskControl | xproto.ModMask1},
		{"F5", 0xffc2, 0},
		{"Page_Down", 0xff56, 0},
		{"super+x", 'x', xproto.ModMask4},
		{"ctrl+A", 'a', xproto.ModMaskControl | xproto.ModMaskShift},
	} {
		pr.drain()
		mustDo(t, s, Action{Type: ActKey, Keys: tc.keys})
		var last xproto.KeyPressEvent
		deadline := time.After(2 * time.Second)
	collect:
		for {
			select {
			case ev := <-pr.events:
				if k, ok := ev.(xproto.KeyPressEvent); ok {
					last = k
				}
				if r, ok := ev.(xproto.KeyReleaseEvent); ok && r.Detail == last.Detail {
					break collect
				}
			case <-deadline:
				t.Fatalf("%s: no key release", tc.keys)
			}
		}
		if keysym(last.Detail) != tc.last || last.State&0xff != tc.state {
			t.Errorf("%s: last key %#x with state %#x; want %#x with %#x", tc.keys, keysym(last.Detail), last.State, tc.last, tc.state)
		}
	}
	// A key the map lacks is typed on a borrowed keycode.
	pr.drain()
	mustDo(t, s, Action{Type: ActKey, Keys: "ctrl+é"})
	if ev := pr.next(t, "KeyPress", func(ev xgb.Event) bool {
		k, ok := ev.(xproto.KeyPressEvent)
		return ok && k.State&xproto.ModMaskControl != 0
	}).(xproto.KeyPressEvent); ev.Detail == 0 {
		t.Error("no key press for é")
	}
}

// A key action of more chords with unmapped keys than there are spare
// keycodes gives the spares back between chords, as typing does, and
// every key arrives.
func TestKeyChordsBeyondSpareKeycodes(t *testing.T) {
	s := sharedSession(t)
	win := findClient(t, s, "xterm")
	out := filepath.Join(t.TempDir(), "keyed")
	var names []string
	var want strings.Builder
	for i := range 32 {
		r := rune(0x430 + i) // Cyrillic а..я, none in the map
		names = append(names, string(r))
		want.WriteRune(r)
	}
	center := win.Min.Add(win.Size().Div(2))
	mustDo(t, s,
		Action{Type: ActScreenshot},
		Action{Type: ActClick, X: fp(float64(center.X)), Y: fp(float64(center.Y))},
		Action{Type: ActType, Text: "printf '%s' '"},
		Action{Type: ActKey, Keys: strings.Join(names, " ")},
		Action{Type: ActType, Text: "' > " + out + "\n"},
	)
	var got []byte
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(out); err == nil && len(b) > 0 {
			if got = b; string(got) == want.String() {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("pressed %q as keys into the xterm; the file holds %q", want.String(), got)
}

// Typing Unicode into a terminal reaches the program in it: the shell
// writes what it was typed to a file.
func TestTypeUnicodeIntoXterm(t *testing.T) {
	s := sharedSession(t)
	win := findClient(t, s, "xterm")
	out := filepath.Join(t.TempDir(), "typed")
	want := "héllo ✓ 日本 ÅΩж"
	center := win.Min.Add(win.Size().Div(2))
	mustDo(t, s,
		Action{Type: ActScreenshot},
		Action{Type: ActClick, X: fp(float64(center.X)), Y: fp(float64(center.Y))},
		Action{Type: ActType, Text: "printf '%s' '" + want + "' > " + out},
		Action{Type: ActKey, Keys: "Return"},
	)
	var got []byte
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(out); err == nil && len(b) > 0 {
			got = b
			if string(got) == want {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("session processes: %v", describe(sessionProcs(s.id)))
	t.Fatalf("typed %q into the xterm; the file holds %q", want, got)
}

// A text with more distinct characters the keyboard map lacks than there
// are spare keycodes reuses them; every character still arrives as
// itself, neither dropped nor read through a later mapping of its keycode.
func TestTypeReusedKeycodesIntoXterm(t *testing.T) {
	s := sharedSession(t)
	win := findClient(t, s, "xterm")
	var want strings.Builder
	for i := range 32 {
		want.WriteRune(rune(0x430 + i)) // Cyrillic а..я, none in the map
	}
	center := win.Min.Add(win.Size().Div(2))
	for i := range 10 {
		out := filepath.Join(t.TempDir(), fmt.Sprint("typed", i))
		mustDo(t, s,
			Action{Type: ActScreenshot},
			Action{Type: ActClick, X: fp(float64(center.X)), Y: fp(float64(center.Y))},
			Action{Type: ActType, Text: "printf '%s' '" + want.String() + "' > " + out + "\n"},
		)
		var got []byte
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if b, err := os.ReadFile(out); err == nil && len(b) > 0 {
				if got = b; string(got) == want.String() {
					break
				}
			}
		}
		if string(got) != want.String() {
			t.Errorf("round %d: typed %q into the xterm; the file holds %q", i, want.String(), got)
		}
	}
}

// findClient returns the screen rectangle of the first managed window
// whose WM_CLASS instance is class, waiting for it to appear.
func findClient(t *testing.T, s *Session, class string) image.Rectangle {
	t.Helper()
	c, err := xgb.NewConnDisplay(s.Display())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	root := xproto.Setup(c).DefaultScreen(c).Root
	atom, err := xproto.InternAtom(c, false, uint16(len("_NET_CLIENT_LIST")), "_NET_CLIENT_LIST").Reply()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		list, err := xproto.GetProperty(c, false, root, atom.Atom, xproto.AtomWindow, 0, 1024).Reply()
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+4 <= len(list.Value); i += 4 {
			w := xproto.Window(xgb.Get32(list.Value[i:]))
			cls, err := xproto.GetProperty(c, false, w, xproto.AtomWmClass, xproto.AtomString, 0, 64).Reply()
			if err != nil || !strings.HasPrefix(string(cls.Value), class+"\x00") {
				continue
			}
			g, err := xproto.GetGeometry(c, xproto.Drawable(w)).Reply()
			if err != nil {
				continue
			}
			tr, err := xproto.TranslateCoordinates(c, w, root, 0, 0).Reply()
			if err != nil {
				continue
			}
			a, err := xproto.GetWindowAttributes(c, w).Reply()
			if err != nil || a.MapState != xproto.MapStateViewable {
				continue
			}
			return image.Rect(int(tr.DstX), int(tr.DstY), int(tr.DstX)+int(g.Width), int(tr.DstY)+int(g.Height))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no %s window appeared", class)
	return image.Rectangle{}
}

// A key held by an action whose context ends is not left down: the next
// operation releases it.
func TestCanceledHoldReleasesKeys(t *testing.T) {
	s := sharedSession(t)
	ctx, cancel := context.WithTimeout(ctxT(t), 150*time.Millisecond)
	defer cancel()
	res, _ := s.Do(ctx, []Action{{Type: ActKey, Keys: "shift", HoldMS: 5000}})
	if len(res) != 1 || res[0].OK {
		t.Fatalf("a 5 s hold under a 150 ms deadline = %+v, want a failure", res)
	}
	if res[0].DurationMS > 2000 {
		t.Errorf("the canceled hold took %v ms", res[0].DurationMS)
	}
	mustDo(t, s, Action{Type: ActMouseMove, X: fp(5), Y: fp(5)})
	c, err := xgb.NewConnDisplay(s.Display())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	km, err := xproto.QueryKeymap(c).Reply()
	if err != nil {
		t.Fatal(err)
	}
	for i, bits := range km.Keys {
		if bits != 0 {
			t.Errorf("keys still down after the next action: byte %d = %08b", i, bits)
		}
	}
}

// Typing a long text, all of it characters the keyboard map
// lacks, borrows and restores spare keycodes hundreds of times; those
// waits are the action's own and must not run it into the X timeout.
func TestTypeLongUnmappedText(t *testing.T) {
	// The timeout of one X operation, cut to a second here, counts none
	// of the waits of a text that borrows and restores keycodes hundreds
	// of times (10,000 CJK characters take some 80 s of them).
	defer func(d time.Duration) { xOpTimeout = d }(xOpTimeout)
	xOpTimeout = time.Second
	s := startSession(t, Options{Width: 640, Height: 480, WindowManager: "none"})
	var b strings.Builder
	for i := range 300 {
		b.WriteRune(rune(0x4e00 + i)) // CJK ideographs, none in the map
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	res, err := s.Do(ctx, []Action{{Type: ActType, Text: b.String()}})
	if err != nil || len(res) != 1 || !res[0].OK {
		t.Fatalf("typing 300 unmapped characters: %v, %+v", err, res[0].Error)
	}
	if d := time.Since(start); d < 2*xOpTimeout {
		t.Fatalf("typed in %v: too quickly to show that the waits are not counted", d)
	}
}

// A client that reads the keyboard map late — long after the action that
// typed on borrowed keycodes returned, as a client on a loaded machine
// does — still reads every character there: the loans outlive the action.
func TestLateReaderGetsBorrowedKeys(t *testing.T) {
	s := sharedSession(t)
	pr := newProbe(t, s, image.Rect(700, 200, 800, 300), xproto.EventMaskKeyPress)
	pr.focus(t)
	const text = "ΩЖחשׂ"
	pr.drain()
	mustDo(t, s, Action{Type: ActType, Text: text})
	var codes []xproto.Keycode
	for range []rune(text) {
		ev := pr.next(t, "KeyPress", func(ev xgb.Event) bool { _, ok := ev.(xproto.KeyPressEvent); return ok })
		codes = append(codes, ev.(xproto.KeyPressEvent).Detail)
	}
	time.Sleep(2 * remapSettle)
	setup := xproto.Setup(pr.c)
	km, err := xproto.GetKeyboardMapping(pr.c, setup.MinKeycode, byte(setup.MaxKeycode-setup.MinKeycode+1)).Reply()
	if err != nil {
		t.Fatal(err)
	}
	var got []rune
	for _, kc := range codes {
		ks := km.Keysyms[int(kc-setup.MinKeycode)*int(km.KeysymsPerKeycode)]
		got = append(got, rune(ks&^0x01000000))
	}
	if string(got) != text {
		t.Errorf("read the map %v after typing %q: the keys pressed map to %q", 2*remapSettle, text, string(got))
	}
}

// A keycode counts as still lent when the server reports the loan's
// mapping, however its keyboard extension spread it over the levels.
func TestLentAs(t *testing.T) {
	const ks, other xproto.Keysym = 0x10003a9, 0x61
	for _, c := range []struct {
		name string
		syms []xproto.Keysym
		want bool
	}{
		{"as lent", []xproto.Keysym{ks, ks}, true},
		{"padded", []xproto.Keysym{ks, ks, 0, 0, 0, 0, 0}, true},
		{"copied to the second group", []xproto.Keysym{ks, ks, ks, ks, 0, 0, 0}, true},
		{"remapped", []xproto.Keysym{other, other, 0, 0}, false},
		{"another keysym beside it", []xproto.Keysym{ks, other}, false},
		{"emptied", []xproto.Keysym{0, 0, 0}, false},
		{"no levels", nil, false},
	} {
		if got := lentAs(c.syms, ks); got != c.want {
			t.Errorf("%s: lentAs(%v) = %v, want %v", c.name, c.syms, got, c.want)
		}
	}
}
