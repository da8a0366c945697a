package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/browser"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/inject"
	"github.com/orchard/orchard/retry"
)

// A browser sandbox's Chromium runs in a child process of the agent, the
// browser daemon (`orchard-agent browser`), not in the agent itself: the
// agent reaps every child with wait4(-1) (it is PID 1), which would steal
// the exit status the browser driver waits for; and a browser that
// crashes takes only the daemon down, which the agent restarts.

// browserSession returns the session options of the daemon from the
// create request's settings.
func browserSession(o api.BrowserOptions, log *slog.Logger) browser.Options {
	bo := browser.OptionsOf(o)
	bo.Logger = log
	// GET /browser/cdp proxies to it.
	bo.DevTools = true
	if o.ProxyServer != "" {
		bo.ProxyServer = "http://" + o.ProxyServer
		bo.Evidence = evidenceClient(o.ProxyServer)
	}
	return bo
}

// BrowserMain is `orchard-agent browser --socket PATH --options JSON`: it
// launches Chromium and serves the browser paths on the socket until ctx
// ends or the browser dies (then it exits non-zero so the agent restarts it).
func BrowserMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("orchard-agent browser", flag.ContinueOnError)
	sock := fs.String("socket", "", "unix socket to serve on")
	optJSON := fs.String("options", "{}", "browser options (JSON)")
	profile := fs.String("profile", "", "profile directory kept across restarts (cookies, storage)")
	stateFile := fs.String("state", "", "file recording the open tabs, reopened after a restart")
	readyFD := fs.Int("ready-fd", -1, "file descriptor to write a byte to once serving")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ready := readyPipe(*readyFD)
	var opts api.BrowserOptions
	if err := json.Unmarshal([]byte(*optJSON), &opts); err != nil {
		return fmt.Errorf("browser options: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "browser")
	so := browserSession(opts, log)
	so.UserDataDir = *profile
	if so.UserDataDir != "" {
		// A crashed browser leaves its profile locked; the lock's owner is
		// gone, so the new browser may take it.
		for _, f := range []string{"SingletonLock", "SingletonSocket", "SingletonCookie"} {
			_ = os.Remove(filepath.Join(so.UserDataDir, f))
		}
	}
	sess, err := browser.Launch(ctx, so)
	if err != nil {
		return err
	}
	defer sess.Close()
	st := &tabState{path: *stateFile}
	if !st.restore(ctx, sess, log) && opts.StartURL != "" {
		// A failed load is the page's, not the daemon's: the session serves
		// on and the agent's first observation shows what happened.
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := sess.Do(rctx, []browser.Action{{Type: browser.ActNavigate, URL: opts.StartURL}})
		cancel()
		log.Info("opened the start page", "err", err)
	}
	_ = os.Remove(*sock)
	ln, err := net.Listen("unix", *sock)
	if err != nil {
		return fmt.Errorf("browser daemon: %w", err)
	}
	// A request that finds the browser dead ends the daemon at once, so
	// the agent restarts it before the caller's next step. One that finds
	// it dead before it ran says so (headerNotRun): nothing of it
	// happened, and the agent runs it again on the restarted browser.
	dead := make(chan struct{})
	var deadOnce sync.Once
	h := st.track(sess, browserHandler(sess, log))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := sess.Err(); err != nil {
			deadOnce.Do(func() { close(dead) })
			w.Header().Set(headerNotRun, "1")
			writeFault(w, err)
			return
		}
		h.ServeHTTP(w, r)
		if sess.Err() != nil {
			deadOnce.Do(func() { close(dead) })
		}
	}), ReadHeaderTimeout: readHeaderTimeout}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	signalReady(ready)
	select {
	case <-ctx.Done():
		_ = srv.Close()
		return nil
	case err := <-errc:
		return err
	case <-dead:
	case <-sess.Dead():
	}
	// Shutdown, not Close: a request the browser died under is still
	// writing its answer.
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	return sess.Err()
}

// headerNotRun marks a browser daemon's answer to a call it did not run
// because the browser was already dead; the agent strips it.
const headerNotRun = "X-Orchard-Not-Run"

