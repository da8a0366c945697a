package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// These tests check the client's own policy — which calls are retried, how
// error bodies and transport failures are classified — against a server
// that answers with canned statuses. The behaviour of the real server is
// covered end to end in client_test.go.

// fastRetry is the default policy with pauses short enough for tests.
var fastRetry = RetryPolicy{Attempts: 3, BaseDelay: time.Millisecond, MaxDelay: 2 * time.Second, AttemptTimeout: 5 * time.Second}

type canned struct {
	status int
	body   string
	header map[string]string
}

const (
	envUnavailable = `{"detail":"Service temporarily overloaded, please retry","error":{"category":"unavailable","source":"platform","code":"platform.store_unavailable","message":"Service temporarily overloaded, please retry","retryable":true}}`
	envInternal    = `{"detail":"boom","error":{"category":"internal","source":"platform","code":"platform.internal","message":"internal error","retryable":false}}`
	envWaitTimeout = `{"detail":"Sandbox s1 did not become ready within 1s","error":{"category":"timeout","source":"sandbox","code":"sandbox.wait_timeout","message":"Sandbox s1 did not become ready within 1s","retryable":true}}`
)

// cannedServer answers the n-th request with responses[n] (the last one
// repeats) and counts requests.
func cannedServer(t *testing.T, responses ...canned) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(hits.Add(1)) - 1
		resp := responses[min(n, len(responses)-1)]
		for k, v := range resp.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.status)
		_, _ = io.WriteString(w, resp.body)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

var ok200 = canned{status: 200, body: `{"status":"ok","sandbox_id":"s1","job_id":"j1","stdout":"","stderr":"","created_at":1,"command":"true","exit_code":0,"success":true,"path":"/x","size":0,"content":"","files":[],"sandboxes":[]}`}

// calls are one of each kind of request, with whether the client may
// repeat it.
var calls = []struct {
	name       string
	idempotent bool
	do         func(ctx context.Context, c *Client) error
}{
	{"get sandbox", true, func(ctx context.Context, c *Client) error { _, err := c.GetSandbox(ctx, "s1"); return err }},
	{"list sandboxes", true, func(ctx context.Context, c *Client) error { _, err := c.ListSandboxes(ctx, ListOptions{}); return err }},
	{"get job", true, func(ctx context.Context, c *Client) error { _, err := c.GetJob(ctx, "j1"); return err }},
	{"download", true, func(ctx context.Context, c *Client) error { _, err := c.Download(ctx, "s1", "/x"); return err }},
	{"list files", true, func(ctx context.Context, c *Client) error { _, err := c.ListFiles(ctx, "s1", "/"); return err }},
	{"delete", true, func(ctx context.Context, c *Client) error { return c.DeleteSandbox(ctx, "s1") }},
	{"heartbeat", true, func(ctx context.Context, c *Client) error { return c.Heartbeat(ctx, "s1") }},
	{"create", false, func(ctx context.Context, c *Client) error {
		_, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host"})
		return err
	}},
	{"exec", false, func(ctx context.Context, c *Client) error {
		_, err := c.Exec(ctx, "s1", api.ExecRequest{Command: Command("true"), Wait: true})
		return err
	}},
	{"exec no wait", false, func(ctx context.Context, c *Client) error {
		_, err := c.ExecNoWait(ctx, "s1", api.ExecRequest{Command: Command("true")})
		return err
	}},
	{"upload", false, func(ctx context.Context, c *Client) error {
		_, err := c.Upload(ctx, "s1", "/x", []byte("x"))
		return err
	}},
	{"apply patch", false, func(ctx context.Context, c *Client) error { _, err := c.ApplyPatch(ctx, "s1", "diff", 0); return err }},
}

