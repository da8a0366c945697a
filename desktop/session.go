package desktop

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/jpegenc"
	"github.com/orchard/orchard/retry"
)

const (
	// xStartTimeout bounds how long Xvfb may take to report its display:
	// it is ready in about 100 ms, so this only absorbs a loaded machine.
	xStartTimeout = 15 * time.Second
	// wmReadyTimeout bounds the wait for the window manager to claim the
	// screen before apps are started; a WM that never announces itself
	// (no EWMH) only costs this once.
	wmReadyTimeout = 5 * time.Second
	// restartWait is how long an operation waits for an X server that is
	// being restarted before it fails with desktop.x_server_died; a
	// restart takes well under a second.
	restartWait = 10 * time.Second
	// stableAfter is how long a restarted process must live for its
	// next death to count as a new incident rather than a crash loop,
	// which restarts are spaced out for.
	stableAfter = 10 * time.Second
	// xRestartAttempts bounds the attempts to bring back a dead X
	// server, and its young deaths in a row, before the session gives up;
	// with the backoff this spans about half a minute.
	xRestartAttempts = 8
	// restartBackoff caps the first wait before restarting a process that
	// died young; the cap doubles with each further young death, up to
	// maxRestartBackoff (restartPolicy).
	restartBackoff    = 200 * time.Millisecond
	maxRestartBackoff = 5 * time.Second
	// wmRestartLimit bounds the window manager's restarts in a crash
	// loop; the desktop works without one.
	wmRestartLimit = 5
	// wmPollInterval spaces the checks for a window manager that is
	// starting; openbox is up in about 100 ms.
	wmPollInterval = 20 * time.Millisecond
	// exitNoticeWait is how long a broken X connection waits to learn
	// whether the server died: the socket closes a moment before the
	// process is reaped, and a client of the server (the WM) can see it
	// go before we do.
	exitNoticeWait = 500 * time.Millisecond
)

// xOpTimeout bounds one X operation (a capture, a click, a typed text)
// beyond its own waits: the local server answers in milliseconds, so a
// longer silence means it hangs, and the connection is dropped and remade
// by the next operation. A variable for tests.
var xOpTimeout = 20 * time.Second

// Options configures a desktop session. The zero value is a 1280x800
// screen with the default window manager and no apps.
type Options struct {
	// Width, Height and Depth are the screen's; defaults 1280, 800, 24.
	// Depth 24 is the only one supported.
	Width, Height, Depth int
	// Apps are started once the window manager is up, with DISPLAY set:
	// "xterm", or "chromium" (headed, --no-sandbox, a profile in the
	// session's temporary directory, its window the size of the screen).
	Apps []string
	// WindowManager is the command of the window manager: "" starts
	// openbox when it is installed (and only warns when it is not),
	// "none" starts none.
	WindowManager string
	// XvfbPath and ChromiumPath override the binaries found in PATH.
	XvfbPath, ChromiumPath string
	// ChromiumArgs are appended to chromium's command line (a start URL,
	// say).
	ChromiumArgs []string
	// Env is added to the environment of the window manager and apps.
	// Without a locale setting in it or in ours, LANG=C.UTF-8 is added,
	// so that terminals pass typed Unicode through.
	Env []string
	// NoSHM captures with plain GetImage even when MIT-SHM works.
	NoSHM bool
	// StdJPEG encodes JPEG screenshots with image/jpeg, as before the
	// striped encoder (internal/jpegenc), which is about 3x faster on two
	// cores and re-encodes only the stripes that changed.
	StdJPEG bool
	// Logger receives warnings (a missing window manager, restarts);
	// nil discards them.
	Logger *slog.Logger
}

// OptionsOf returns the session options a create request's `desktop`
// settings ask for; the caller adds a logger.
func OptionsOf(o api.DesktopOptions) Options {
	so := Options{Width: o.Width, Height: o.Height, Depth: o.Depth, Apps: o.Apps, WindowManager: o.WindowManager}
	if o.URL != "" {
		// An app window (no tabs or address bar) filling the screen.
		so.ChromiumArgs = []string{"--app=" + o.URL}
	}
	return so
}

