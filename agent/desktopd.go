package agent

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/desktop"
	"github.com/orchard/orchard/faults"
)

// A desktop sandbox's X session runs in a child of the agent, the desktop
// daemon (`orchard-agent desktop`), for the reason the browser does: the
// session waits for the processes it starts (Xvfb, the window manager,
// apps), which the agent's PID-1 reaper would otherwise reap first.

// desktopSocket is where the desktop daemon listens, inside the sandbox.
const desktopSocket = api.DesktopDaemonSocket

var desktopDaemon = daemonKind{name: "desktop", code: faults.CodeDesktopXDied, launch: faults.CodeDesktopLaunch, source: faults.Desktop,
	args: func(exe, sock, opts string) []string {
		return []string{exe, "desktop", "--socket", sock, "--options", opts}
	}}

// maxDesktopRequest bounds an actions request: typed text and paths.
const maxDesktopRequest = 4 << 20

// DesktopMain is `orchard-agent desktop --socket PATH --options JSON`: it
// starts the X session and serves the desktop paths until ctx ends.
func DesktopMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("orchard-agent desktop", flag.ContinueOnError)
	sock := fs.String("socket", desktopSocket, "unix socket to serve on")
	optJSON := fs.String("options", "{}", "desktop options (JSON)")
	readyFD := fs.Int("ready-fd", -1, "file descriptor to write a byte to once serving")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ready := readyPipe(*readyFD)
	var o api.DesktopOptions
	if err := json.Unmarshal([]byte(*optJSON), &o); err != nil {
		return fmt.Errorf("desktop options: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "desktop")
	so := desktop.OptionsOf(o)
	so.Logger = log
	sess, err := desktop.Start(ctx, so)
	if err != nil {
		return err
	}
	defer sess.Close()
	vnc := &vncServer{display: sess.Display, log: log}
	defer vnc.stop()
	_ = os.Remove(*sock)
	ln, err := net.Listen("unix", *sock)
	if err != nil {
		return fmt.Errorf("desktop daemon: %w", err)
	}
	srv := &http.Server{Handler: desktopHandler(sess, vnc), ReadHeaderTimeout: readHeaderTimeout}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	signalReady(ready)
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
		return nil
	case err := <-errc:
		return err
	}
}

// desktopHandler serves API.md's desktop paths over one session.
func desktopHandler(sess *desktop.Session, vnc *vncServer) http.Handler {
	mux := http.NewServeMux()
	handle(mux, "GET /health", func(w http.ResponseWriter, r *http.Request) error {
		wd, ht := sess.Size()
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "display": sess.Display(), "width": wd, "height": ht})
		return nil
	})
	handle(mux, "POST /desktop/actions", func(w http.ResponseWriter, r *http.Request) error {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxDesktopRequest))
		if err != nil {
			return faults.Wrap(err, faults.CodeTooLarge, faults.TooLarge, faults.Client, "request body too large")
		}
		// api.DesktopActionsRequest, read in any of the desktop's dialects.
		req, err := desktop.ParseRequest(body)
		if err != nil {
			return err
		}
		res, err := sess.Run(r.Context(), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, res)
		return nil
	})
	handle(mux, "GET /desktop/screenshot", func(w http.ResponseWriter, r *http.Request) error {
		q := r.URL.Query()
		o := desktop.ShotOptions{Format: q.Get("format")}
		for k, dst := range map[string]*int{"quality": &o.Quality, "width": &o.Width, "height": &o.Height} {
			if v := q.Get(k); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 {
					return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "%s must be a non-negative integer", k)
				}
				*dst = n
			}
		}
		shot, err := sess.Screenshot(r.Context(), o)
		if err != nil {
			return err
		}
		h := w.Header()
		h.Set("Content-Type", "image/"+shot.Format)
		h.Set("X-Orchard-Frame", strconv.FormatInt(shot.ID, 10))
		h.Set("X-Orchard-Scale", strconv.FormatFloat(shot.Scale, 'f', -1, 64))
		_, _ = w.Write(shot.Data)
		return nil
	})
	handle(mux, "GET /desktop/cursor", func(w http.ResponseWriter, r *http.Request) error {
		c, err := sess.CursorPosition(r.Context())
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, c)
		return nil
	})
	handle(mux, "GET /desktop/vnc", func(w http.ResponseWriter, r *http.Request) error {
		if err := vnc.serve(w, r); err != nil {
			return err
		}
		return nil
	})
	handle(mux, "GET /desktop/status", func(w http.ResponseWriter, r *http.Request) error {
		st := api.DesktopStatus{Display: sess.Display(), WindowManager: sess.WindowManager()}
		if f, ok := sess.LastFault(); ok {
			info := f.Info()
			st.LastFault, st.LastFaultAt = &info, &f.At
		}
		writeJSON(w, http.StatusOK, st)
		return nil
	})
	return mux
}

// startDesktop starts the desktop daemon and gives every command the
// session's DISPLAY.
func (s *Server) startDesktop(ctx context.Context, opts string) (*browserProc, error) {
	d, err := s.startDaemon(ctx, desktopDaemon, desktopSocket, opts)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: d.proxy.Transport, Timeout: 5 * time.Second}
	resp, err := hc.Get("http://desktop/health")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var h struct {
		Display string `json:"display"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h.Display == "" {
		return nil, fmt.Errorf("desktop daemon: no display in %s", resp.Status)
	}
	s.cfg.Env = append(s.cfg.Env, "DISPLAY="+h.Display)
	return d, nil
}

func (s *Server) handleDesktop(w http.ResponseWriter, r *http.Request) error {
	if s.desktop == nil {
		return faults.Wrap(errNoDesktop, faults.CodeKindUnsupported, faults.InvalidRequest, faults.Client,
			"this sandbox has no desktop (create it with kind \"desktop\")")
	}
	s.desktop.ServeHTTP(w, r)
	return nil
}