func TestRetryOnlyIdempotentCalls(t *testing.T) {
	t.Parallel()
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, hits := cannedServer(t, canned{status: 503, body: envUnavailable}, ok200)
			c := New(srv.URL, "k", WithRetryPolicy(fastRetry))
			err := tc.do(context.Background(), c)
			if tc.idempotent {
				if err != nil || hits.Load() != 2 {
					t.Fatalf("503 then 200: err %v after %d requests, want success after 2", err, hits.Load())
				}
				return
			}
			if hits.Load() != 1 {
				t.Fatalf("%d requests, want 1: a call that starts work must not be repeated", hits.Load())
			}
			f := faults.Of(err)
			if f.Category != faults.Unavailable || f.Code != faults.CodeStoreUnavailable || !f.Retryable || f.Status != 503 {
				t.Fatalf("err = %+v, want the server's unavailable classification with status 503", f)
			}
		})
	}
}

func TestRetryStops(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		responses []canned
		policy    RetryPolicy
		call      func(ctx context.Context, c *Client) error
		wantHits  int32
		wantCode  string
	}{
		{"attempts exhausted", []canned{{status: 503, body: envUnavailable}}, fastRetry,
			func(ctx context.Context, c *Client) error { _, err := c.GetSandbox(ctx, "s1"); return err }, 3, faults.CodeStoreUnavailable},
		{"not retryable", []canned{{status: 500, body: envInternal}}, fastRetry,
			func(ctx context.Context, c *Client) error { _, err := c.GetSandbox(ctx, "s1"); return err }, 1, faults.CodeInternal},
		{"not found", []canned{{status: 404, body: `{"detail":"Sandbox s1 not found"}`}}, fastRetry,
			func(ctx context.Context, c *Client) error { _, err := c.GetSandbox(ctx, "s1"); return err }, 1, faults.CodeSandboxNotFound},
		{"wait timeout is the caller's budget", []canned{{status: 408, body: envWaitTimeout}}, fastRetry,
			func(ctx context.Context, c *Client) error {
				_, err := c.WaitSandbox(ctx, "s1", time.Second)
				return err
			}, 1, faults.CodeWaitTimeout},
		{"retry-after beyond the policy", []canned{{status: 503, body: envUnavailable, header: map[string]string{"Retry-After": "30"}}, ok200}, fastRetry,
			func(ctx context.Context, c *Client) error { _, err := c.GetSandbox(ctx, "s1"); return err }, 1, faults.CodeStoreUnavailable},
		{"retries disabled", []canned{{status: 503, body: envUnavailable}, ok200}, RetryPolicy{Attempts: 1},
			func(ctx context.Context, c *Client) error { _, err := c.GetSandbox(ctx, "s1"); return err }, 1, faults.CodeStoreUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, hits := cannedServer(t, tc.responses...)
			err := tc.call(context.Background(), New(srv.URL, "k", WithRetryPolicy(tc.policy)))
			if !faults.Is(err, tc.wantCode) {
				t.Errorf("err = %v (%s), want code %s", err, faults.Of(err).Code, tc.wantCode)
			}
			if hits.Load() != tc.wantHits {
				t.Errorf("%d requests, want %d", hits.Load(), tc.wantHits)
			}
		})
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	srv, hits := cannedServer(t, canned{status: 503, body: envUnavailable, header: map[string]string{"Retry-After": "1"}}, ok200)
	start := time.Now()
	if _, err := New(srv.URL, "k", WithRetryPolicy(fastRetry)).GetSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < time.Second || hits.Load() != 2 {
		t.Fatalf("retried after %s with %d requests; want ≥ 1s (Retry-After) and 2", d, hits.Load())
	}
}

