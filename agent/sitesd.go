package agent

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"
)

// `orchard-agent sites` serves the offline sites inside a sandbox. A
// task's setup runs it as an exec job, which waits for the command to
// exit and kills the job's process group when it ends; so the command
// starts the server detached — a new session, stdio on /dev/null — waits
// until it answers, and exits. The server is then an orphan that the
// agent (PID 1) reaps whenever it ends.

const (
	// sitesStartTimeout bounds the wait for the detached server to answer:
	// it only has to bind and serve embedded files, but a loaded machine
	// can delay a fresh process by seconds.
	sitesStartTimeout = 20 * time.Second
	// sitesProbeTimeout bounds one readiness probe of the address.
	sitesProbeTimeout = time.Second
	// sitesShutdownTimeout bounds the drain of open requests at SIGTERM.
	sitesShutdownTimeout = 2 * time.Second
)

// SitesMain is `orchard-agent sites [--addr HOST:PORT] [--foreground]`:
// it serves h on addr in a detached process and returns once the address
// answers with the marker header. When the address already answers with
// the marker it returns at once; when something else holds the address it
// fails. With --foreground it serves in this process until ctx ends.
func SitesMain(ctx context.Context, args []string, h http.Handler, marker string) error {
	fs := flag.NewFlagSet("orchard-agent sites", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8100", "address to serve the sites on")
	fg := fs.Bool("foreground", false, "serve in this process instead of detaching")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *fg {
		return serveSites(ctx, *addr, h)
	}
	switch probeSites(ctx, *addr, marker) {
	case probeServing:
		return nil
	case probeOther:
		return fmt.Errorf("sites: %s is already in use by another server", *addr)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("sites: %w", err)
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("sites: %w", err)
	}
	defer devnull.Close()
	p, err := os.StartProcess(exe, []string{exe, "sites", "--addr", *addr, "--foreground"}, &os.ProcAttr{
		Dir:   "/",
		Env:   os.Environ(),
		Files: []*os.File{devnull, devnull, devnull},
		// Its own session: outside the exec job's process group, which
		// is killed when the job ends, and without a controlling terminal.
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return fmt.Errorf("sites: start server: %w", err)
	}
	exited := make(chan error, 1)
	go func() {
		st, err := p.Wait()
		if err == nil {
			err = fmt.Errorf("server exited: %s", st)
		}
		exited <- err
	}()
	deadline := time.NewTimer(sitesStartTimeout)
	defer deadline.Stop()
	for {
		// A concurrent call may have won the address: its server counts.
		if probeSites(ctx, *addr, marker) == probeServing {
			return nil
		}
		select {
		case err := <-exited:
			if probeSites(ctx, *addr, marker) == probeServing {
				return nil
			}
			return fmt.Errorf("sites: %w (is %s free?)", err, *addr)
		case <-deadline.C:
			_ = p.Kill()
			return fmt.Errorf("sites: no answer on %s after %s", *addr, sitesStartTimeout)
		case <-ctx.Done():
			_ = p.Kill()
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

type probeResult int

const (
	probeFree    probeResult = iota // nothing accepts connections
	probeServing                    // the sites answer
	probeOther                      // something else holds the address
)

// probeSites asks addr for / and looks for the marker header.
func probeSites(ctx context.Context, addr, marker string) probeResult {
	ctx, cancel := context.WithTimeout(ctx, sitesProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, "http://"+addr+"/", nil)
	if err != nil {
		return probeOther
	}
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		// Refused, or accepted without an HTTP answer in time (a server
		// still starting): either way not serving yet.
		return probeFree
	}
	resp.Body.Close()
	if resp.Header.Get(marker) != "" {
		return probeServing
	}
	return probeOther
}

// serveSites serves h on addr until ctx ends.
func serveSites(ctx context.Context, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("sites: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), sitesShutdownTimeout)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}
