package agentclient

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/orchard/orchard/agent"
	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/faults"
)

var testLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// countingListener counts the connections an agent accepts.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// serveAgent serves a real agent, rooted in a temporary directory, on ln
// until the test ends.
func serveAgent(t *testing.T, ln net.Listener) {
	t.Helper()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + t.TempDir()}
	srv, err := agent.New(agent.Config{Root: t.TempDir(), Env: env, Logger: testLogger})
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// startAgent serves an agent on a unix socket and returns a client of it
// and the listener, which counts connections.
func startAgent(t *testing.T) (*Client, *countingListener) {
	t.Helper()
	// Socket paths are limited to 108 bytes; t.TempDir's can be longer.
	dir, err := os.MkdirTemp("", "agentclient")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	serveAgent(t, cl)
	c := NewClient("unix:" + sock)
	t.Cleanup(c.Close)
	return c, cl
}

func wantFault(t *testing.T, err error, status int, cat faults.Category, code string) *faults.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s", code)
	}
	var e *faults.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *faults.Error", err, err)
	}
	if e.StatusOf() != status || e.Category != cat || e.Code != code {
		t.Fatalf("error = %d %s %s (%q), want %d %s %s", e.StatusOf(), e.Category, e.Code, e.Message, status, cat, code)
	}
	return e
}

