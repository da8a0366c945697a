package desktop

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// The display is usable by other X clients through Display().
func TestDisplayForClients(t *testing.T) {
	s := sharedSession(t)
	d := s.Display()
	if !strings.HasPrefix(d, ":") {
		t.Fatalf("Display() = %q", d)
	}
	_, err := exec.LookPath("xdpyinfo")
	testenv.Require(t, "xvfb", err == nil, "xdpyinfo not installed (apt-get install x11-utils)")
	out, err := exec.Command("xdpyinfo", "-display", d).CombinedOutput()
	if err != nil {
		t.Fatalf("xdpyinfo -display %s: %v\n%s", d, err, out)
	}
	for _, want := range []string{"dimensions:    1024x768 pixels", "MIT-SHM", "XTEST"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("xdpyinfo does not report %q", want)
		}
	}
	if s.Err() != nil {
		t.Errorf("Err() = %v on a healthy session", s.Err())
	}
	if _, ok := s.LastFault(); ok {
		t.Error("LastFault() reports a fault on a healthy session")
	}
}

func TestStartOptions(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{
		{Width: 10, Height: 10},
		{Depth: 16},
		{Apps: []string{"emacs"}},
	} {
		_, err := Start(context.Background(), o)
		if fe := faults.Of(err); err == nil || fe.Category != faults.InvalidRequest {
			t.Errorf("Start(%+v) = %v, want invalid_request", o, err)
		}
	}
	_, err := Start(context.Background(), Options{XvfbPath: "/nonexistent/Xvfb"})
	if fe := faults.Of(err); err == nil || fe.Source != faults.Desktop {
		t.Errorf("Start with a missing Xvfb = %v, want a desktop fault", err)
	}
}