// browserHandler serves API.md's browser paths over one session.
func browserHandler(sess *browser.Session, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	handle(mux, "GET /health", func(w http.ResponseWriter, r *http.Request) error {
		if err := sess.Err(); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "pid": sess.PID()})
		return nil
	})
	handle(mux, "POST "+injectPath, func(w http.ResponseWriter, r *http.Request) error {
		var err error
		switch r.URL.Query().Get("kind") {
		case faults.InjectBrowserCrash:
			err = sess.InjectCrash()
		case faults.InjectHang:
			err = sess.InjectHang()
		default:
			err = errInvalidInject
		}
		if err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	handle(mux, "POST /browser/actions", func(w http.ResponseWriter, r *http.Request) error {
		var req api.BrowserActionsRequest
		if err := decodeJSON(w, r, 16<<20, &req); err != nil {
			return err
		}
		res, err := sess.Run(r.Context(), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, res)
		return nil
	})
	// The server resizes a warm pool's browser to the viewport of the
	// create that claimed it.
	handle(mux, "POST /browser/viewport", func(w http.ResponseWriter, r *http.Request) error {
		var v api.Viewport
		if err := decodeJSON(w, r, 1<<10, &v); err != nil {
			return err
		}
		if err := sess.SetViewport(r.Context(), v); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, v)
		return nil
	})
	handle(mux, "POST /browser/evaluate", func(w http.ResponseWriter, r *http.Request) error {
		var req api.EvaluateRequest
		if err := decodeJSON(w, r, 1<<20, &req); err != nil {
			return err
		}
		if req.Expression == "" {
			return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "expression is required")
		}
		v, err := sess.Evaluate(r.Context(), req.Expression)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, api.EvaluateResult{Value: v})
		return nil
	})
	handle(mux, "GET /browser/observation", func(w http.ResponseWriter, r *http.Request) error {
		o, err := observeOptions(r.URL.Query(), "jpeg")
		if err != nil {
			return err
		}
		obs, err := sess.Observe(r.Context(), o)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, obs)
		return nil
	})
	handle(mux, "GET /browser/screenshot", func(w http.ResponseWriter, r *http.Request) error {
		q := r.URL.Query()
		if f := q.Get("format"); f != "" {
			q.Set("screenshot", f)
		}
		o, err := observeOptions(q, "png")
		if err != nil {
			return err
		}
		if o.Screenshot == "none" {
			return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "format must be png or jpeg")
		}
		obs, err := sess.Screenshot(r.Context(), o)
		if err != nil {
			return err
		}
		shot, h := obs.Screenshot, w.Header()
		h.Set("Content-Type", "image/"+shot.Format)
		h.Set("X-Screenshot-Width", strconv.Itoa(shot.Width))
		h.Set("X-Screenshot-Height", strconv.Itoa(shot.Height))
		// As the desktop's: actions may name this frame, in whose pixels
		// their coordinates then are.
		h.Set("X-Orchard-Frame", strconv.FormatInt(obs.Frame, 10))
		h.Set("X-Orchard-Scale", strconv.FormatFloat(obs.Scale, 'f', -1, 64))
		if obs.Timing.Frame != "" {
			h.Set("X-Orchard-Capture", obs.Timing.Frame)
		}
		_, _ = w.Write(shot.Data)
		return nil
	})
	handle(mux, "GET /browser/tabs", func(w http.ResponseWriter, r *http.Request) error {
		// A dead browser's last tabs would tell the caller all is well.
		if err := sess.Err(); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, api.TabList{Tabs: sess.Tabs()})
		return nil
	})
	handle(mux, "GET /browser/state", func(w http.ResponseWriter, r *http.Request) error {
		st, err := sess.ExportState(r.Context())
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, st)
		return nil
	})
	handle(mux, "PUT /browser/state", func(w http.ResponseWriter, r *http.Request) error {
		var st api.BrowserState
		if err := decodeJSON(w, r, stateBodyLimit, &st); err != nil {
			if faults.Is(err, faults.CodeTooLarge) {
				return faults.Wrap(err, faults.CodeBrowserStateTooLarge, faults.TooLarge, faults.Client,
					fmt.Sprintf("the state to import exceeds %d bytes", api.MaxBrowserStateBytes))
			}
			return err
		}
		if err := sess.ImportState(r.Context(), st); err != nil {
			if f := faults.Of(err); f.Code == faults.CodeValidation {
				// As the server answers a validation error: FastAPI's 422.
				return f.WithStatus(http.StatusUnprocessableEntity)
			}
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	handle(mux, "GET /browser/cdp", func(w http.ResponseWriter, r *http.Request) error {
		if err := serveCDP(w, r, sess); err != nil {
			return err
		}
		return nil
	})
	handle(mux, "GET /browser/cdp/json/version", func(w http.ResponseWriter, r *http.Request) error {
		v, err := cdpVersion(r.Context(), sess)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, v)
		return nil
	})
	var viewers atomic.Int32
	handle(mux, "GET /browser/stream", func(w http.ResponseWriter, r *http.Request) error {
		if viewers.Add(1) > maxStreamViewers {
			viewers.Add(-1)
			return faults.Newf(faults.CodeCapacity, faults.Unavailable, faults.Browser,
				"the live view has its maximum of %d viewers", maxStreamViewers)
		}
		defer viewers.Add(-1)
		return serveStream(w, r, sess, log)
	})
	return mux
}

// observeOptions reads API.md's observation query parameters.
func observeOptions(q url.Values, defShot string) (api.Observe, error) {
	o := api.Observe{Screenshot: q.Get("screenshot")}
	if o.Screenshot == "" {
		o.Screenshot = defShot
	}
	switch o.Screenshot {
	case "png", "jpeg", "none":
	default:
		return o, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "screenshot must be jpeg, png or none, not %q", o.Screenshot)
	}
	ints := map[string]*int{"quality": &o.Quality, "width": &o.Width}
	for k, dst := range ints {
		if v := q.Get(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return o, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "%s must be a non-negative integer", k)
			}
			*dst = n
		}
	}
	if v := q.Get("scale"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= 1) {
			return o, faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "scale must be a number above 0 and at most 1")
		}
		o.Scale = f
	}
	bools := map[string]*bool{"full_page": &o.FullPage, "axtree": &o.AXTree, "som": &o.SOM, "text": &o.Text, "marks": &o.Marks}
	for k, dst := range bools {
		if v := q.Get(k); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return o, faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "%s must be true or false", k)
			}
			*dst = b
		}
	}
	return o, nil
}

