package server_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/server"
)

// TestErrorsEndToEnd sends real failures of every class through the whole
// path — agent or server where they happen, HTTP, the Go client — and
// checks that status, category, source, code and retryability survive, and
// that no internal text (host paths, Go errors) reaches the caller.
func TestErrorsEndToEnd(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{Server: serverConfigSmallBodies()})
	c := client.New(srv.URL, srv.APIKey, client.WithRetryPolicy(client.RetryPolicy{Attempts: 1}))
	bad := client.New(srv.URL, "wrong-key", client.WithRetryPolicy(client.RetryPolicy{Attempts: 1}))
	ctx := context.Background()
	id := createReady(t, srv, map[string]any{"memory": "256Mi"})
	execWait(t, srv, id, map[string]any{"command": "mkdir -p /workspace/dir && ln -s ../../../../etc/passwd /workspace/up"})

	cases := []struct {
		name      string
		do        func() error
		status    int
		category  faults.Category
		source    faults.Source
		code      string
		retryable bool
	}{
		{"unauthenticated", func() error { _, err := client.New(srv.URL, "").GetSandbox(ctx, id); return err },
			401, faults.Unauthenticated, faults.Client, faults.CodeUnauthenticated, false},
		{"permission denied", func() error { _, err := bad.GetSandbox(ctx, id); return err },
			403, faults.PermissionDenied, faults.Client, faults.CodeForbidden, false},
		{"sandbox not found", func() error { _, err := c.GetSandbox(ctx, "nosuch"); return err },
			404, faults.NotFound, faults.Client, faults.CodeSandboxNotFound, false},
		{"conflict", func() error {
			_, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host", SandboxID: client.Ptr(id)})
			return err
		}, 409, faults.Conflict, faults.Client, faults.CodeSandboxExists, false},
		{"validation", func() error {
			_, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host", CPU: client.Ptr("-3")})
			return err
		}, 422, faults.InvalidRequest, faults.Client, faults.CodeValidation, false},
		{"not implemented", func() error {
			_, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host", Kind: "quantum"})
			return err
		}, 501, faults.NotImplemented, faults.Client, faults.CodeKindUnsupported, false},
		{"too large", func() error { _, err := c.Upload(ctx, id, "/workspace/big", make([]byte, 2<<20)); return err },
			413, faults.TooLarge, faults.Client, faults.CodeTooLarge, false},
		{"agent: file not found", func() error { _, err := c.Download(ctx, id, "/workspace/none"); return err },
			404, faults.NotFound, faults.Client, faults.CodeFileNotFound, false},
		{"agent: path escape", func() error { _, err := c.Download(ctx, id, "/workspace/../../../etc/passwd/../../.."); return err },
			0, "", "", "", false},
		{"agent: is a directory", func() error { _, err := c.Download(ctx, id, "/workspace/dir"); return err },
			500, faults.InvalidRequest, faults.Client, faults.CodeIsDirectory, false}, // Orchard answers 500
		{"agent: not a directory", func() error { _, err := c.ListFiles(ctx, id, "/etc/hostname"); return err },
			500, faults.InvalidRequest, faults.Client, faults.CodeNotDirectory, false},
		{"wait timeout", func() error { _, err := c.WaitSandbox(ctx, "nosuch", time.Second); return err },
			404, faults.NotFound, faults.Client, faults.CodeSandboxNotFound, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if err == nil {
				if tc.status == 0 {
					return // confinement may resolve the path inside the sandbox instead
				}
				t.Fatal("no error")
			}
			var fe *faults.Error
			if !errors.As(err, &fe) {
				t.Fatalf("not a classified error: %T %v", err, err)
			}
			if tc.status == 0 {
				if fe.Category != faults.InvalidRequest && fe.Category != faults.NotFound {
					t.Fatalf("escape attempt: %+v", fe)
				}
				return
			}
			if fe.Status != tc.status || fe.Category != tc.category || fe.Source != tc.source || fe.Code != tc.code || fe.Retryable != tc.retryable {
				t.Fatalf("got status=%d category=%s source=%s code=%s retryable=%v (%q), want %d %s %s %s %v",
					fe.Status, fe.Category, fe.Source, fe.Code, fe.Retryable, fe.Message,
					tc.status, tc.category, tc.source, tc.code, tc.retryable)
			}
			for _, leak := range []string{srv.StateDir, "goroutine", ".go:", "os.Root", "openat", "0x"} {
				if strings.Contains(fe.Message, leak) {
					t.Fatalf("message leaks internal text %q: %q", leak, fe.Message)
				}
			}
		})
	}

	// Agent unreachable: a sandbox whose agent died. Exec is retried while
	// the runtime says the sandbox lives, then classified from its death.
	killAgent(t, id)
	j, err := c.Exec(ctx, id, api.ExecRequest{Command: client.Command("true"), Wait: true})
	if err == nil {
		if j.Status != "failed" || j.Fault == nil || j.Fault.Source != string(faults.Sandbox) || !j.Fault.Retryable {
			t.Fatalf("exec on a dead sandbox: %+v fault %+v", j, j.Fault)
		}
	} else if fe := faults.Of(err); fe.Source != faults.Sandbox {
		t.Fatalf("exec on a dead sandbox: %v", err)
	}
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || sb.Status != api.StatusFailed {
		t.Fatalf("dead sandbox status: %+v %v", sb, err)
	}
}

func serverConfigSmallBodies() server.Config { return server.Config{MaxBodyBytes: 1 << 20} }

// killAgent SIGKILLs a sandbox's agent from the host (PID 1 of its pid
// namespace cannot be killed from inside); its pid is the first of the
// sandbox's cgroup.
func killAgent(t testing.TB, id string) {
	t.Helper()
	raw, err := os.ReadFile("/sys/fs/cgroup/pids/orchard/" + id + "/cgroup.procs")
	if err != nil {
		t.Fatalf("find agent: %v", err)
	}
	for _, f := range strings.Fields(string(raw)) {
		pid, _ := strconv.Atoi(f)
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	time.Sleep(100 * time.Millisecond)
}