func TestRetryRespectsContext(t *testing.T) {
	t.Parallel()
	srv, hits := cannedServer(t, canned{status: 503, body: envUnavailable})
	slow := RetryPolicy{Attempts: 3, BaseDelay: time.Minute, MaxDelay: time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := New(srv.URL, "k", WithRetryPolicy(slow)).GetSandbox(ctx, "s1")
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s: a pause longer than the caller's deadline must not be slept", d)
	}
	if !faults.Is(err, faults.CodeStoreUnavailable) || hits.Load() != 1 {
		t.Fatalf("err %v after %d requests; want the server's error after 1", err, hits.Load())
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{Attempts: 5, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}
	for _, tc := range []struct {
		n          int
		retryAfter time.Duration
		lo, hi     time.Duration
		ok         bool
	}{
		{1, 0, 50 * time.Millisecond, 100 * time.Millisecond, true},
		{2, 0, 100 * time.Millisecond, 200 * time.Millisecond, true},
		{3, 0, 200 * time.Millisecond, 400 * time.Millisecond, true},
		{10, 0, 500 * time.Millisecond, time.Second, true},
		{200, 0, 500 * time.Millisecond, time.Second, true}, // shift overflow
		{1, 700 * time.Millisecond, 700 * time.Millisecond, 700 * time.Millisecond, true},
		{1, 2 * time.Second, 0, 0, false},
	} {
		for range 50 {
			d, ok := p.backoff(tc.n, tc.retryAfter)
			if ok != tc.ok || (ok && (d < tc.lo || d > tc.hi)) {
				t.Fatalf("backoff(%d, %s) = %s, %v; want [%s, %s], %v", tc.n, tc.retryAfter, d, ok, tc.lo, tc.hi, tc.ok)
			}
		}
	}
}

func TestDecodeError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		status    int
		body      string
		category  faults.Category
		source    faults.Source
		code      string
		retryable bool
		message   string
	}{
		{"envelope", 404, `{"detail":"Sandbox s1 not found","error":{"category":"not_found","source":"client","code":"sandbox.not_found","message":"Sandbox s1 not found","retryable":false}}`,
			faults.NotFound, faults.Client, faults.CodeSandboxNotFound, false, "Sandbox s1 not found"},
		{"envelope retryable", 503, envUnavailable, faults.Unavailable, faults.Platform, faults.CodeStoreUnavailable, true, "Service temporarily overloaded, please retry"},
		{"missing key", 401, `{"detail":"Missing API key. Please provide X-API-Key header."}`,
			faults.Unauthenticated, faults.Client, faults.CodeUnauthenticated, false, "Missing API key. Please provide X-API-Key header."},
		{"invalid key", 403, `{"detail":"Invalid API key"}`, faults.PermissionDenied, faults.Client, faults.CodeForbidden, false, "Invalid API key"},
		{"sandbox not found", 404, `{"detail":"Sandbox abc not found"}`, faults.NotFound, faults.Client, faults.CodeSandboxNotFound, false, "Sandbox abc not found"},
		{"agent not ready", 404, `{"detail":"Sandbox abc agent not ready"}`, faults.NotFound, faults.Sandbox, faults.CodeAgentNotReady, false, "Sandbox abc agent not ready"},
		{"job not found", 404, `{"detail":"Job j not found"}`, faults.NotFound, faults.Client, faults.CodeJobNotFound, false, "Job j not found"},
		{"file not found", 404, `{"detail":"File not found: /x"}`, faults.NotFound, faults.Client, faults.CodeFileNotFound, false, "File not found: /x"},
		{"path not found", 404, `{"detail":"Path not found: /x"}`, faults.NotFound, faults.Client, faults.CodePathNotFound, false, "Path not found: /x"},
		{"route not found", 404, `{"detail":"Not Found"}`, faults.NotFound, faults.Client, faults.CodeRouteNotFound, false, "Not Found"},
		{"not ready", 400, `{"detail":"Sandbox abc is not ready"}`, faults.InvalidRequest, faults.Sandbox, faults.CodeSandboxNotReady, false, "Sandbox abc is not ready"},
		{"wait timeout", 408, `{"detail":"Sandbox abc did not become ready within 5s"}`, faults.Timeout, faults.Sandbox, faults.CodeWaitTimeout, true, "Sandbox abc did not become ready within 5s"},
		{"validation list", 422, `{"detail":[{"type":"missing","loc":["body","image"],"msg":"Field required","input":{}}]}`,
			faults.InvalidRequest, faults.Client, faults.CodeValidation, false, "body.image: Field required"},
		{"overloaded", 503, `{"detail":"Service temporarily overloaded, please retry: 429"}`, faults.Unavailable, faults.Platform, faults.CodeUnreachable, true, "Service temporarily overloaded, please retry: 429"},
		{"orchard env panic body", 500, `{"error":"Internal server error","detail":"division by zero","request_id":"r"}`,
			faults.Internal, faults.Platform, faults.CodeInternal, false, "division by zero"},
		{"panic body with info", 500, `{"error":"Internal server error","detail":"x","request_id":"r","error_info":{"category":"internal","source":"platform","code":"platform.internal","message":"internal error","retryable":false}}`,
			faults.Internal, faults.Platform, faults.CodeInternal, false, "internal error"},
		{"proxy page", 502, `<html>bad gateway</html>`, faults.Unavailable, faults.Platform, faults.CodeUnreachable, true, "HTTP 502 Bad Gateway: <html>bad gateway</html>"},
		{"empty body", 504, ``, faults.Timeout, faults.Platform, faults.CodeTimeout, true, "HTTP 504 Gateway Timeout"},
		{"too many requests", 429, `{"detail":"slow down"}`, faults.Capacity, faults.Platform, faults.CodeCapacity, true, "slow down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := decodeError(tc.status, []byte(tc.body))
			if e.Category != tc.category || e.Source != tc.source || e.Code != tc.code || e.Retryable != tc.retryable || e.Message != tc.message {
				t.Errorf("decodeError(%d, %s) = {%s %s %s retryable=%v %q}; want {%s %s %s retryable=%v %q}",
					tc.status, tc.body, e.Category, e.Source, e.Code, e.Retryable, e.Message,
					tc.category, tc.source, tc.code, tc.retryable, tc.message)
			}
			if e.StatusOf() != tc.status {
				t.Errorf("status %d, want %d", e.StatusOf(), tc.status)
			}
		})
	}
}