// readyPipe takes the pipe the agent passed at fd (none when fd < 0) and
// keeps it from the browser and every other program the daemon starts.
func readyPipe(fd int) *os.File {
	if fd < 0 {
		return nil
	}
	syscall.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "ready")
}

// signalReady tells the agent, over its pipe, that the daemon listens
// (connections queue on the socket until Serve takes them).
func signalReady(f *os.File) {
	if f == nil {
		return
	}
	_, _ = f.Write([]byte{1})
	_ = f.Close()
}

// stateBodyLimit bounds PUT /browser/state: the largest state plus room
// for the JSON the decoder reads past a state's own bytes (whitespace).
const stateBodyLimit = api.MaxBrowserStateBytes + 1<<20

// browserSocket is where the daemon listens, inside the sandbox.
const browserSocket = api.BrowserDaemonSocket

// browserProc supervises the browser daemon: started with the sandbox,
// restarted when it dies, reached over its socket.
type browserProc struct {
	s    *Server
	opts string // api.BrowserOptions as JSON
	sock string
	kind daemonKind

	mu       sync.Mutex // guards lastErr, restarts, up
	lastErr  error
	restarts int
	// up is closed while the daemon answers; a new, open one replaces it
	// when the daemon dies, and is closed once a restart answers.
	up chan struct{}

	proxy *httputil.ReverseProxy
}

// daemonKind is what differs between the daemons the agent supervises
// (the browser's and the desktop's): their command line and how their
// absence is classified.
type daemonKind struct {
	name   string // "browser", "desktop"
	code   string // the code of "not running" and "died"
	launch string // the code of "could not start"
	source faults.Source
	args   func(exe, sock, opts string) []string
}

var browserDaemon = daemonKind{name: "browser", code: faults.CodeBrowserCrashed, launch: faults.CodeBrowserLaunch, source: faults.Browser,
	args: func(exe, sock, opts string) []string {
		return []string{exe, "browser", "--socket", sock, "--options", opts, "--profile", sock + ".profile", "--state", sock + ".tabs"}
	}}

// browserStartTimeout bounds one start of the daemon (Chromium's cold start
// is a second or two; a loaded machine can take much longer).
const browserStartTimeout = 60 * time.Second

func (s *Server) startBrowser(ctx context.Context, opts string) (*browserProc, error) {
	if s.egress != nil {
		// Chromium goes through the sandbox's proxy like every command.
		// Settings that do not decode are the daemon's to report.
		var o api.BrowserOptions
		if err := json.Unmarshal([]byte(opts), &o); err == nil {
			o.ProxyServer = s.egress.ln.Addr().String()
			b, _ := json.Marshal(o)
			opts = string(b)
		}
	}
	sock := browserSocket
	if s.cfg.BrowserSocket != "" {
		sock = s.cfg.BrowserSocket
	}
	return s.startDaemon(ctx, browserDaemon, sock, opts)
}

