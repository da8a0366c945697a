package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var servingRE = regexp.MustCompile(`serving on (http://[0-9.:]+)`)

// startServe runs `orchard serve` on a free port and returns its URL and
// what it printed; stop cancels it and waits for a clean exit.
func startServe(t *testing.T, stateDir string) (url string, out *syncBuffer, stop func()) {
	t.Helper()
	env := map[string]string{"ORCHARD_AGENT": testenv.AgentBinary(t), "LOG_LEVEL": "WARN"}
	getenv := func(k string) string { return env[k] }
	cfg := defaultConfig(getenv)
	if err := loadEnv(&cfg, getenv, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	cfg.Addr, cfg.StateDir = "127.0.0.1:0", stateDir
	out = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, out) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
			break
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("serve exited early: %v\n%s", err, out)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("serve did not start:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("serve returned %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("serve did not shut down within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return url, out, stop
}

func TestServeGeneratesKeyAndReattachesAfterRestart(t *testing.T) {
	testenv.RequireRoot(t)
	dir := testserver.StateDir(t)
	url, out, stop := startServe(t, dir)
	m := regexp.MustCompile(`shown once\):\n  ([A-Za-z0-9_-]+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no generated key printed:\n%s", out)
	}
	key := m[1]
	if !strings.Contains(out.String(), "SANDBOX_BASE_URL="+url) {
		t.Errorf("no SDK hint printed:\n%s", out)
	}
	ctx := context.Background()
	c := client.New(url, key)
	if _, err := client.New(url, "").Resources(ctx); err == nil {
		t.Fatal("request without a key accepted")
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host", BlockNetwork: client.Ptr(true), Memory: client.Ptr("256Mi")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitSandbox(ctx, sb.SandboxID, time.Minute); err != nil {
		t.Fatal(err)
	}
	stop()

	url2, out2, _ := startServe(t, dir)
	if !strings.Contains(out2.String(), "read from") || strings.Contains(out2.String(), key) {
		t.Errorf("second start must reuse the kept key without printing it:\n%s", out2)
	}
	c2 := client.New(url2, key)
	j, err := c2.Exec(ctx, sb.SandboxID, api.ExecRequest{Command: client.Command("echo again"), Wait: true})
	if err != nil || j.Stdout != "again\n" {
		t.Fatalf("exec after restart: %+v %v", j, err)
	}
	if err := c2.DeleteSandbox(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
}
