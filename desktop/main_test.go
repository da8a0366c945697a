package desktop

import (
	"context"
	"fmt"
	"image"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
	"go.uber.org/goleak"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// One desktop (1024x768, openbox, an xterm) for the tests that only use
// it; tests that kill or close it start their own.
var shared struct {
	once sync.Once
	s    *Session
	err  error
}

// testShell makes terminals run sh: the tests type into a shell, and a
// user's interactive bash may spend seconds in its rc files (and leave
// their locks behind when the test kills it).
var testShell = []string{"SHELL=/bin/sh"}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.s != nil {
		shared.s.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// requireX skips the test (or fails it under ORCHARD_TEST_REQUIRE) when
// Xvfb, or any of the other named commands, is not installed.
func requireX(t testing.TB, also ...string) {
	t.Helper()
	for _, name := range append([]string{"Xvfb"}, also...) {
		_, err := exec.LookPath(name)
		testenv.Require(t, "xvfb", err == nil, name+" not in PATH (apt-get install xvfb openbox xterm x11-utils)")
	}
}

// sharedSession returns the shared desktop, started on first use.
func sharedSession(t testing.TB) *Session {
	t.Helper()
	requireX(t, "openbox", "xterm")
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shared.s, shared.err = Start(ctx, Options{Width: 1024, Height: 768, Apps: []string{AppXterm}, Env: testShell})
	})
	if shared.err != nil {
		t.Fatalf("start desktop: %v", shared.err)
	}
	return shared.s
}

// startSession starts a desktop of the test's own, closed when it ends.
func startSession(t testing.TB, o Options) *Session {
	t.Helper()
	requireX(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("start desktop: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mustDo runs actions and fails the test on any failure.
func mustDo(t testing.TB, s *Session, actions ...Action) []Result {
	t.Helper()
	res, err := s.Do(ctxT(t), actions)
	if err != nil {
		t.Fatalf("do: %v", err)
	}
	for i, r := range res {
		if !r.OK {
			t.Fatalf("action %d (%s) failed: %+v", i, r.Type, *r.Error)
		}
	}
	if len(res) != len(actions) {
		t.Fatalf("got %d results for %d actions", len(res), len(actions))
	}
	return res
}

func fp(v float64) *float64 { return &v }
func ip(v int) *int         { return &v }

// probe is a plain X window of the test's own, on top of everything
// (override-redirect, so the window manager leaves it alone), that
// records the input events it receives.
type probe struct {
	c      *xgb.Conn
	win    xproto.Window
	rect   image.Rectangle
	events chan xgb.Event
	done   chan struct{}
}

func newProbe(t testing.TB, s *Session, r image.Rectangle, mask uint32) *probe {
	t.Helper()
	c, err := xgb.NewConnDisplay(s.Display())
	if err != nil {
		t.Fatalf("probe: connect: %v", err)
	}
	scr := xproto.Setup(c).DefaultScreen(c)
	wid, err := xproto.NewWindowId(c)
	if err != nil {
		t.Fatal(err)
	}
	err = xproto.CreateWindowChecked(c, 0, wid, scr.Root, int16(r.Min.X), int16(r.Min.Y),
		uint16(r.Dx()), uint16(r.Dy()), 0, xproto.WindowClassInputOutput, scr.RootVisual,
		xproto.CwBackPixel|xproto.CwOverrideRedirect|xproto.CwEventMask,
		[]uint32{scr.WhitePixel, 1, mask}).Check()
	if err != nil {
		t.Fatalf("probe: create window: %v", err)
	}
	if err := xproto.MapWindowChecked(c, wid).Check(); err != nil {
		t.Fatalf("probe: map: %v", err)
	}
	p := &probe{c: c, win: wid, rect: r, events: make(chan xgb.Event, 1024), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			ev, err := c.WaitForEvent()
			if ev == nil && err == nil {
				return
			}
			if ev != nil {
				select {
				case p.events <- ev:
				default:
				}
			}
		}
	}()
	// Wait until the window is viewable, so input reaches it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		a, err := xproto.GetWindowAttributes(c, wid).Reply()
		if err == nil && a.MapState == xproto.MapStateViewable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("probe window never became viewable")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Cleanup(func() {
		xproto.DestroyWindow(c, wid)
		c.Sync()
		c.Close()
		<-p.done
	})
	return p
}

// focus gives the probe the keyboard focus.
func (p *probe) focus(t testing.TB) {
	t.Helper()
	if err := xproto.SetInputFocusChecked(p.c, xproto.InputFocusParent, p.win, xproto.TimeCurrentTime).Check(); err != nil {
		t.Fatalf("focus probe: %v", err)
	}
}

// next returns the next event that match accepts, or fails after 5 s.
func (p *probe) next(t testing.TB, what string, match func(xgb.Event) bool) xgb.Event {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev := <-p.events:
			if match(ev) {
				return ev
			}
		case <-timeout:
			t.Fatalf("probe: no %s event within 5 s", what)
			return nil
		}
	}
}

// drain discards the events received so far.
func (p *probe) drain() {
	for {
		select {
		case <-p.events:
		default:
			return
		}
	}
}