// startDaemon starts a daemon, waits until it answers and supervises it.
func (s *Server) startDaemon(ctx context.Context, kind daemonKind, sock, opts string) (*browserProc, error) {
	b := &browserProc{s: s, opts: opts, sock: sock, kind: kind}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", b.sock)
	}}
	b.proxy = &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", kind.name
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			b.mu.Lock()
			last := b.lastErr
			b.mu.Unlock()
			f := faults.Wrap(err, kind.code, faults.Unavailable, kind.source, "the "+kind.name+" is not running; it is being restarted")
			if last != nil {
				f.Message += " (" + faults.Of(last).Message + ")"
			}
			writeJSON(w, f.StatusOf(), faults.EnvelopeOf(f))
		},
	}
	// A daemon that exits while starting is started again a couple of
	// times: Chromium now and then exits at launch under load, and the
	// supervisor only covers a daemon that was up. A spawn that fails, or a
	// start that fails otherwise, is not retried.
	spawnFailed := false
	p := daemonStartRetry
	p.Retryable = func(err error) bool { return !spawnFailed && faults.Of(err).Category == faults.Unavailable }
	p.OnRetry = func(attempt int, err error) {
		s.log.Warn("daemon exited while starting; starting it again", "daemon", kind.name, "attempt", attempt, "err", err)
	}
	c, res, err := retry.DoValue(ctx, p, func(ctx context.Context, _ int) (*child, error) {
		c, ready, err := b.spawn()
		if err != nil {
			spawnFailed = true
			return nil, err
		}
		if err := b.awaitReady(ctx, c, ready); err != nil {
			_ = c.signalGroup(syscall.SIGKILL)
			return nil, err
		}
		return c, nil
	})
	if err != nil {
		if last := res.LastErr(); last != nil {
			return nil, last // the daemon's own failure, as it gave it
		}
		return nil, err
	}
	b.up = make(chan struct{})
	close(b.up)
	go b.supervise(ctx, c)
	return b, nil
}

// daemonStartRetry starts a daemon that exits while starting again:
// daemonStartAttempts bounds the starts, as one that keeps exiting is
// misconfigured, not unlucky; the waits, up to 200 ms then 400 ms, let a
// loaded machine catch its breath.
var daemonStartRetry = retry.Policy{Attempts: daemonStartAttempts, Initial: 200 * time.Millisecond, Max: 400 * time.Millisecond}

// daemonStartAttempts bounds the starts of a daemon that exits while
// starting; one that keeps exiting is misconfigured, not unlucky.
const daemonStartAttempts = 3

