package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/sync/errgroup"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/tasks"
)

// hangUpTimeout bounds one connection of a hang-up: dial, request, the
// first bytes of the answer. Long because the machines that run the
// suite are busy; a hang-up that takes it is reported, not waited out.
const hangUpTimeout = 30 * time.Second

// Every write the server makes to a connection its peer has reset fails
// with EPIPE, and the kernel raises SIGPIPE for it, whichever socket it
// was. None of that may stop `orchard serve`: clients that hang up on
// every kind of route (plain answers, long polls, streams, WebSockets, the
// DevTools proxy) and a site that resets what sandboxes send it leave the
// server answering. The real binary runs, as its signal handling is
// main's.
func TestServeSurvivesResetConnections(t *testing.T) {
	testenv.RequireChromium(t)
	sitePort := testenv.ResettingSite(t)
	p := testserver.StartProcess(t, testserver.ProcessOptions{Env: []string{
		"EGRESS_ALLOW_PRIVATE=127.0.0.1/32", "EGRESS_HOSTS=reset.test=127.0.0.1",
		// Every reset is a failure of the site; an open breaker would
		// answer the sandboxes itself and spare the server its writes.
		"SITE_BREAKER_FAILURES=1000000",
	}})
	ctx := t.Context()
	c := client.New(p.URL, p.APIKey)
	site := "reset.test:" + strconv.Itoa(sitePort)

	// A shell sandbox and an episode (a browser sandbox, recorded), both
	// allowed to reach the site.
	var shell string
	var ep api.EpisodeStart
	var g errgroup.Group
	g.Go(func() error {
		cr, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host", BlockNetwork: client.Ptr(false),
			Memory: client.Ptr("512Mi"), Egress: &api.Egress{Allow: []string{"reset.test"}}})
		if err != nil {
			return err
		}
		shell = cr.SandboxID
		_, err = c.WaitSandbox(ctx, shell, 2*time.Minute)
		return err
	})
	g.Go(func() (err error) {
		task := &tasks.Task{ID: "hang-ups", Question: "Look.", StartURL: "data:text/html,<title>hang-ups</title><p>hello",
			Eval: &tasks.Eval{Type: "answer_match", References: []string{"hello"}}}
		raw, err := json.Marshal(task)
		if err != nil {
			return err
		}
		ep, err = c.CreateEpisode(ctx, api.CreateEpisodeRequest{Task: raw,
			Sandbox: json.RawMessage(`{"block_network": false, "egress": {"allow": ["reset.test"]}}`)})
		return err
	})
	if err := g.Wait(); err != nil {
		t.Fatalf("set up: %v", err)
	}
	big := "/tmp/big"
	if j, err := c.Exec(ctx, shell, api.ExecRequest{Command: client.Command("head -c 4000000 /dev/urandom > " + big), Wait: true}); err != nil || j.Status != api.JobSucceeded {
		t.Fatalf("write %s: %+v %v", big, j, err)
	}
	host := strings.TrimPrefix(p.URL, "http://")
	keyed := http.Header{"X-API-Key": {p.APIKey}}
	get := func(path string, h http.Header, read int) func() error {
		return func() error { return requestThenReset(host, path, h, read) }
	}
	wsURL := "ws://" + host

	for _, tc := range []struct {
		name   string
		n, par int
		hangUp func() error
		// setUp, when set, runs once before the hang-ups and returns the
		// hang-up (what it needs is made in the subtest).
		setUp func(t *testing.T) func() error
		// settle is how long the server still answers the connections
		// after the last hang-up.
		settle time.Duration
	}{
		{name: "list without a key", n: 600, par: 8, hangUp: get("/sandboxes", nil, 0)},
		{name: "list with a key", n: 600, par: 8, hangUp: get("/sandboxes", keyed, 0)},
		{name: "openapi mid-answer", n: 200, par: 8, hangUp: get("/openapi.json", nil, 1024)},
		{name: "download mid-answer", n: 30, par: 3, hangUp: get("/sandboxes/"+shell+"/files?path="+big, keyed, 4096)},
		{name: "job wait", n: 200, par: 50, setUp: func(t *testing.T) func() error {
			// The server answers when the poll times out, a second after
			// the client has gone.
			job, err := c.ExecNoWait(ctx, shell, api.ExecRequest{Command: client.Command("sleep 60")})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = c.CancelJob(context.WithoutCancel(ctx), job) })
			return get("/jobs/"+url.PathEscape(job)+"/wait?timeout=1", keyed, 0)
		}, settle: 2 * time.Second},
		{name: "pty", n: 40, par: 4, hangUp: func() error {
			ws, _, err := wsDialer.Dial(wsURL+"/sandboxes/"+shell+"/exec/pty?api_key="+p.APIKey, nil)
			if err != nil {
				return fmt.Errorf("dial pty: %w", err)
			}
			init := map[string]any{"type": "init", "cmd": []string{"sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' a"}, "rows": 24, "cols": 80}
			if err := ws.WriteJSON(init); err != nil {
				testenv.Reset(ws.NetConn())
				return err
			}
			// Hung up with the output streaming.
			_ = ws.SetReadDeadline(time.Now().Add(hangUpTimeout))
			_, _, err = ws.ReadMessage()
			testenv.Reset(ws.NetConn())
			return err
		}},
		{name: "egress from a shell sandbox", n: 1, par: 1, hangUp: func() error {
			// Uploads (the server writes to the site after its reset) and
			// CONNECT tunnels (it writes the TLS hello).
			cmd := fmt.Sprintf(`head -c 262144 /dev/zero > /tmp/up; for i in $(seq 30); do
				curl -s -o /dev/null -m 10 --data-binary @/tmp/up http://%[1]s/
				curl -s -o /dev/null -m 10 -k https://%[1]s/
			done; echo done`, site)
			j, err := c.Exec(ctx, shell, api.ExecRequest{Command: client.Command(cmd), TimeoutSeconds: client.Ptr(120), Wait: true})
			if err != nil || j.Stdout != "done\n" {
				return fmt.Errorf("curls through the egress proxy: %+v %v", j, err)
			}
			return nil
		}},
		{name: "egress from a browser", n: 10, par: 1, hangUp: func() error {
			// The navigation fails (the site reset it); the server must not.
			nav := api.BrowserActionsRequest{Actions: []api.BrowserAction{{Type: "navigate", URL: "http://" + site + "/"}}}
			if _, err := c.BrowserActions(ctx, ep.SandboxID, nav); err != nil && p.Alive() != nil {
				return err
			}
			return nil
		}},
		{name: "devtools", n: 150, par: 4, hangUp: func() error {
			ws, _, err := wsDialer.Dial(wsURL+"/sandboxes/"+ep.SandboxID+"/browser/cdp", keyed)
			if err != nil {
				return fmt.Errorf("dial devtools: %w", err)
			}
			// Hung up with the answer on its way.
			err = ws.WriteJSON(map[string]any{"id": 1, "method": "Browser.getVersion"})
			testenv.Reset(ws.NetConn())
			return err
		}},
		{name: "mjpeg stream", n: 20, par: 2, hangUp: get("/sandboxes/"+ep.SandboxID+"/browser/stream?fps=10", keyed, 8192)},
		{name: "recording export", n: 20, par: 2, setUp: func(t *testing.T) func() error {
			if _, err := c.FinishEpisode(ctx, ep.EpisodeID, client.Ptr("hello")); err != nil {
				t.Fatal(err)
			}
			return get("/recordings/"+ep.EpisodeID+"/export?format=html", keyed, 4096)
		}},
	} {
		ok := t.Run(tc.name, func(t *testing.T) {
			hangUp := tc.hangUp
			if tc.setUp != nil {
				hangUp = tc.setUp(t)
			}
			hangUps(t, tc.n, tc.par, hangUp)
			time.Sleep(tc.settle)
			if err := p.Alive(); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ListSandboxes(ctx, client.ListOptions{}); err != nil {
				t.Fatalf("list sandboxes after the hang-ups: %v", err)
			}
		})
		if !ok && p.Alive() != nil {
			return // the rest would only say it again
		}
	}
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// wsDialer dials the server's WebSockets within hangUpTimeout.
var wsDialer = &websocket.Dialer{HandshakeTimeout: hangUpTimeout}