func (o Options) withDefaults() (Options, error) {
	if o.Width == 0 {
		o.Width = 1280
	}
	if o.Height == 0 {
		o.Height = 800
	}
	if o.Depth == 0 {
		o.Depth = 24
	}
	// The bounds are the create request's, which the server checks first.
	if errs := (&api.DesktopOptions{Width: o.Width, Height: o.Height, Depth: o.Depth, Apps: o.Apps}).Validate(); len(errs) > 0 {
		e := errs[0]
		return o, fmt.Errorf("%v %v: %s", e.Loc, e.Input, e.Msg)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Apps a session can start.
const (
	AppXterm    = api.AppXterm
	AppChromium = api.AppChromium
)

// Fault is a classified failure the session recovered from or ended on
// (the X server or the window manager died), and when it happened.
type Fault struct {
	Err *faults.Error
	At  time.Time
	// Restarts counts the session's restarts of the dead process in a
	// run of deaths that each came soon after its start (stableAfter),
	// the one this death brings included: 1 for a one-off death. When the
	// session gave up (Err says so), it is the restarts made.
	Restarts int
}

// FaultInfo is the wire form of a Fault: its class and message (no
// internal cause), when it happened and the restart count.
type FaultInfo = api.SessionFault

// Info returns f's wire form.
func (f Fault) Info() FaultInfo {
	i := f.Err.Info()
	return FaultInfo{FaultInfo: api.FaultInfo{Category: string(i.Category), Source: string(i.Source), Code: i.Code,
		Message: i.Message, Retryable: i.Retryable}, At: f.At, Restarts: f.Restarts}
}

// maxUnreported bounds the faults kept for the next actions response; a
// crash loop is reported by its latest deaths.
const maxUnreported = 8

// Session is an X display (Xvfb) with a window manager and apps, and a
// connection to it for input and capture. Its methods are safe for
// concurrent use; X operations run one at a time.
type Session struct {
	opts    Options
	log     *slog.Logger
	id      string // the marker value prefix of its processes
	dir     string // logs and the chromium profile
	width   int
	height  int
	xvfb    string
	wmPath  string
	appPath map[string]string

	ctx    context.Context // ends with Close; restarts run under it
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup // the supervisor

	mu       sync.Mutex // guards the fields below
	display  int
	xproc    *proc
	xStarted time.Time
	xDeaths  int // the X server's deaths in a row, each young
	wm       *proc
	wmDeaths int  // the window manager's deaths in a row, each young
	wmGone   bool // restarts of the window manager gave up
	apps     []*proc
	ended    []*proc // processes that died, swept again by Close
	seq      int     // numbers processes, for logs and markers
	xgen     uint64  // counts X server starts
	up       chan struct{}
	down     *faults.Error // why X is unusable now; nil while it runs
	failed   bool          // restarts gave up: down is final
	closed   bool
	last     *Fault
	unseen   []Fault // faults no actions response has carried yet
	frames   []Frame
	frameSeq int64

	xsem chan struct{} // the X lock: one X operation at a time; guards conn and loans
	conn *xconn
	// loans are the keycodes lent to characters the keyboard map lacks on
	// the X server of generation loansGen; every connection to it shares
	// them, so one that breaks loses none.
	loans    map[xproto.Keycode]*loan
	loansGen uint64

	framePool sync.Pool // screen-sized *image.RGBA
	pngPool   pngBuffers
	jpeg      jpegenc.Encoder // keeps the last JPEG screenshot's stripes
	lastSize  atomic.Int64    // bytes of the last encoded screenshot
	closeOnce sync.Once
}

// errClosed is the error of every call after Close.
var errClosed = faults.New(faults.CodeShuttingDown, faults.Unavailable, faults.Desktop,
	"the desktop session is closed").WithRetryable(false)

// Start launches Xvfb on a free display, then the window manager, then
// opts.Apps, and connects to the display. ctx bounds the start only; the
// session lives until Close.
func Start(ctx context.Context, opts Options) (*Session, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, err.Error())
	}
	s := &Session{opts: o, log: o.Logger, width: o.Width, height: o.Height,
		appPath: map[string]string{}, up: make(chan struct{}), xsem: make(chan struct{}, 1)}
	if err := s.findBinaries(); err != nil {
		return nil, err
	}
	var idb [6]byte
	_, _ = rand.Read(idb[:])
	s.id = hex.EncodeToString(idb[:])
	if s.dir, err = os.MkdirTemp("", "orchard-desktop-"); err != nil {
		return nil, faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Desktop, "create the session directory")
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	if err := s.startX(ctx, -1); err != nil {
		return nil, err
	}
	// Connecting now checks the screen format before anything else runs.
	if err := s.withX(ctx, "connect", 0, func(context.Context, *xconn) error { return nil }); err != nil {
		return nil, err
	}
	_ = s.startWM(ctx) // logged; the desktop works without one
	if err := s.startApps(); err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go s.supervise()
	ok = true
	return s, nil
}