// spawn starts the daemon. The returned channel is closed when the daemon
// says it serves: it writes a byte to the pipe at --ready-fd once it
// listens, so a start is seen at once instead of at the next health
// check (every 20 ms: half of that on average added to a sandbox's ready
// time).
func (b *browserProc) spawn() (*child, <-chan struct{}, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	logf, err := os.OpenFile(b.sock+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		logf = nil
	}
	if logf != nil {
		defer logf.Close()
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	defer w.Close()
	files := []*os.File{nil, logf, logf, w} // a nil logf leaves stdout and stderr closed
	args := append(b.kind.args(exe, b.sock, b.opts), "--ready-fd", "3")
	c, err := b.s.reaper.startProcess(func() (*os.Process, error) {
		return os.StartProcess(exe, args, &os.ProcAttr{
			Files: files,
			Env:   os.Environ(),
			Sys:   &syscall.SysProcAttr{Setsid: true},
		})
	})
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	ready := make(chan struct{})
	go func() {
		defer r.Close()
		// EOF (the daemon exited, or closed the pipe without a word)
		// leaves readiness to the health checks and the exit to c.done.
		if n, _ := r.Read(make([]byte, 1)); n == 1 {
			close(ready)
		}
	}()
	return c, ready, nil
}

// awaitReady waits until the daemon says it serves (ready), answers
// /health, or dies.
func (b *browserProc) awaitReady(ctx context.Context, c *child, ready <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, browserStartTimeout)
	defer cancel()
	hc := &http.Client{Transport: b.proxy.Transport, Timeout: 2 * time.Second}
	poll := retry.NewBackoff(readyPoll)
	for {
		resp, err := hc.Get("http://" + b.kind.name + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		wait, _ := poll.Next(err) // no Attempts or Budget: ctx bounds it
		t := time.NewTimer(wait)
		select {
		case <-ready:
			t.Stop()
			return nil
		case <-c.done:
			t.Stop()
			code, sig := c.exitCode()
			return faults.Newf(b.kind.launch, faults.Unavailable, b.kind.source,
				"the %s exited while starting (code %d, signal %d; see %s.log)", b.kind.name, code, sig, b.sock)
		case <-ctx.Done():
			t.Stop()
			return faults.New(b.kind.launch, faults.Timeout, b.kind.source, "the "+b.kind.name+" did not start in time")
		case <-t.C:
		}
	}
}

// readyPoll spaces awaitReady's health checks, which only matter for a
// daemon that says nothing on its ready pipe.
var readyPoll = retry.Policy{Initial: 20 * time.Millisecond, Max: 20 * time.Millisecond}

// daemonRestart spaces supervise's restarts of a daemon that keeps dying,
// from up to 200 ms to up to 10 s; a restart that works starts over.
var daemonRestart = retry.Policy{Initial: 200 * time.Millisecond, Max: 10 * time.Second}

// supervise restarts the daemon when it dies, with backoff, until ctx ends.
func (b *browserProc) supervise(ctx context.Context, c *child) {
	restart := retry.NewBackoff(daemonRestart)
	for {
		select {
		case <-ctx.Done():
			_ = c.signalGroup(syscall.SIGTERM)
			select {
			case <-c.done:
			case <-time.After(5 * time.Second):
				_ = c.signalGroup(syscall.SIGKILL)
			}
			return
		case <-c.done:
		}
		code, sig := c.exitCode()
		err := faults.Newf(b.kind.code, faults.Unavailable, b.kind.source, "the %s died (code %d, signal %d)", b.kind.name, code, sig)
		b.mu.Lock()
		b.lastErr, b.restarts = err, b.restarts+1
		select {
		case <-b.up:
			b.up = make(chan struct{})
		default: // down already
		}
		b.mu.Unlock()
		b.s.log.Warn("daemon died; restarting", "daemon", b.kind.name, "code", code, "signal", sig)
		for {
			if restart.Wait(ctx, nil) != nil {
				return
			}
			nc, ready, serr := b.spawn()
			if serr == nil {
				if serr = b.awaitReady(ctx, nc, ready); serr == nil {
					c = nc
					restart.Reset()
					b.mu.Lock()
					close(b.up)
					b.mu.Unlock()
					break
				}
				_ = nc.signalGroup(syscall.SIGKILL)
			}
			b.s.log.Warn("browser restart failed", "err", serr)
		}
	}
}

// HeaderRestarted is set on a daemon's answer to a call that waited for
// the daemon (the browser, the desktop) to be restarted after it died,
// or that was run again on the restarted one: its value is the number of
// restarts so far. A restarted browser reopens the tabs it had, at their
// URLs, with the profile it had (cookies, storage); what lived only in
// the pages (their scripts' state, typed text not submitted, dialogs) is
// gone.
const HeaderRestarted = "X-Orchard-Restarted"

// restartWait bounds a call's wait for a restart, within its own deadline.
const restartWait = browserStartTimeout

// ServeHTTP forwards a call to the daemon. A call that arrives while the
// daemon is being restarted waits for it (bounded by its own context and
// restartWait) instead of failing, and a read (GET) that the daemon
// answered with its death is run again once it is back: only a restart
// that fails or takes too long is the caller's error. An action that was
// running when the browser died is not run again (part of it may have
// happened): it answers the crash. One the daemon turned away because the
// browser was dead already is run again, as a read is.
func (b *browserProc) ServeHTTP(w http.ResponseWriter, r *http.Request) { b.serve(w, r, true) }

// serve is ServeHTTP; without heal, the call neither waits for a restart
// nor runs again after one: it answers the daemon's death, as a step
// whose fault plan just crashed the browser must.
func (b *browserProc) serve(w http.ResponseWriter, r *http.Request, heal bool) {
	if heal {
		waited, err := b.awaitUp(r.Context())
		if err != nil {
			writeJSON(w, faults.Of(err).StatusOf(), faults.EnvelopeOf(faults.Of(err)))
			return
		}
		if waited {
			w.Header().Set(HeaderRestarted, strconv.Itoa(b.restartCount()))
		}
	}
	if streamed(r) {
		b.proxy.ServeHTTP(w, r)
		return
	}
	// A call other than a read runs again only when the daemon did not run
	// it, which needs its body kept: a body too large to keep is sent as
	// it comes, and the call is not run again.
	var body []byte
	if r.Method != http.MethodGet {
		kept, err := io.ReadAll(io.LimitReader(r.Body, rerunBodyLimit+1))
		if err != nil {
			writeJSON(w, http.StatusBadRequest, faults.EnvelopeOf(faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client,
				"read the request's body: "+err.Error())))
			return
		}
		if len(kept) > rerunBodyLimit {
			r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(kept), r.Body))
			b.proxy.ServeHTTP(w, r)
			return
		}
		body = kept
	}
	send := func() *bufferedResponse {
		if r.Method != http.MethodGet {
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		rec := &bufferedResponse{header: http.Header{}}
		b.proxy.ServeHTTP(rec, r)
		return rec
	}
	rec := send()
	rerun := heal && (r.Method == http.MethodGet || rec.header.Get(headerNotRun) != "")
	if rerun && b.died(rec) {
		if _, err := b.awaitUp(r.Context()); err == nil {
			rec = send()
			w.Header().Set(HeaderRestarted, strconv.Itoa(b.restartCount()))
		}
	}
	rec.header.Del(headerNotRun)
	rec.writeTo(w)
}