// requestThenReset sends GET path to the server at host on a connection of
// its own, reads read bytes of the answer (none: it hangs up with the
// request just sent), and resets the connection.
func requestThenReset(host, path string, h http.Header, read int) error {
	req, err := http.NewRequest(http.MethodGet, "http://"+host+path, nil)
	if err != nil {
		return err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	conn, err := net.DialTimeout("tcp", host, hangUpTimeout)
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(hangUpTimeout))
	if err := req.Write(conn); err != nil {
		testenv.Reset(conn)
		return err
	}
	if read > 0 {
		if _, err := io.ReadAtLeast(conn, make([]byte, read), read); err != nil {
			testenv.Reset(conn)
			return fmt.Errorf("GET %s: read %d bytes: %w", path, read, err)
		}
	}
	return testenv.Reset(conn)
}

// hangUps runs hangUp n times, par at once, and fails the test with the
// first errors if any failed.
func hangUps(t *testing.T, n, par int, hangUp func() error) {
	t.Helper()
	var (
		next, failed atomic.Int64
		mu           sync.Mutex // guards errs
		errs         []error
		wg           sync.WaitGroup
	)
	start := time.Now()
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := hangUp(); err != nil {
					failed.Add(1)
					mu.Lock()
					if len(errs) < 3 {
						errs = append(errs, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d hang-ups in %.1fs", n, time.Since(start).Seconds())
	if f := failed.Load(); f > 0 {
		t.Errorf("%d of %d hang-ups failed before their reset: %v", f, n, errors.Join(errs...))
	}
}