func (s *Session) findBinaries() error {
	missing := func(what, pkg string, err error) error {
		return faults.Wrap(err, faults.CodeMisconfigured, faults.Internal, faults.Desktop,
			fmt.Sprintf("%s is not installed (apt-get install %s)", what, pkg))
	}
	s.xvfb = s.opts.XvfbPath
	if s.xvfb == "" {
		p, err := exec.LookPath("Xvfb")
		if err != nil {
			return missing("Xvfb", "xvfb", err)
		}
		s.xvfb = p
	}
	switch wm := s.opts.WindowManager; wm {
	case "none":
	case "":
		if p, err := exec.LookPath("openbox"); err == nil {
			s.wmPath = p
		} else {
			s.log.Warn("no window manager: openbox is not installed; windows will have no decorations or focus handling")
		}
	default:
		p, err := exec.LookPath(wm)
		if err != nil {
			s.log.Warn("window manager not found; starting none", "window_manager", wm, "error", err)
		}
		s.wmPath = p
	}
	for _, a := range s.opts.Apps {
		var names []string
		switch a {
		case AppXterm:
			names = []string{"xterm"}
		case AppChromium:
			if s.opts.ChromiumPath != "" {
				names = []string{s.opts.ChromiumPath}
			} else {
				names = []string{"chromium", "chromium-browser", "google-chrome"}
			}
		}
		var err error
		for _, n := range names {
			var p string
			if p, err = exec.LookPath(n); err == nil {
				s.appPath[a] = p
				break
			}
		}
		if s.appPath[a] == "" {
			return missing(a, a, err)
		}
	}
	return nil
}

// Display is the X display of the session (":N"), for the DISPLAY of
// commands run in it. An X server restart keeps it, unless another server
// took the display while ours was down; ask again for each command.
func (s *Session) Display() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ":" + strconv.Itoa(s.display)
}

// Size is the screen's size in pixels.
func (s *Session) Size() (width, height int) { return s.width, s.height }

// Err reports why the session cannot work right now: a
// desktop.x_server_died fault while the X server is down (being
// restarted, or given up on), the closed error after Close, nil otherwise.
// A dead window manager is no reason: input and capture work without one
// (LastFault reports its death).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errClosed
	case s.down != nil:
		return s.down
	}
	return nil
}

// LastFault returns the latest fault the session recorded (an X server
// or window manager death), also after it recovered from it.
func (s *Session) LastFault() (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return Fault{}, false
	}
	return *s.last, true
}

// record makes f the last fault and queues it for the next actions
// response. The caller holds s.mu.
func (s *Session) record(f Fault) {
	s.last = &f
	if len(s.unseen) == maxUnreported {
		s.unseen = slices.Delete(s.unseen, 0, 1)
	}
	s.unseen = append(s.unseen, f)
}

// takeFaults returns the faults recorded since it was last called, for an
// actions response to report.
func (s *Session) takeFaults() []FaultInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []FaultInfo
	for _, f := range s.unseen {
		out = append(out, f.Info())
	}
	s.unseen = nil
	return out
}

// Window manager states, as WindowManager reports them.
const (
	WMRunning    = "running"
	WMRestarting = "restarting"
	WMDown       = "down"
	WMNone       = "none"
)

// WindowManager reports the window manager's state: WMRunning,
// WMRestarting (it died and is being started again, or the X server is),
// WMDown (its restarts gave up; the session runs without one) or WMNone
// (none was asked for or installed).
func (s *Session) WindowManager() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.wmPath == "":
		return WMNone
	case s.wmGone:
		return WMDown
	case s.wm != nil && !s.wm.done():
		return WMRunning
	}
	return WMRestarting
}

// env is the environment of the session's processes: ours without
// DISPLAY, plus opts.Env.
func (s *Session) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DISPLAY=") && !strings.HasPrefix(kv, markerEnv+"=") {
			env = append(env, kv)
		}
	}
	return append(env, s.opts.Env...)
}

// clientEnv is env with DISPLAY set, and a UTF-8 locale unless one is set.
func (s *Session) clientEnv() []string {
	env := s.env()
	locale := false
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if (k == "LANG" || k == "LC_ALL" || k == "LC_CTYPE") && v != "" {
			locale = true
		}
	}
	if !locale {
		env = append(env, "LANG=C.UTF-8")
	}
	return append(env, "DISPLAY="+s.Display())
}

func (s *Session) spawn(name, path string, args, env []string, extra []*os.File) (*proc, error) {
	s.mu.Lock()
	s.seq++
	seq := s.seq
	s.mu.Unlock()
	return spawn(s.dir, s.id, name, path, args, env, extra, seq)
}