// rerunBodyLimit bounds the body of a call kept to run it again; actions
// and evaluations are far smaller, a browser state import may be larger.
const rerunBodyLimit = 1 << 20

// streamed reports whether r's answer is a stream (a live view, a
// WebSocket) rather than one body to buffer.
func streamed(r *http.Request) bool {
	return websocket.IsWebSocketUpgrade(r) || strings.HasSuffix(r.URL.Path, "/stream") ||
		strings.HasSuffix(r.URL.Path, "/cdp") || strings.HasSuffix(r.URL.Path, "/vnc")
}

func (b *browserProc) restartCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.restarts
}

// awaitUp waits until the daemon answers, and reports whether it had to.
func (b *browserProc) awaitUp(ctx context.Context) (bool, error) {
	b.mu.Lock()
	up := b.up
	b.mu.Unlock()
	select {
	case <-up:
		return false, nil
	default:
	}
	t := time.NewTimer(restartWait)
	defer t.Stop()
	select {
	case <-up:
		return true, nil
	case <-t.C:
	case <-ctx.Done():
	}
	b.mu.Lock()
	last := b.lastErr
	b.mu.Unlock()
	f := faults.New(b.kind.code, faults.Unavailable, b.kind.source, "the "+b.kind.name+" died and was not back in time")
	if last != nil {
		f.Message += " (" + faults.Of(last).Message + ")"
	}
	return false, f
}

// died reports whether a buffered answer says the daemon died under the
// call: the daemon's own crash answer, or the proxy's when it could not
// reach it. The supervisor may not have noticed yet; give it a moment.
func (b *browserProc) died(rec *bufferedResponse) bool {
	if rec.status != http.StatusServiceUnavailable {
		return false
	}
	var env faults.Envelope
	if json.Unmarshal(rec.body.Bytes(), &env) != nil || env.Error == nil || env.Error.Code != b.kind.code {
		return false
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		b.mu.Lock()
		up := b.up
		b.mu.Unlock()
		select {
		case <-up:
		default:
			return true // down: awaitUp waits for the restart
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// bufferedResponse keeps a daemon's answer to look at before it is sent.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *bufferedResponse) Header() http.Header { return r.header }
func (r *bufferedResponse) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}
func (r *bufferedResponse) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *bufferedResponse) writeTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}

// errNoBrowser and errNoDesktop answer kind paths in sandboxes of other kinds.
var (
	errNoBrowser = errors.New("not a browser sandbox")
	errNoDesktop = errors.New("not a desktop sandbox")
)

func (s *Server) handleBrowser(w http.ResponseWriter, r *http.Request) error {
	if s.browser == nil {
		return faults.Wrap(errNoBrowser, faults.CodeKindUnsupported, faults.InvalidRequest, faults.Client,
			"this sandbox has no browser (create it with kind \"browser\")")
	}
	if r.Method == http.MethodPost && r.URL.Path == "/browser/actions" {
		switch s.stepFault(w, inject.Browser, faults.InjectBrowserCrash, faults.InjectHang, faults.InjectAgentKill) {
		case faults.InjectBrowserCrash, faults.InjectHang:
			// The step met the fault: it answers it, not the restarted
			// browser's result.
			s.browser.serve(w, r, false)
			return nil
		}
	}
	s.browser.ServeHTTP(w, r)
	return nil
}

// cdpMaxMessage bounds one DevTools message either way; a full-page
// screenshot in base64 is the largest a client normally sees.
const cdpMaxMessage = 256 << 20

var cdpUpgrader = websocket.Upgrader{
	ReadBufferSize:  64 << 10,
	WriteBufferSize: 64 << 10,
	// The server authenticated the caller; the browser is the caller's.
	CheckOrigin: func(*http.Request) bool { return true },
}