// A window manager that is not installed is a warning, not an error.
func TestMissingWindowManager(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	s := startSession(t, Options{Width: 320, Height: 240, WindowManager: "no-such-window-manager",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if _, err := s.Screenshot(ctxT(t), ShotOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "window manager not found") {
		t.Errorf("no warning about the missing window manager; log:\n%s", logs.String())
	}
}

// When the X server dies, the session records desktop.x_server_died,
// restarts it on the same display with its window manager, and the next
// screenshot works on a new connection.
func TestXServerRestart(t *testing.T) {
	t.Parallel()
	requireX(t, "openbox")
	s := startSession(t, Options{Width: 640, Height: 480})
	if _, err := s.Screenshot(ctxT(t), ShotOptions{}); err != nil {
		t.Fatal(err)
	}
	display := s.Display()
	s.mu.Lock()
	x, gen := s.xproc, s.xgen
	s.mu.Unlock()
	if err := syscall.Kill(x.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-x.exited

	// An action right after the death either waits for the restart and
	// works, or fails with the death's class; never anything else.
	if _, err := s.Screenshot(ctxT(t), ShotOptions{}); err != nil && !faults.Is(err, faults.CodeDesktopXDied) {
		t.Errorf("screenshot right after the X server died: %v, want success or %s", err, faults.CodeDesktopXDied)
	}

	f, ok := s.LastFault()
	if !ok || f.Err.Code != faults.CodeDesktopXDied || f.Err.Source != faults.Desktop || !f.Err.Retryable {
		t.Fatalf("LastFault() = %+v, %v; want a retryable %s from source desktop", f, ok, faults.CodeDesktopXDied)
	}
	deadline := time.Now().Add(15 * time.Second)
	for s.Err() != nil && time.Now().Before(deadline) {
		if !faults.Is(s.Err(), faults.CodeDesktopXDied) {
			t.Fatalf("Err() during the restart = %v", s.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("X server not back after 15 s: %v", err)
	}
	shot, err := s.Screenshot(ctxT(t), ShotOptions{Format: FormatJPEG})
	if err != nil {
		t.Fatalf("screenshot after the restart: %v", err)
	}
	if shot.Width != 640 || shot.Height != 480 {
		t.Errorf("screenshot after the restart is %dx%d", shot.Width, shot.Height)
	}
	if err := s.MouseMove(ctxT(t), image.Pt(33, 44)); err != nil {
		t.Fatalf("move after the restart: %v", err)
	}
	if p, err := s.Cursor(ctxT(t)); err != nil || p != image.Pt(33, 44) {
		t.Errorf("cursor after the restart: %v, %v", p, err)
	}
	s.mu.Lock()
	newX, newGen, wm := s.xproc, s.xgen, s.wm
	s.mu.Unlock()
	s.xsem <- struct{}{}
	conn := s.conn
	<-s.xsem
	if s.Display() != display || newX.pid == x.pid || newGen == gen || conn.gen != newGen {
		t.Errorf("after the restart: display %s (was %s), pid %d (was %d), gen %d (was %d), connection gen %d",
			s.Display(), display, newX.pid, x.pid, newGen, gen, conn.gen)
	}
	if wm == nil || wm.done() {
		t.Error("the window manager was not restarted with the X server")
	}
}

// A window manager that dies on its own is started again, owning the
// screen, and its death is a desktop.wm_died fault: in LastFault, in the
// next actions response, but never in Err, and no action fails for it.
func TestWindowManagerRestart(t *testing.T) {
	t.Parallel()
	requireX(t, "openbox")
	s := startSession(t, Options{Width: 320, Height: 240})
	if st := s.WindowManager(); st != WMRunning {
		t.Fatalf("WindowManager() = %q at the start", st)
	}
	c := xClient(t, s)
	wm := killWM(t, s)
	again := waitNewWM(t, s, c, wm)
	if !wmOwnsScreen(t, c) {
		t.Error("the restarted window manager does not own the screen (WM_S0)")
	}
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", again.pid)); strings.TrimSpace(string(comm)) != "openbox" {
		t.Errorf("the restarted window manager's process is %q", comm)
	}

	f, ok := s.LastFault()
	if !ok || f.Err.Code != faults.CodeDesktopWMDied || f.Err.Category != faults.Unavailable ||
		f.Err.Source != faults.Desktop || !f.Err.Retryable {
		t.Fatalf("LastFault() = %+v, %v; want a retryable unavailable %s from source desktop", f, ok, faults.CodeDesktopWMDied)
	}
	if f.Restarts != 1 || f.At.Before(wm.started) || time.Since(f.At) > 10*time.Second {
		t.Errorf("LastFault() restarts %d at %v; want 1, after %v", f.Restarts, f.At, wm.started)
	}
	if err := s.Err(); err != nil {
		t.Errorf("Err() = %v after a window manager restart", err)
	}
	if st := s.WindowManager(); st != WMRunning {
		t.Errorf("WindowManager() = %q after the restart", st)
	}

	// The next actions succeed and carry the fault, once.
	res, err := s.Run(ctxT(t), Request{Actions: []Action{{Type: ActMouseMove, X: fp(10), Y: fp(20)}, {Type: ActCursorPosition}}})
	if err != nil || !res.OK {
		t.Fatalf("actions after the window manager restart: %+v, %v", res, err)
	}
	if len(res.Faults) != 1 || res.Faults[0].Code != faults.CodeDesktopWMDied || res.Faults[0].Restarts != 1 {
		t.Errorf("response faults = %+v, want the one %s", res.Faults, faults.CodeDesktopWMDied)
	}
	if res, _ := s.Run(ctxT(t), Request{Actions: []Action{{Type: ActCursorPosition}}}); len(res.Faults) != 0 {
		t.Errorf("a second response carries the fault again: %+v", res.Faults)
	}
}

// A window manager that keeps dying soon after each start is given up
// on after wmRestartLimit restarts: the fault says it is down for good
// and is not retryable, and the session goes on without one.
func TestWindowManagerDownForGood(t *testing.T) {
	t.Parallel()
	requireX(t, "openbox")
	s := startSession(t, Options{Width: 320, Height: 240})
	c := xClient(t, s)
	wm := killWM(t, s)
	for i := 1; i <= wmRestartLimit; i++ {
		wm = waitNewWM(t, s, c, wm)
		if f, _ := s.LastFault(); f.Restarts != i || !f.Err.Retryable {
			t.Fatalf("restart %d: LastFault() restarts %d, retryable %v", i, f.Restarts, f.Err.Retryable)
		}
		killWM(t, s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.WindowManager() != WMDown && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := s.WindowManager(); st != WMDown {
		t.Fatalf("WindowManager() = %q after %d deaths in a row", st, wmRestartLimit+1)
	}
	f, ok := s.LastFault()
	if !ok || f.Err.Code != faults.CodeDesktopWMDied || f.Err.Source != faults.Desktop || f.Err.Retryable ||
		f.Restarts != wmRestartLimit || !strings.Contains(f.Err.Message, "down for good") ||
		!strings.Contains(f.Err.Message, "without one") {
		t.Fatalf("LastFault() = %+v (%v), %v; want a final %s", f, f.Err, ok, faults.CodeDesktopWMDied)
	}
	// Nothing restarts it any more, and the desktop still works.
	time.Sleep(backoff(wmRestartLimit) + exitNoticeWait)
	s.mu.Lock()
	left := s.wm
	s.mu.Unlock()
	if left != nil {
		t.Errorf("a window manager (pid %d) was started after the session gave up", left.pid)
	}
	if err := s.Err(); err != nil {
		t.Errorf("Err() = %v without a window manager", err)
	}
	res, err := s.Run(ctxT(t), Request{Actions: []Action{{Type: ActMouseMove, X: fp(30), Y: fp(40)}, {Type: ActScreenshot}}})
	if err != nil || !res.OK {
		t.Fatalf("actions without a window manager: %+v, %v", res, err)
	}
	if n := len(res.Faults); n != wmRestartLimit+1 || res.Faults[n-1].Retryable {
		t.Errorf("response faults = %+v; want %d, the last final", res.Faults, wmRestartLimit+1)
	}
}

// killWM SIGKILLs the session's window manager and waits for it to exit.
func killWM(t *testing.T, s *Session) *proc {
	t.Helper()
	s.mu.Lock()
	wm := s.wm
	s.mu.Unlock()
	if wm == nil {
		t.Fatal("no window manager")
	}
	if err := syscall.Kill(wm.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-wm.exited
	return wm
}

// waitNewWM waits until a window manager other than old runs and owns
// the screen, as seen by the X client c, and returns it.
func waitNewWM(t *testing.T, s *Session, c *xgb.Conn, old *proc) *proc {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		wm := s.wm
		s.mu.Unlock()
		if wm != nil && wm != old && !wm.done() && wmOwnsScreen(t, c) {
			return wm
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the window manager was not restarted within 15 s")
	return nil
}

// xClient is a connection of the test's own to the session's display,
// closed when the test ends.
func xClient(t *testing.T, s *Session) *xgb.Conn {
	t.Helper()
	c, err := xgb.NewConnDisplay(s.Display())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// wmOwnsScreen reports whether a window manager holds the WM_S0
// selection, which the X server clears when its owner's connection goes.
func wmOwnsScreen(t *testing.T, c *xgb.Conn) bool {
	t.Helper()
	a, err := xproto.InternAtom(c, false, uint16(len("WM_S0")), "WM_S0").Reply()
	if err != nil {
		t.Fatalf("intern WM_S0: %v", err)
	}
	o, err := xproto.GetSelectionOwner(c, a.Atom).Reply()
	if err != nil {
		t.Fatalf("WM_S0 owner: %v", err)
	}
	return o.Owner != xproto.WindowNone
}

// Close kills every process of the session and their descendants, reaps
// them, and leaves the display's files behind for no one.
func TestCloseLeavesNoProcesses(t *testing.T) {
	t.Parallel()
	requireX(t, "openbox", "xterm")
	becomeSubreaper(t)
	// Xvfb, openbox, xterm and its shell; chromium adds itself and at
	// least two helpers (zygotes, GPU and network processes).
	apps, want := []string{AppXterm}, 4
	if _, ok := testenv.HeadedChromiumPath(); ok {
		apps, want = append(apps, AppChromium), want+3
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{Width: 800, Height: 600, Apps: apps, Env: testShell})
	if err != nil {
		t.Fatal(err)
	}
	// Let the apps spawn their children. A count alone can be reached by
	// passing processes (chromium's launcher is a shell script that runs
	// subshells before it execs the browser), so the programs themselves
	// are waited for, and the list checked is the one that had them.
	started := func(pids []int) bool {
		// By the program each runs: a script's process is named after
		// the script, not its interpreter.
		progs, xterm, shell := map[string]int{}, 0, false
		for _, pid := range pids {
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
			progs[filepath.Base(exe)]++
			if filepath.Base(exe) == "xterm" {
				xterm = pid
			}
		}
		for _, pid := range pids {
			if st, ok := readStat(pid); ok && xterm != 0 && st.ppid == xterm {
				shell = true
			}
		}
		browser := len(apps) == 1 || progs["chromium"] >= 1
		return len(pids) >= want && progs["Xvfb"] == 1 && progs["openbox"] == 1 && shell && browser
	}
	deadline := time.Now().Add(10 * time.Second)
	before := sessionProcs(s.id)
	for !started(before) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		before = sessionProcs(s.id)
	}
	if !started(before) {
		t.Errorf("the session's programs did not all start (%d processes) before Close: %v", len(before), describe(before))
	}
	display, dir := s.Display(), s.dir
	s.Close()
	if left := sessionProcs(s.id); len(left) > 0 {
		t.Errorf("processes left after Close: %v", describe(left))
	}
	for _, pid := range before {
		if st, ok := readStat(pid); ok && st.ppid == os.Getpid() {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			t.Errorf("process %d is still our child (state %s) after Close: %s", pid, st.state, b)
		}
	}
	if _, err := os.Stat("/tmp/.X" + strings.TrimPrefix(display, ":") + "-lock"); err == nil {
		t.Errorf("the lock file of display %s is left", display)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("the session directory %s is left", dir)
	}
	if err := s.Err(); !faults.Is(err, faults.CodeShuttingDown) {
		t.Errorf("Err() after Close = %v", err)
	}
	res, err := s.Do(ctxT(t), []Action{{Type: ActMouseMove, X: fp(1), Y: fp(1)}})
	if err == nil || len(res) != 1 || res[0].OK {
		t.Errorf("Do after Close = %+v, %v; want a failure", res, err)
	}
	s.Close() // a second Close is harmless
}

// becomeSubreaper makes the test process adopt orphaned descendants, as
// an agent running as PID 1 does, so Close's reaping shows.
func becomeSubreaper(t *testing.T) {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		t.Logf("prctl(PR_SET_CHILD_SUBREAPER): %v", errno)
	}
}

func describe(pids []int) []string {
	var out []string
	for _, pid := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// An app that exits on its own is relaunched; one the session replaced
// is not relaunched twice.
func TestAppRelaunched(t *testing.T) {
	s := startSession(t, Options{Width: 640, Height: 480, Apps: []string{AppXterm}, WindowManager: "none"})
	app := func() *proc {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.apps) != 1 {
			t.Fatalf("%d apps", len(s.apps))
		}
		return s.apps[0]
	}
	first := app()
	if err := syscall.Kill(first.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if p := app(); p != first && p.pid != first.pid {
			select {
			case <-p.exited:
				t.Fatalf("relaunched xterm exited: %v", p.err)
			default:
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("xterm was not relaunched")
}

// A malformed observation refuses the whole request before any action
// runs: the caller gets action.invalid and nothing happened.
func TestObserveRefusedBeforeActions(t *testing.T) {
	s := sharedSession(t)
	mustDo(t, s, Action{Type: ActScreenshot})
	// cursorReaches reports whether the pointer is at p within d: a
	// window manager's grab can hold pointer events back for a while.
	cursorReaches := func(p image.Point, d time.Duration) bool {
		for deadline := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
			if c, err := s.Cursor(ctxT(t)); err == nil && c == p {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
		}
	}
	for _, o := range []Observe{{Screenshot: "webp"}, {Screenshot: "jpeg", Quality: 101}, {Screenshot: "png", Width: -1}} {
		mustDo(t, s, Action{Type: ActMouseMove, X: fp(5), Y: fp(5)})
		if !cursorReaches(image.Pt(5, 5), 5*time.Second) {
			t.Fatal("the pointer never reached (5, 5)")
		}
		_, err := s.Run(ctxT(t), Request{Actions: []Action{{Type: ActMouseMove, X: fp(321), Y: fp(123)}}, Observe: &o})
		if fe := faults.Of(err); err == nil || fe.Code != faults.CodeActionInvalid {
			t.Errorf("observe %+v: %v, want action.invalid", o, err)
		}
		if cursorReaches(image.Pt(321, 123), 300*time.Millisecond) {
			t.Errorf("observe %+v was refused, yet its request's mouse_move ran: the pointer moved to (321, 123)", o)
		}
	}
	if _, err := ParseRequest([]byte(`{"actions":[{"type":"wait","ms":0}],"observe":{"screenshot":"webp"}}`)); err == nil || faults.Of(err).Code != faults.CodeActionInvalid {
		t.Errorf("ParseRequest with a bad observe: %v, want action.invalid", err)
	}
}

// backoff is the longest wait before restarting a process after n young
// deaths in a row.
func backoff(n int) time.Duration { return restartPolicy.Cap(n) }