// startX starts Xvfb on display disp, or on the first free display when
// disp is negative, and waits until it accepts connections.
func (s *Session) startX(ctx context.Context, disp int) error {
	r, w, err := os.Pipe()
	if err != nil {
		return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Desktop, "start the X server")
	}
	defer r.Close()
	var args []string
	if disp >= 0 {
		args = append(args, ":"+strconv.Itoa(disp))
	}
	// -displayfd: Xvfb writes its display number to fd 3 once it accepts
	// connections, so no display is guessed and no socket polled.
	// -noreset: the server would otherwise reset when its last client
	// disconnects, dropping the keyboard map and every window.
	args = append(args, "-displayfd", "3", "-screen", "0",
		fmt.Sprintf("%dx%dx%d", s.width, s.height, s.opts.Depth), "-nolisten", "tcp", "-noreset")
	p, err := s.spawn("xvfb", s.xvfb, args, s.env(), []*os.File{w})
	w.Close()
	if err != nil {
		return faults.Wrap(err, faults.CodeDesktopXDied, faults.Unavailable, faults.Desktop, "start the X server")
	}
	n, err := readDisplay(ctx, r)
	if err == nil && disp >= 0 && n != disp {
		err = fmt.Errorf("Xvfb took display :%d, not :%d", n, disp)
	}
	if err != nil {
		p.stop(0, map[int]bool{})
		said := p.logTail()
		if strings.Contains(said, "already active") {
			err = fmt.Errorf("%w: %w", errDisplayTaken, err)
		}
		return faults.Wrap(fmt.Errorf("%w; Xvfb said: %s", err, said),
			faults.CodeDesktopXDied, faults.Unavailable, faults.Desktop, "start the X server")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.display = n
	s.xgen++
	p.gen = s.xgen
	s.xproc, s.xStarted = p, time.Now()
	s.down = nil
	close(s.up)
	return nil
}

// errDisplayTaken is Xvfb refusing a display another server holds.
var errDisplayTaken = errors.New("the display is taken")

// readDisplay reads the display number Xvfb writes to its -displayfd.
func readDisplay(ctx context.Context, r *os.File) (int, error) {
	deadline := time.Now().Add(xStartTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = r.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = r.SetReadDeadline(time.Now()) })
	defer stop()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		if ctx.Err() != nil {
			return 0, context.Cause(ctx)
		}
		return 0, fmt.Errorf("Xvfb did not report its display: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("Xvfb reported display %q", line)
	}
	return n, nil
}

// startWM starts the window manager, if any, and waits until it manages
// the screen. Failures are warnings: the desktop works without one. Its
// error is the spawn's, which leaves the session without one.
func (s *Session) startWM(ctx context.Context) error {
	if s.wmPath == "" {
		return nil
	}
	name := filepath.Base(s.wmPath)
	var args []string
	if name == "openbox" {
		args = []string{"--sm-disable"} // no session manager to register with
	}
	p, err := s.spawn(name, s.wmPath, args, s.clientEnv(), nil)
	if err != nil {
		s.log.Warn("start window manager", "error", err)
		return err
	}
	s.mu.Lock()
	s.wm, s.wmGone = p, false
	s.mu.Unlock()
	if err := s.waitWM(ctx, p); err != nil {
		s.log.Warn("window manager not ready", "window_manager", name, "error", err)
	}
	return nil
}

// waitWM waits until a window manager announces itself on the root window
// (_NET_SUPPORTING_WM_CHECK), so apps started next are managed from their
// first map.
func (s *Session) waitWM(ctx context.Context, p *proc) error {
	ctx, cancel := context.WithTimeout(ctx, wmReadyTimeout)
	defer cancel()
	for {
		ready := false
		err := s.withX(ctx, "wait for the window manager", 0, func(_ context.Context, x *xconn) error {
			a, err := xproto.InternAtom(x.c, true, uint16(len("_NET_SUPPORTING_WM_CHECK")), "_NET_SUPPORTING_WM_CHECK").Reply()
			if err := replyErr(a == nil, err); err != nil || a.Atom == 0 {
				return err
			}
			r, err := xproto.GetProperty(x.c, false, x.root, a.Atom, xproto.AtomWindow, 0, 1).Reply()
			if err := replyErr(r == nil, err); err != nil {
				return err
			}
			ready = r.ValueLen > 0
			return nil
		})
		switch {
		case err != nil:
			return err
		case ready:
			return nil
		case p.done():
			return fmt.Errorf("it exited: %v; %s", p.err, p.logTail())
		}
		if err := sleepCtx(ctx, wmPollInterval); err != nil {
			return err
		}
	}
}