// serveCDP proxies a WebSocket to the browser's DevTools endpoint, frame
// for frame both ways, until either side closes. Errors before the
// upgrade are returned for the caller to answer.
func serveCDP(w http.ResponseWriter, r *http.Request, sess *browser.Session) error {
	if err := sess.Err(); err != nil {
		return err
	}
	u := sess.DevToolsURL()
	if u == "" {
		return faults.New(faults.CodeKindUnsupported, faults.Unavailable, faults.Browser, "the browser has no DevTools endpoint")
	}
	if !websocket.IsWebSocketUpgrade(r) {
		return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "/browser/cdp is a WebSocket: send an upgrade request")
	}
	dctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	d := websocket.Dialer{ReadBufferSize: 64 << 10, WriteBufferSize: 64 << 10}
	up, resp, err := d.DialContext(dctx, u, nil)
	cancel()
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return faults.Wrap(err, faults.CodeBrowserProtocol, faults.Unavailable, faults.Browser, "connect to the browser's DevTools endpoint: "+err.Error())
	}
	defer up.Close()
	client, err := cdpUpgrader.Upgrade(lenientKey(w, r), r, nil)
	if err != nil {
		return nil // the upgrader has answered
	}
	defer client.Close()
	// What a client does over the protocol the session cannot see: no
	// frame is reused while one is connected.
	defer sess.Attached()()
	client.SetReadLimit(cdpMaxMessage)
	up.SetReadLimit(cdpMaxMessage)

	errc := make(chan error, 2)
	go func() { errc <- pumpWS(up, client) }()
	go func() { errc <- pumpWS(client, up) }()
	err = <-errc
	// Pass the close on, then unblock the other pump.
	code, text := websocket.CloseNormalClosure, ""
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		code, text = ce.Code, ce.Text
	}
	if code == websocket.CloseAbnormalClosure || code == websocket.CloseTLSHandshake {
		// One side went away without a close frame (a browser that
		// died, a client that vanished). 1006 and 1015 must not be sent
		// (RFC 6455 §7.4.1): clients fail on them as protocol errors.
		code, text = websocket.CloseGoingAway, "peer connection lost"
	}
	msg := websocket.FormatCloseMessage(code, text)
	deadline := time.Now().Add(time.Second)
	_ = client.WriteControl(websocket.CloseMessage, msg, deadline)
	_ = up.WriteControl(websocket.CloseMessage, msg, deadline)
	client.Close()
	up.Close()
	<-errc
	return nil
}

// pumpWS copies messages from src to dst until either fails.
func pumpWS(dst, src *websocket.Conn) error {
	for {
		mt, data, err := src.ReadMessage()
		if err != nil {
			return err
		}
		if err := dst.WriteMessage(mt, data); err != nil {
			return err
		}
	}
}

// cdpVersion is the browser's /json/version, for clients that discover
// the endpoint over HTTP; webSocketDebuggerUrl is left for the caller to
// point at its own address.
func cdpVersion(ctx context.Context, sess *browser.Session) (map[string]any, error) {
	u := sess.DevToolsURL()
	if u == "" {
		return nil, faults.New(faults.CodeKindUnsupported, faults.Unavailable, faults.Browser, "the browser has no DevTools endpoint")
	}
	pu, err := url.Parse(u)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+pu.Host+"/json/version", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeBrowserProtocol, faults.Unavailable, faults.Browser, "browser version: "+err.Error())
	}
	defer resp.Body.Close()
	var v map[string]any
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v); err != nil {
		return nil, faults.Wrap(err, faults.CodeBrowserProtocol, faults.Unavailable, faults.Browser, "browser version: "+err.Error())
	}
	delete(v, "webSocketDebuggerUrl")
	return v, nil
}

// Live view limits. Frames come from the browser's screencast, shared by
// viewers of the same quality and width (browser.LiveView); a viewer gets
// at most fps of them a second.
const (
	maxStreamViewers = 8
	defaultStreamFPS = 5
	maxStreamFPS     = 10
	streamBoundary   = "orchardframe"
	// streamWriteTimeout drops a viewer that cannot take a frame.
	streamWriteTimeout = 10 * time.Second
	// streamFirstFrame bounds the wait for the first frame, which decides
	// the response's status.
	streamFirstFrame = 10 * time.Second
	// streamRepeat sends the last frame again when the page has drawn
	// nothing new for this long, so viewers and proxies see a live stream.
	streamRepeat = time.Second
)