func TestClientErrors(t *testing.T) {
	t.Parallel()
	a, _ := startAgent(t)

	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		c := NewClient("unix:" + filepath.Join(t.TempDir(), "none.sock"))
		defer c.Close()
		_, err := c.Health(context.Background())
		e := wantFault(t, err, 503, faults.Unavailable, faults.CodeAgentUnreachable)
		if e.Source != faults.Sandbox || !e.Retryable {
			t.Fatalf("unreachable = %+v, want source sandbox, retryable", e)
		}
	})
	t.Run("canceled is not unreachable", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := a.Health(ctx)
		wantFault(t, err, 499, faults.Canceled, faults.CodeCanceled)
	})
	t.Run("bad address", func(t *testing.T) {
		t.Parallel()
		c := NewClient("tcp://x")
		defer c.Close()
		_, err := c.Health(context.Background())
		wantFault(t, err, 500, faults.Internal, faults.CodeMisconfigured)
	})
	t.Run("envelope decoded with status", func(t *testing.T) {
		t.Parallel()
		_, err := a.Download(context.Background(), "/missing")
		e := wantFault(t, err, 404, faults.NotFound, faults.CodeFileNotFound)
		if e.Message != "File not found: /missing" {
			t.Fatalf("message = %q", e.Message)
		}
	})
	t.Run("body too large", func(t *testing.T) {
		t.Parallel()
		_, err := a.Exec(context.Background(), api.AgentExecRequest{Command: strings.Repeat("x", 16<<20+1)}, nil)
		wantFault(t, err, 413, faults.TooLarge, faults.CodeTooLarge)
	})
	t.Run("unknown route", func(t *testing.T) {
		t.Parallel()
		err := a.getJSON(context.Background(), "x", "GET", "/nope", nil, new(any))
		wantFault(t, err, 404, faults.NotFound, faults.CodeRouteNotFound)
	})
	t.Run("wrong method", func(t *testing.T) {
		t.Parallel()
		err := a.getJSON(context.Background(), "x", "POST", "/health", struct{}{}, new(any))
		wantFault(t, err, 405, faults.InvalidRequest, faults.CodeMethodNotAllowed)
	})
	t.Run("http address", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		serveAgent(t, ln)
		c := NewClient("http://" + ln.Addr().String() + "/")
		defer c.Close()
		if _, err := c.Health(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestExecReusesConnection checks that an exec leaves its connection to the
// pool: a client that stopped at the exit event used to find the response
// unfinished and drop the connection, so a third of execs paid a new dial.
func TestExecReusesConnection(t *testing.T) {
	t.Parallel()
	a, ln := startAgent(t)
	for _, cmd := range []string{"true", "echo hi", "/bin/true", "echo x; sleep 0.01; echo y >&2", "exit 3"} {
		t.Run(cmd, func(t *testing.T) {
			for range 10 {
				if _, err := a.Exec(context.Background(), api.AgentExecRequest{Command: cmd}, nil); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	if n := ln.n.Load(); n != 1 {
		t.Errorf("%d connections for 50 execs, want 1", n)
	}
}

// An agent that listens on a network answers only requests with its
// token; a client whose address carries the token sends it on every kind
// of call: JSON, exec streams, WebSockets, forwarded requests and raw
// upgrades.
func TestTokenAuth(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const token = "s3cret-token"
	sum := sha256.Sum256([]byte(token))
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + t.TempDir()}
	srv, err := agent.New(agent.Config{Root: t.TempDir(), Env: env, Logger: testLogger, TokenSHA256: sum[:]})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })
	host := ln.Addr().String()

	good := NewClient("http://orchard:" + token + "@" + host)
	defer good.Close()
	for _, c := range []struct {
		name string
		addr string
	}{{"no token", "http://" + host}, {"wrong token", "http://orchard:nope@" + host}} {
		t.Run(c.name, func(t *testing.T) {
			bad := NewClient(c.addr)
			defer bad.Close()
			if _, err := bad.Health(t.Context()); err != nil {
				t.Errorf("health without the token: %v (it is public)", err)
			}
			_, err := bad.Exec(t.Context(), api.AgentExecRequest{Command: "true"}, nil)
			wantFault(t, err, 403, faults.PermissionDenied, faults.CodeForbidden)
			_, err = bad.List(t.Context(), "/")
			wantFault(t, err, 403, faults.PermissionDenied, faults.CodeForbidden)
			if _, _, err := bad.DialPTY(t.Context(), nil); err == nil {
				t.Error("PTY opened without the token")
			}
			base, rt := bad.HTTP()
			req, _ := http.NewRequestWithContext(t.Context(), "GET", base.String()+"/files/list?path=/", nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 403 {
				t.Errorf("forwarded request without the token: %d, want 403", resp.StatusCode)
			}
		})
	}

	exit, err := good.Exec(t.Context(), api.AgentExecRequest{Command: "echo hi"}, nil)
	if err != nil || exit.ExitCode != 0 {
		t.Fatalf("exec with the token: %+v %v", exit, err)
	}
	if _, err := good.List(t.Context(), "/"); err != nil {
		t.Fatalf("list with the token: %v", err)
	}
	conn, _, err := good.DialPTY(t.Context(), nil)
	if err != nil {
		t.Fatalf("PTY with the token: %v", err)
	}
	conn.Close()
	base, rt := good.HTTP()
	if base.User != nil {
		t.Errorf("HTTP base %s keeps the credentials", base.Redacted())
	}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", base.String()+"/files/list?path=/", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("forwarded request with the token: %d", resp.StatusCode)
	}
	raw, hdr, err := DialRaw(t.Context(), "http://orchard:"+token+"@"+host)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if got := hdr.Get("Authorization"); got != "Bearer "+token {
		t.Errorf("DialRaw header = %q", got)
	}
	// The agent has no egress proxy: an authorized upgrade reaches the
	// handler (and is refused there), an unauthorized one does not.
	if _, err := egress.Upgrade(t.Context(), raw, egress.TunnelProtocol, hdr); err == nil || strings.Contains(err.Error(), "403") {
		t.Errorf("authorized upgrade: %v, want the handler's refusal", err)
	}
	raw2, _, err := DialRaw(t.Context(), "http://"+host)
	if err != nil {
		t.Fatal(err)
	}
	defer raw2.Close()
	if _, err := egress.Upgrade(t.Context(), raw2, egress.TunnelProtocol, nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("unauthorized upgrade: %v, want 403", err)
	}
}