// startApps starts opts.Apps.
func (s *Session) startApps() error {
	for _, a := range s.opts.Apps {
		p, err := s.spawnApp(a)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.apps = append(s.apps, p)
		s.mu.Unlock()
		s.watchApp(a, p, 0)
	}
	return nil
}

func (s *Session) spawnApp(a string) (*proc, error) {
	var args []string
	if a == AppChromium {
		args = s.chromiumArgs()
	}
	p, err := s.spawn(a, s.appPath[a], args, s.clientEnv(), nil)
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeSpawnFailed, faults.ActionFailed, faults.Desktop, "start "+a)
	}
	return p, nil
}

// App restarts: an app that lived youngApp or longer before exiting
// starts a fresh count; maxAppDeaths young deaths in a row end the
// relaunches (an app that cannot start would otherwise loop).
const (
	youngApp     = 10 * time.Second
	maxAppDeaths = 5
)

// watchApp relaunches an app whose process exits on its own: an agent that
// closed its only terminal must not be left with an empty screen. An app
// that died with the X server is restartX's to relaunch.
func (s *Session) watchApp(name string, p *proc, deaths int) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		select {
		case <-s.ctx.Done():
			return
		case <-p.exited:
		}
		if time.Since(p.started) < youngApp {
			deaths++
		} else {
			deaths = 1
		}
		if deaths > maxAppDeaths {
			s.log.Warn("app keeps exiting; not relaunching it", "app", name, "deaths", deaths-1)
			return
		}
		if sleepCtx(s.ctx, restartPolicy.Delay(deaths)) != nil {
			return
		}
		s.mu.Lock()
		gone := !slices.Contains(s.apps, p) || s.closed || s.down != nil
		s.mu.Unlock()
		if gone {
			return // replaced by an X restart, or X is down and restartX will relaunch
		}
		np, err := s.spawnApp(name)
		if err != nil {
			s.log.Warn("relaunch app", "app", name, "error", err)
			return
		}
		s.mu.Lock()
		i := slices.Index(s.apps, p)
		if i >= 0 && !s.closed {
			s.apps[i] = np
			s.ended = append(s.ended, p)
		}
		s.mu.Unlock()
		if i < 0 {
			stopAll([]*proc{np}, map[int]bool{})
			return
		}
		s.log.Warn("app exited; relaunched", "app", name, "error", p.err)
		s.watchApp(name, np, deaths)
	}()
}

func (s *Session) chromiumArgs() []string {
	args := []string{
		"--no-sandbox",
		// --test-type hides the infobar that --no-sandbox brings up,
		// which would take about 60 px off the page.
		"--test-type",
		"--user-data-dir=" + filepath.Join(s.dir, "chromium"),
		"--no-first-run", "--no-default-browser-check",
		"--password-store=basic", "--disable-dev-shm-usage",
		"--disable-background-networking",
		"--window-position=0,0",
		fmt.Sprintf("--window-size=%d,%d", s.width, s.height),
	}
	return append(args, s.opts.ChromiumArgs...)
}

// supervise restarts the X server or the window manager when it dies,
// until Close.
func (s *Session) supervise() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		x, wm, failed := s.xproc, s.wm, s.failed
		s.mu.Unlock()
		if failed {
			return
		}
		var wmExited <-chan struct{}
		if wm != nil {
			wmExited = wm.exited
		}
		select {
		case <-s.ctx.Done():
			return
		case <-x.exited:
			s.restartX(x)
		case <-wmExited:
			died := time.Now()
			// The WM dies with the X server; let the X server's death,
			// if that is what happened, be the one handled.
			select {
			case <-x.exited:
				s.restartX(x)
			case <-time.After(exitNoticeWait):
				s.restartWM(wm, died)
			}
		}
	}
}

// noteXDied records the death of the X server x, once: the supervisor or
// an operation whose connection broke, whichever notices first. From then
// on operations wait for the restart, and LastFault reports the death.
func (s *Session) noteXDied(x *proc) *faults.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.xproc != x || s.down != nil {
		return s.down // already noted, or already replaced
	}
	fe := faults.Wrap(fmt.Errorf("Xvfb exited: %v; %s", x.err, x.logTail()),
		faults.CodeDesktopXDied, faults.Unavailable, faults.Desktop, "the X server died; it is being restarted")
	s.down = fe
	s.up = make(chan struct{})
	if time.Since(s.xStarted) > stableAfter {
		s.xDeaths = 0
	}
	s.xDeaths++
	s.record(Fault{Err: fe, At: time.Now(), Restarts: s.xDeaths})
	return fe
}