// serveStream is the live view: an MJPEG stream (multipart/x-mixed-replace)
// of the active tab at ?fps= (default 5, at most 10), ?quality= (JPEG,
// default 60) and ?width= (scaled down to it; default the viewport's),
// until the client goes away or the browser dies. A frame is sent when the
// page draws something new, and the last one again each streamRepeat.
func serveStream(w http.ResponseWriter, r *http.Request, sess *browser.Session, log *slog.Logger) error {
	q := r.URL.Query()
	fps, quality, width := defaultStreamFPS, 60, 0
	for k, dst := range map[string]*int{"fps": &fps, "quality": &quality, "width": &width} {
		if v := q.Get(k); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "%s must be a positive integer", k)
			}
			*dst = n
		}
	}
	fps, quality = min(fps, maxStreamFPS), min(quality, 100)
	ctx := r.Context()
	lv, err := sess.Watch(quality, width)
	if err != nil {
		return err
	}
	defer lv.Close()
	// The first frame decides the status: a dead browser is an error, not
	// an empty stream.
	frame, seq, err := lv.Next(ctx, 0, streamFirstFrame)
	if err != nil {
		return err
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "multipart/x-mixed-replace; boundary="+streamBoundary)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	interval := time.Second / time.Duration(fps)
	for {
		sent := time.Now()
		_ = rc.SetWriteDeadline(sent.Add(streamWriteTimeout))
		if _, err := fmt.Fprintf(w, "--%s\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n", streamBoundary, len(frame)); err != nil {
			return nil
		}
		if _, err := w.Write(frame); err != nil {
			return nil
		}
		if _, err := io.WriteString(w, "\r\n"); err != nil {
			return nil
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
		// At most fps frames a second: wait out the interval, then take
		// the newest frame, or the same one again after streamRepeat.
		pace := time.NewTimer(time.Until(sent.Add(interval)))
		select {
		case <-ctx.Done():
			pace.Stop()
			return nil
		case <-pace.C:
		}
		next, n, err := lv.Next(ctx, seq, streamRepeat-interval)
		if err == nil {
			frame, seq = next, n
			continue
		}
		if ctx.Err() != nil || sess.Err() != nil {
			return nil // the viewer left or the browser died: end the stream
		}
		// A crashed tab or one between states: the last frame stays up,
		// sent again after a pause.
		log.Debug("live view frame", "error", err)
		retry := time.NewTimer(streamRepeat)
		select {
		case <-ctx.Done():
			retry.Stop()
			return nil
		case <-retry.C:
		}
	}
}

// tabState keeps the URLs of the open tabs in a file after every request,
// so a browser restarted after a crash reopens them (with the kept profile,
// logged-in sites stay logged in).
type tabState struct {
	path string
	mu   sync.Mutex // serialises writes of the file
}

func (t *tabState) track(sess *browser.Session, h http.Handler) http.Handler {
	if t.path == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.Method == http.MethodPost || r.Method == http.MethodPut {
			t.save(sess)
		}
	})
}

func (t *tabState) save(sess *browser.Session) {
	var urls []string
	for _, tab := range sess.Tabs() {
		urls = append(urls, tab.URL)
	}
	b, err := json.Marshal(urls)
	if err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tmp := t.path + ".tmp"
	if os.WriteFile(tmp, b, 0o600) == nil {
		_ = os.Rename(tmp, t.path)
	}
}

// restore reopens the tabs a previous browser had open, and reports
// whether there were any.
func (t *tabState) restore(ctx context.Context, sess *browser.Session, log *slog.Logger) bool {
	if t.path == "" {
		return false
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		return false
	}
	var urls []string
	if json.Unmarshal(b, &urls) != nil || len(urls) == 0 {
		return false
	}
	var actions []browser.Action
	for i, u := range urls {
		if u == "" || u == "about:blank" {
			continue
		}
		if i == 0 {
			actions = append(actions, browser.Action{Type: "navigate", URL: u})
		} else {
			actions = append(actions, browser.Action{Type: "new_tab", URL: u})
		}
	}
	if len(urls) > 1 {
		actions = append(actions, browser.Action{Type: "switch_tab", Index: ptrInt(0)})
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := sess.Do(rctx, actions)
	log.Info("restored tabs after a restart", "tabs", len(urls), "results", len(res), "err", err)
	return true
}

func ptrInt(i int) *int { return &i }

// daemonFunc is a daemon's handler that returns its error instead of
// writing it.
type daemonFunc func(w http.ResponseWriter, r *http.Request) error

// handle registers f on mux: the one place where the browser's and the
// desktop's daemons turn a failure into an answer (writeFault).
func handle(mux *http.ServeMux, pattern string, f daemonFunc) {
	mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if err := f(w, r); err != nil {
			writeFault(w, err)
		}
	})
}