func TestUnauthenticatedOverHTTP(t *testing.T) {
	t.Parallel()
	var gotKey string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotKey = r.Header.Get("X-API-Key")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"detail":"Missing API key. Please provide X-API-Key header."}`)
	}))
	defer srv.Close()
	_, err := New(srv.URL+"/", "").GetSandbox(context.Background(), "s1")
	var fe *faults.Error
	if !errors.As(err, &fe) || fe.Category != faults.Unauthenticated || fe.Code != faults.CodeUnauthenticated || fe.Retryable {
		t.Fatalf("err = %#v, want unauthenticated, not retryable", err)
	}
	if gotKey != "" {
		t.Fatalf("X-API-Key %q sent without a key", gotKey)
	}
}

// flakyListener accepts connections and drops them before answering.
func flakyListener(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			buf := make([]byte, 4096)
			_, _ = c.Read(buf) // let the request arrive, then hang up
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return "http://" + ln.Addr().String(), &conns
}

func TestTransportErrors(t *testing.T) {
	t.Parallel()
	refused := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		return "http://" + addr
	}
	check := func(t *testing.T, err error) {
		t.Helper()
		f := faults.Of(err)
		if f.Category != faults.Unavailable || f.Source != faults.Platform || f.Code != faults.CodeUnreachable || !f.Retryable {
			t.Fatalf("err = %v {%s %s %s %v}; want unavailable/platform/platform.unreachable/retryable", err, f.Category, f.Source, f.Code, f.Retryable)
		}
		if !strings.Contains(err.Error(), "unreachable") {
			t.Fatalf("message %q does not say the server is unreachable", err)
		}
	}
	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		_, err := New(refused(t), "k", WithRetryPolicy(fastRetry)).GetSandbox(context.Background(), "s1")
		check(t, err)
	})
	t.Run("hang up on GET is retried", func(t *testing.T) {
		t.Parallel()
		url, conns := flakyListener(t)
		_, err := New(url, "k", WithRetryPolicy(fastRetry)).GetSandbox(context.Background(), "s1")
		check(t, err)
		// net/http itself replays an idempotent request once on a reused
		// connection; on fresh ones each attempt is one connection.
		if n := conns.Load(); n < 3 {
			t.Fatalf("%d connections, want ≥ 3 attempts", n)
		}
	})
	t.Run("hang up on exec is not retried", func(t *testing.T) {
		t.Parallel()
		url, conns := flakyListener(t)
		_, err := New(url, "k", WithRetryPolicy(fastRetry)).Exec(context.Background(), "s1",
			api.ExecRequest{Command: Command("true"), Wait: true})
		check(t, err)
		if n := conns.Load(); n != 1 {
			t.Fatalf("%d connections, want 1: exec must not be repeated", n)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := New(refused(t), "k").GetSandbox(ctx, "s1")
		if f := faults.Of(err); f.Category != faults.Canceled || !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v (%s), want canceled wrapping context.Canceled", err, f.Category)
		}
	})
}

func TestAttemptTimeout(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer srv.Close()
	p := fastRetry
	p.AttemptTimeout = 50 * time.Millisecond
	_, err := New(srv.URL, "k", WithRetryPolicy(p)).GetSandbox(context.Background(), "s1")
	if f := faults.Of(err); f.Category != faults.Timeout || f.Code != faults.CodeTimeout || hits.Load() != 3 {
		t.Fatalf("err = %v (%s %s) after %d requests; want platform.timeout after 3", err, f.Category, f.Code, hits.Load())
	}
}

func TestResponseBound(t *testing.T) {
	t.Parallel()
	srv, _ := cannedServer(t, canned{status: 200, body: `{"path":"/x","content":"` + strings.Repeat("A", 4096) + `","size":3072}`})
	_, err := New(srv.URL, "k", WithMaxResponseBytes(1024)).Download(context.Background(), "s1", "/x")
	if !faults.Is(err, faults.CodeResponseTooLarge) {
		t.Fatalf("err = %v, want %s", err, faults.CodeResponseTooLarge)
	}
}

// TestExecKeepsWaiting: a waiting exec whose server-side wait ended before
// the job did goes on waiting through the job wait endpoint.
func TestExecKeepsWaiting(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paths []string
	var waits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/sandboxes/s1/exec":
			_, _ = io.WriteString(w, `{"job_id":"j1","sandbox_id":"s1","command":"sleep 1","status":"running","stdout":"","stderr":"","exit_code":null,"created_at":1}`)
		case r.URL.Path == "/jobs/j1/wait" && waits.Add(1) < 3:
			_, _ = io.WriteString(w, `{"job_id":"j1","sandbox_id":"s1","command":"sleep 1","status":"running","stdout":"a","stderr":"","exit_code":null,"created_at":1}`)
		case r.URL.Path == "/jobs/j1/wait":
			_, _ = io.WriteString(w, `{"job_id":"j1","sandbox_id":"s1","command":"sleep 1","status":"failed","stdout":"ab","stderr":"","exit_code":3,"created_at":1}`)
		default:
			w.WriteHeader(404)
			_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
		}
	}))
	defer srv.Close()
	job, err := New(srv.URL, "k").Exec(context.Background(), "s1", api.ExecRequest{Command: Command("sleep 1"), Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if job.Status != api.JobFailed || job.ExitCode == nil || *job.ExitCode != 3 || job.Stdout != "ab" {
		t.Fatalf("job = %+v, want the terminal state", job)
	}
	want := "POST /sandboxes/s1/exec,GET /jobs/j1/wait,GET /jobs/j1/wait,GET /jobs/j1/wait"
	if got := strings.Join(paths, ","); got != want {
		t.Fatalf("requests %s, want %s", got, want)
	}
}