// restartX clears away the clients of the dead X server x and starts a
// new server on the same display, then the window manager and the apps
// again.
func (s *Session) restartX(x *proc) {
	fe := s.noteXDied(x)
	s.mu.Lock()
	wm, apps := s.wm, s.apps
	s.wm, s.apps = nil, nil
	s.ended = append(s.ended, x)
	if wm != nil {
		s.ended = append(s.ended, wm)
	}
	s.ended = append(s.ended, apps...)
	disp := s.display
	deaths := s.xDeaths // counted by noteXDied
	s.mu.Unlock()
	s.log.Warn("X server died; restarting it", "display", disp, "code", faults.CodeDesktopXDied, "error", fe)

	// Its clients lost their connection and are exiting; make sure.
	killed := map[int]bool{}
	wm.stop(0, killed)
	for _, a := range apps {
		a.stop(0, killed)
	}
	reap(killed)

	fail := func(restarts int, err error) {
		gave := faults.Wrap(err, faults.CodeDesktopXDied, faults.Unavailable, faults.Desktop,
			"the X server died and could not be restarted").WithRetryable(false)
		s.mu.Lock()
		s.failed, s.down = true, gave
		s.record(Fault{Err: gave, At: time.Now(), Restarts: restarts})
		s.mu.Unlock()
		s.log.Error("X server restart failed; the desktop is unusable", "display", disp, "error", err)
	}
	if deaths > xRestartAttempts {
		fail(deaths-1, fmt.Errorf("the X server died %d times in a row within %v of its start", deaths, stableAfter))
		return
	}
	// The first restart is immediate, to take the display back before
	// another server claims it; a crash loop is spaced out.
	if deaths > 1 && sleepCtx(s.ctx, restartPolicy.Delay(deaths-1)) != nil {
		return
	}
	policy := retry.Policy{Attempts: xRestartAttempts, Initial: restartBackoff, Max: maxRestartBackoff,
		Retryable: func(error) bool { return s.ctx.Err() == nil }}
	want := disp
	_, err := retry.Do(s.ctx, policy, func(ctx context.Context, _ int) error {
		err := s.startX(ctx, want)
		if errors.Is(err, errDisplayTaken) {
			// Another server took the display while ours was down. A new
			// display beats no display: Display() reports it, and the
			// window manager and apps are started on it.
			want = -1
		}
		return err
	})
	if err != nil {
		if s.ctx.Err() == nil {
			fail(deaths, err)
		}
		return
	}
	if d := s.Display(); d != ":"+strconv.Itoa(disp) {
		s.log.Warn("X server restarted on another display", "display", d, "was", disp)
	}
	s.log.Info("X server restarted", "display", disp)
	_ = s.startWM(s.ctx) // logged; the desktop works without one
	if err := s.startApps(); err != nil {
		s.log.Warn("restart apps", "error", err)
	}
}

// restartWM records the death of the window manager wm, which died on
// its own at died, as a desktop.wm_died fault and starts it again. After
// wmRestartLimit deaths in a row that each came soon after its start, it
// records the WM as down for good instead: the session runs on without
// one, as input and capture need none.
func (s *Session) restartWM(wm *proc, died time.Time) {
	cause := fmt.Errorf("%s exited: %v; %s", wm.name, wm.err, wm.logTail())
	s.mu.Lock()
	s.wm = nil
	s.ended = append(s.ended, wm)
	if died.Sub(wm.started) > stableAfter {
		s.wmDeaths = 0
	}
	s.wmDeaths++
	deaths := s.wmDeaths
	if deaths <= wmRestartLimit {
		s.record(Fault{At: died, Restarts: deaths, Err: faults.Wrap(cause, faults.CodeDesktopWMDied, faults.Unavailable, faults.Desktop,
			"the window manager died; it is being restarted (input and screenshots work meanwhile)")})
	}
	s.mu.Unlock()
	if deaths > wmRestartLimit {
		s.wmDown(died, deaths-1, fmt.Sprintf("the window manager died %d times in a row soon after starting and is down for good; "+
			"the desktop keeps running without one (no window decorations or focus handling)", deaths), cause)
		return
	}
	s.log.Warn("window manager exited; restarting it", "window_manager", wm.name, "code", faults.CodeDesktopWMDied,
		"restarts", deaths, "error", cause)
	if deaths > 1 && sleepCtx(s.ctx, restartPolicy.Delay(deaths-1)) != nil {
		return
	}
	if err := s.startWM(s.ctx); err != nil && s.ctx.Err() == nil {
		s.wmDown(time.Now(), deaths, "the window manager died and could not be restarted; "+
			"the desktop keeps running without one (no window decorations or focus handling)", err)
	}
}

// wmDown records that the window manager is gone for good, after
// restarts in a row.
func (s *Session) wmDown(at time.Time, restarts int, msg string, cause error) {
	fe := faults.Wrap(cause, faults.CodeDesktopWMDied, faults.Unavailable, faults.Desktop, msg).WithRetryable(false)
	s.mu.Lock()
	s.wmGone = true
	s.record(Fault{Err: fe, At: at, Restarts: restarts})
	s.mu.Unlock()
	s.log.Error("window manager is down; running without one", "code", faults.CodeDesktopWMDied, "restarts", restarts, "error", cause)
}

// restartPolicy spaces the restarts of a process that keeps dying young:
// the wait after n young deaths in a row is restartPolicy.Delay(n), at
// most restartPolicy.Cap(n). The session counts the deaths itself (it
// reports them in its faults), so it asks for the n-th wait rather than
// keep a retry.Backoff per process.
var restartPolicy = retry.Policy{Initial: restartBackoff, Max: maxRestartBackoff}

// Close kills every process of the session, and their descendants, waits
// for them, and removes the session's files. It is safe to call more than
// once.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		if s.cancel != nil {
			s.cancel(errClosed)
		}
		s.wg.Wait()

		s.mu.Lock()
		procs := append(append([]*proc{}, s.apps...), s.ended...)
		if s.wm != nil {
			procs = append(procs, s.wm)
		}
		x := s.xproc
		if x != nil {
			procs = append(procs, x)
		}
		disp := s.display
		s.mu.Unlock()

		// An operation in flight was canceled with s.ctx; the X lock is
		// free soon after. Closing the connection before the server
		// dies lets it end cleanly.
		s.xsem <- struct{}{}
		if s.conn != nil {
			s.conn.close()
			s.conn = nil
		}
		<-s.xsem
		// Everything that carries the session's marker now, including
		// daemons that left every tree, is to be reaped once dead.
		killed := map[int]bool{}
		for _, pid := range sessionProcs(s.id) {
			killed[pid] = true
		}
		stopAll(procs, killed)
		reap(killed)
		if x != nil {
			removeXFiles(disp, x.pid)
		}
		if s.dir != "" {
			_ = os.RemoveAll(s.dir)
		}
	})
	return nil
}

// stopAll stops procs together: SIGTERM to every tree, one grace period
// for all, then SIGKILL to what is left.
func stopAll(procs []*proc, killed map[int]bool) {
	for _, p := range procs {
		for _, pid := range signalTree(p, syscall.SIGTERM) {
			killed[pid] = true
		}
	}
	deadline := time.After(killGrace)
wait:
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-deadline:
			break wait
		}
	}
	for _, p := range procs {
		p.stop(0, killed)
	}
}

// removeXFiles removes the lock file and socket of display disp when they
// are still those of the server pid, which cannot remove them itself once
// SIGKILLed.
func removeXFiles(disp, pid int) {
	lock := fmt.Sprintf("/tmp/.X%d-lock", disp)
	b, err := os.ReadFile(lock)
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(pid) {
		return
	}
	_ = os.Remove(fmt.Sprintf("/tmp/.X11-unix/X%d", disp))
	_ = os.Remove(lock)
}

// withX runs fn with the X connection, one operation at a time,
// (re)connecting first when the server was restarted or the connection
// broke. fn may take extra beyond xOpTimeout (a held key). Its error is
// classified here.
func (s *Session) withX(ctx context.Context, op string, extra time.Duration, fn func(ctx context.Context, x *xconn) error) error {
	// The operation also ends with the session.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopClose := context.AfterFunc(s.ctx, func() { cancel(errClosed) })
	defer stopClose()

	select {
	case s.xsem <- struct{}{}:
	case <-ctx.Done():
		return faults.Of(context.Cause(ctx))
	}
	defer func() { <-s.xsem }()
	x, err := s.connLocked(ctx)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(xOpTimeout + extra)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	// dl guards the connection's deadline: fn may push it back for a wait
	// of its own (xconn.extend), and a cancel cuts it short for good.
	var dl struct {
		sync.Mutex
		at  time.Time
		cut bool
	}
	dl.at = deadline
	_ = x.nc.SetDeadline(deadline)
	x.grant = func(d time.Duration) {
		dl.Lock()
		defer dl.Unlock()
		if dl.cut {
			return
		}
		dl.at = dl.at.Add(d)
		if c, ok := ctx.Deadline(); ok && c.Before(dl.at) {
			dl.at = c
		}
		_ = x.nc.SetDeadline(dl.at)
	}
	defer func() { x.grant = nil }()
	// Cancelling ctx interrupts a request in flight: the past deadline
	// fails it, and the broken connection is remade next time.
	cut := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		dl.Lock()
		dl.cut = true
		x.interrupted.Store(true)
		_ = x.nc.SetDeadline(time.Now())
		dl.Unlock()
		close(cut)
	})
	err = fn(ctx, x)
	dl.Lock()
	deadline = dl.at
	dl.Unlock()
	if stop() {
		_ = x.nc.SetDeadline(time.Time{})
	} else {
		// The cut may still be under way: it must land before the X lock
		// passes on, or it would break the next operation's request.
		<-cut
	}
	if err == nil {
		return nil
	}
	return s.classify(ctx, op, x, err, deadline)
}

// classify turns the failure of an X operation into a fault.
func (s *Session) classify(ctx context.Context, op string, x *xconn, err error, deadline time.Time) error {
	var fe *faults.Error
	if errors.As(err, &fe) {
		return err
	}
	if ctx.Err() != nil {
		if c := context.Cause(ctx); c == errClosed {
			return errClosed
		}
		return faults.Of(context.Cause(ctx))
	}
	var xe xgb.Error
	if errors.As(err, &xe) {
		// The server answered with an error; the connection is fine.
		return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Desktop, op+": the X server refused the request")
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, errConnClosed) && x.alive() {
		return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Desktop, op+" failed")
	}
	if down, dead := s.xDied(x.gen); dead {
		return fmt.Errorf("%s: %w", op, down)
	}
	if !time.Now().Before(deadline) {
		return faults.Wrap(err, faults.CodeTimeout, faults.Timeout, faults.Desktop, op+": the X server did not answer in time")
	}
	return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Desktop, op+": lost the connection to the X server").WithRetryable(true)
}

// xDied reports whether the X server of generation gen is dead, and if
// so records it (noteXDied) and returns its fault. It waits up to
// exitNoticeWait for the process's exit to be seen.
func (s *Session) xDied(gen uint64) (*faults.Error, bool) {
	s.mu.Lock()
	x, down := s.xproc, s.down
	s.mu.Unlock()
	if x == nil || x.gen != gen {
		if down == nil {
			down = faults.New(faults.CodeDesktopXDied, faults.Unavailable, faults.Desktop, "the X server died and was restarted")
		}
		return down, true
	}
	t := time.NewTimer(exitNoticeWait)
	defer t.Stop()
	select {
	case <-x.exited:
		return s.noteXDied(x), true
	case <-t.C:
		return nil, false
	}
}

// connLocked returns a working connection to the current X server,
// waiting for a restart in progress. The caller holds the X lock.
func (s *Session) connLocked(ctx context.Context) (*xconn, error) {
	for {
		s.mu.Lock()
		closed, down, failed, up, gen, disp := s.closed, s.down, s.failed, s.up, s.xgen, s.display
		s.mu.Unlock()
		switch {
		case closed:
			return nil, errClosed
		case down != nil && failed:
			return nil, down
		case down != nil:
			t := time.NewTimer(restartWait)
			select {
			case <-up:
				t.Stop()
				continue
			case <-ctx.Done():
				t.Stop()
				return nil, down
			case <-t.C:
				return nil, down
			}
		}
		if s.conn != nil && s.conn.gen == gen && s.conn.alive() {
			return s.conn, nil
		}
		// A connection that broke under a live server may have left keys
		// or buttons down (an operation canceled between press and
		// release); the server keeps them down for every client.
		stuck := s.conn != nil && s.conn.gen == gen
		if s.conn != nil {
			s.conn.close()
			s.conn = nil
		}
		x, err := dialX(disp, gen, !s.opts.NoSHM)
		if err == nil && stuck {
			_ = x.nc.SetDeadline(time.Now().Add(xDialTimeout))
			err = x.releaseAll()
			_ = x.nc.SetDeadline(time.Time{})
			if err != nil {
				x.close()
			}
		}
		if err != nil {
			if _, dead := s.xDied(gen); dead {
				continue // the server died under us: wait for the restart
			}
			return nil, faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Desktop, "connect to the X server").WithRetryable(true)
		}
		if x.w != s.width || x.h != s.height {
			x.close()
			return nil, faults.Newf(faults.CodeInternal, faults.Internal, faults.Desktop,
				"the X screen is %dx%d, not %dx%d", x.w, x.h, s.width, s.height)
		}
		if s.loans == nil || s.loansGen != gen {
			s.loans, s.loansGen = map[xproto.Keycode]*loan{}, gen
		}
		x.loans = s.loans
		s.conn = x
		return x, nil
	}
}

// inScreen reports whether p is on the screen.
func (s *Session) inScreen(p image.Point) bool {
	return p.In(image.Rect(0, 0, s.width, s.height))
}
