package client_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// e2eTimeout bounds each end-to-end test: a sandbox of the local runtime
// starts in well under a second, the slowest step is the 1 s exec timeout.
const e2eTimeout = 2 * time.Minute

// startSandbox starts a server and a ready sandbox on it.
func startSandbox(t *testing.T, labels map[string]string) (*testserver.Server, *client.Client, string) {
	t.Helper()
	srv := testserver.Start(t, testserver.Options{})
	c := client.New(srv.URL, srv.APIKey)
	ctx, cancel := context.WithTimeout(context.Background(), e2eTimeout)
	defer cancel()
	created, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host", Labels: labels})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if created.SandboxID == "" || created.Status != api.StatusPending {
		t.Fatalf("create answered %+v, want an id and status pending", created)
	}
	sb, err := c.WaitSandbox(ctx, created.SandboxID, time.Minute)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	if sb.Status != api.StatusReady || !sb.Ready {
		t.Fatalf("wait answered status %q (%s), want ready", sb.Status, sb.StatusMessage)
	}
	return srv, c, created.SandboxID
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), e2eTimeout)
	t.Cleanup(cancel)
	return ctx
}

func TestSandboxLifecycle(t *testing.T) {
	t.Parallel()
	srv, c, id := startSandbox(t, map[string]string{"suite": "client", "run": "lifecycle"})
	ctx := testContext(t)

	if err := c.Health(ctx); err != nil {
		t.Errorf("health: %v", err)
	}
	if info, err := c.Root(ctx); err != nil || info.Status != "running" {
		t.Errorf("root = %+v, %v", info, err)
	}
	if res, err := c.Resources(ctx); err != nil || res.Status != "ok" || len(res.Nodes) != 1 ||
		!slices.ContainsFunc(res.SandboxPods, func(p client.SandboxUsage) bool { return p.Name == "sandbox-"+id }) {
		t.Errorf("resources = %+v, %v; want one node and our sandbox", res, err)
	}
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || sb.SandboxID != id || sb.Status != api.StatusReady || sb.Labels["suite"] != "client" {
		t.Errorf("get = %+v, %v", sb, err)
	}
	for _, tc := range []struct {
		name string
		opts client.ListOptions
		want bool
	}{
		{"all", client.ListOptions{}, true},
		{"labels match", client.ListOptions{Labels: map[string]string{"suite": "client", "run": "lifecycle"}}, true},
		{"label differs", client.ListOptions{Labels: map[string]string{"suite": "other"}}, false},
		{"status ready", client.ListOptions{Status: api.StatusReady}, true},
		{"status failed", client.ListOptions{Status: api.StatusFailed}, false},
		{"kind shell", client.ListOptions{Kind: api.KindShell}, true},
	} {
		list, err := c.ListSandboxes(ctx, tc.opts)
		if err != nil {
			t.Errorf("list %s: %v", tc.name, err)
			continue
		}
		got := slices.ContainsFunc(list, func(s api.Sandbox) bool { return s.SandboxID == id })
		if got != tc.want {
			t.Errorf("list %s: sandbox listed = %v, want %v", tc.name, got, tc.want)
		}
	}
	if err := c.Heartbeat(ctx, id); err != nil {
		t.Errorf("heartbeat: %v", err)
	}
	if sb, _ := c.GetSandbox(ctx, id); sb.LastHeartbeat == nil {
		t.Errorf("heartbeat not recorded: %+v", sb)
	}

	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := c.DeleteSandbox(ctx, id); err != nil {
		t.Errorf("second delete: %v (delete is idempotent)", err)
	}
	for _, tc := range []struct {
		name string
		call func() error
		code string
	}{
		{"get deleted", func() error { _, err := c.GetSandbox(ctx, id); return err }, faults.CodeSandboxNotFound},
		{"wait unknown", func() error { _, err := c.WaitSandbox(ctx, "nosuch", time.Second); return err }, faults.CodeSandboxNotFound},
		{"heartbeat unknown", func() error { return c.Heartbeat(ctx, "nosuch") }, faults.CodeSandboxNotFound},
		{"job unknown", func() error { _, err := c.GetJob(ctx, "nosuch"); return err }, faults.CodeJobNotFound},
		{"exec unknown", func() error {
			_, err := c.Exec(ctx, "nosuch", api.ExecRequest{Command: client.Command("true"), Wait: true})
			return err
		}, faults.CodeSandboxNotFound},
	} {
		err := tc.call()
		if f := faults.Of(err); f == nil || f.Category != faults.NotFound || f.Code != tc.code || f.StatusOf() != 404 {
			t.Errorf("%s: err = %v (%+v), want not_found %s", tc.name, err, f, tc.code)
		}
	}

	// Authentication failures decode into their categories.
	for _, tc := range []struct {
		key string
		cat faults.Category
	}{{"", faults.Unauthenticated}, {"wrong-key", faults.PermissionDenied}} {
		_, err := client.New(srv.URL, tc.key).ListSandboxes(ctx, client.ListOptions{})
		if f := faults.Of(err); f.Category != tc.cat || f.Retryable {
			t.Errorf("key %q: err = %v (%s), want %s", tc.key, err, f.Category, tc.cat)
		}
	}
}

func TestWait(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t, testserver.Options{})
	c := client.New(srv.URL, srv.APIKey)
	registry := hangingRegistry(t)
	for _, tc := range []struct {
		name   string
		image  string
		code   string // error code, or
		status string // the status the wait answers with
	}{
		// The pull hangs, so the sandbox is still pending when the wait ends.
		{"never ready", registry + "/slow:latest", faults.CodeWaitTimeout, ""},
		{"fails to start", "docker.invalid/nosuch:never", "", api.StatusFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			created, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: tc.image})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			defer c.DeleteSandbox(context.Background(), created.SandboxID)
			start := time.Now()
			sb, err := c.WaitSandbox(ctx, created.SandboxID, time.Second)
			if tc.code != "" {
				f := faults.Of(err)
				if f == nil || f.Code != tc.code || f.Category != faults.Timeout || f.StatusOf() != 408 {
					t.Fatalf("wait = %+v, %v; want a 408 %s", sb, err, tc.code)
				}
				if d := time.Since(start); d > 10*time.Second {
					t.Fatalf("wait took %s: a wait timeout must not be retried", d)
				}
				return
			}
			if err != nil || sb.Status != tc.status || sb.Ready {
				t.Fatalf("wait = %+v, %v; want status %s", sb, err, tc.status)
			}
		})
	}
}

// hangingRegistry is the host:port of a registry that accepts connections
// and never answers, so that pulls from it hang.
func hangingRegistry(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

func TestExec(t *testing.T) {
	t.Parallel()
	_, c, id := startSandbox(t, nil)
	for _, tc := range []struct {
		name       string
		req        api.ExecRequest
		status     string
		exit       int
		stdout     string
		stderr     string // substring
		errContain string
	}{
		{name: "stdout", req: api.ExecRequest{Command: client.Command("echo hello")},
			status: api.JobSucceeded, stdout: "hello\n"},
		{name: "stderr and exit code", req: api.ExecRequest{Command: client.Command("echo oops >&2; exit 3")},
			status: api.JobFailed, exit: 3, stderr: "oops"},
		{name: "env and cwd", req: api.ExecRequest{Command: client.Command(`echo "$FOO"; pwd`), Env: map[string]string{"FOO": "bar baz"}, Cwd: client.Ptr("/tmp")},
			status: api.JobSucceeded, stdout: "bar baz\n/tmp\n"},
		{name: "default cwd", req: api.ExecRequest{Command: client.Command("pwd")},
			status: api.JobSucceeded, stdout: "/workspace\n"},
		{name: "timeout", req: api.ExecRequest{Command: client.Command("echo started; sleep 30"), TimeoutSeconds: client.Ptr(1)},
			status: api.JobFailed, exit: 124, stdout: "started\n", errContain: "timed out"},
		{name: "killed by signal", req: api.ExecRequest{Command: client.Command("kill -9 $$")},
			status: api.JobFailed, exit: -9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			req := tc.req
			req.Wait = true
			job, err := c.Exec(ctx, id, req)
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			if job.Status != tc.status || job.ExitCode == nil || *job.ExitCode != tc.exit {
				t.Fatalf("job = status %s exit %v (error %v), want %s exit %d", job.Status, ptrVal(job.ExitCode), ptrVal(job.Error), tc.status, tc.exit)
			}
			if job.Stdout != tc.stdout || !strings.Contains(job.Stderr, tc.stderr) {
				t.Errorf("stdout %q stderr %q; want stdout %q, stderr containing %q", job.Stdout, job.Stderr, tc.stdout, tc.stderr)
			}
			if tc.errContain != "" && (job.Error == nil || !strings.Contains(*job.Error, tc.errContain)) {
				t.Errorf("error %v, want it to contain %q", ptrVal(job.Error), tc.errContain)
			}
			if job.JobID == "" || job.SandboxID != id || job.CompletedAt == nil {
				t.Errorf("job record incomplete: %+v", job)
			}
		})
	}
	t.Run("no wait", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		jobID, err := c.ExecNoWait(ctx, id, api.ExecRequest{Command: client.Command("sleep 1; echo done")})
		if err != nil {
			t.Fatal(err)
		}
		job, err := c.GetJob(ctx, jobID)
		if err != nil || job.JobID != jobID || job.Terminal() {
			t.Fatalf("get right after start = %+v, %v; want the job, not finished", job, err)
		}
		for !job.Terminal() {
			if job, err = c.WaitJob(ctx, jobID, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if job.Status != api.JobSucceeded || job.Stdout != "done\n" {
			t.Fatalf("job = %+v", job)
		}
		// A short wait on a running job answers with its state, not an error.
		jobID, err = c.ExecNoWait(ctx, id, api.ExecRequest{Command: client.Command("sleep 5")})
		if err != nil {
			t.Fatal(err)
		}
		if job, err = c.WaitJob(ctx, jobID, time.Second); err != nil || job.Terminal() {
			t.Fatalf("wait 1s on a 5s job = %s, %v; want a running job", job.Status, err)
		}
	})
}

func ptrVal[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestFiles(t *testing.T) {
	t.Parallel()
	_, c, id := startSandbox(t, nil)
	ctx := testContext(t)

	all := make([]byte, 256*4)
	for i := range all {
		all[i] = byte(i)
	}
	for _, tc := range []struct {
		name string
		path string
		data []byte
	}{
		{"binary", "/workspace/bin.dat", all},
		{"empty", "/workspace/empty", nil},
		{"creates parents", "/workspace/a/b/c/text.txt", []byte("héllo\n")},
		{"large", "/tmp/large", bytes.Repeat([]byte("0123456789abcdef"), 1<<16)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.Upload(ctx, id, tc.path, tc.data)
			if err != nil {
				t.Fatalf("upload: %v", err)
			}
			if !res.Success || res.Path != tc.path || res.Size != int64(len(tc.data)) {
				t.Errorf("upload = %+v", res)
			}
			got, err := c.Download(ctx, id, tc.path)
			if err != nil {
				t.Fatalf("download: %v", err)
			}
			if !bytes.Equal(got, tc.data) {
				t.Errorf("downloaded %d bytes, differ from the %d uploaded", len(got), len(tc.data))
			}
		})
	}

	list, err := c.ListFiles(ctx, id, "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range list.Files {
		names = append(names, f.Name+":"+f.Type)
		if f.Name == "bin.dat" && f.Size != int64(len(all)) {
			t.Errorf("bin.dat size %d, want %d", f.Size, len(all))
		}
	}
	if want := []string{"a:directory", "bin.dat:file", "empty:file"}; !slices.Equal(names, want) {
		t.Errorf("listing %v, want %v", names, want)
	}
	if def, err := c.ListFiles(ctx, id, ""); err != nil || def.Path != "/workspace" || len(def.Files) != len(list.Files) {
		t.Errorf("default listing = %+v, %v; want /workspace", def, err)
	}

	for _, tc := range []struct {
		name string
		call func() error
		code string
	}{
		{"missing file", func() error { _, err := c.Download(ctx, id, "/workspace/nosuch"); return err }, faults.CodeFileNotFound},
		{"missing dir", func() error { _, err := c.ListFiles(ctx, id, "/nosuch"); return err }, faults.CodePathNotFound},
	} {
		if err := tc.call(); !faults.Is(err, tc.code) || faults.Of(err).Category != faults.NotFound {
			t.Errorf("%s: err = %v (%s), want %s", tc.name, err, faults.Of(err).Code, tc.code)
		}
	}
}

func TestApplyPatch(t *testing.T) {
	t.Parallel()
	_, c, id := startSandbox(t, nil)
	ctx := testContext(t)
	if _, err := c.Upload(ctx, id, "/workspace/greet.txt", []byte("hello\nworld\n")); err != nil {
		t.Fatal(err)
	}
	const good = `diff --git a/greet.txt b/greet.txt
--- a/greet.txt
+++ b/greet.txt
@@ -1,2 +1,2 @@
 hello
-world
+orchard
`
	res, err := c.ApplyPatch(ctx, id, good, 10*time.Second)
	if err != nil || !res.Success || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("apply = %+v, %v", res, err)
	}
	if got, err := c.Download(ctx, id, "/workspace/greet.txt"); err != nil || string(got) != "hello\norchard\n" {
		t.Fatalf("after patch: %q, %v", got, err)
	}
	// The same patch again no longer applies: a result, not an error.
	res, err = c.ApplyPatch(ctx, id, good, 0)
	if err != nil || res.Success || res.ExitCode == nil || *res.ExitCode == 0 {
		t.Fatalf("re-apply = %+v, %v; want success false with an exit code", res, err)
	}
}

// readUntil collects PTY output until it satisfies done or the session
// ends.
func readUntil(t *testing.T, s *client.PTYSession, done func(string) bool) string {
	t.Helper()
	var out strings.Builder
	timeout := time.After(30 * time.Second)
	for !done(out.String()) {
		select {
		case b, ok := <-s.Output():
			if !ok {
				return out.String()
			}
			out.Write(b)
		case <-timeout:
			t.Fatalf("no expected output within 30s; got %q", out.String())
		}
	}
	return out.String()
}

func TestPTY(t *testing.T) {
	t.Parallel()
	srv, c, id := startSandbox(t, nil)

	t.Run("echo through cat", func(t *testing.T) {
		t.Parallel()
		s, err := c.PTY(testContext(t), id, client.PTYOptions{Cmd: []string{"cat"}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.PID() <= 0 {
			t.Errorf("pid %d", s.PID())
		}
		if _, err := s.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		// The terminal echoes the line, then cat prints it.
		readUntil(t, s, func(o string) bool { return strings.Count(o, "ping\r\n") >= 2 })
		if _, err := s.Write([]byte{4}); err != nil { // ^D: end of input
			t.Fatal(err)
		}
		for range s.Output() {
		}
		if code, err := s.Wait(); err != nil || code != 0 {
			t.Fatalf("wait = %d, %v; want 0", code, err)
		}
		if _, err := s.Write([]byte("late")); !errors.Is(err, client.ErrSessionEnded) {
			t.Errorf("write after the end: %v, want ErrSessionEnded", err)
		}
	})

	for _, tc := range []struct {
		name string
		opts client.PTYOptions
		code int
		out  string
	}{
		{"exit code", client.PTYOptions{Cmd: []string{"sh", "-c", "exit 7"}}, 7, ""},
		{"env cwd and size", client.PTYOptions{Cmd: []string{"sh", "-c", `echo "$FOO $(pwd) $(stty size)"`}, Env: map[string]string{"FOO": "bar"}, Cwd: "/tmp", Rows: 33, Cols: 101},
			0, "bar /tmp 33 101"},
		{"login shell", client.PTYOptions{Cmd: []string{"echo", "in login"}, LoginShell: true}, 0, "in login"},
		{"command not found", client.PTYOptions{Cmd: []string{"/nosuch/binary"}}, 127, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := c.PTY(testContext(t), id, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			out := readUntil(t, s, func(string) bool { return false })
			code, err := s.Wait()
			if err != nil || code != tc.code || !strings.Contains(out, tc.out) {
				t.Fatalf("wait = %d, %v, output %q; want %d and output containing %q", code, err, out, tc.code, tc.out)
			}
		})
	}

	t.Run("resize", func(t *testing.T) {
		t.Parallel()
		s, err := c.PTY(testContext(t), id, client.PTYOptions{Cmd: []string{"sh", "-c", "read x; stty size"}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Resize(40, 120); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("\n")); err != nil {
			t.Fatal(err)
		}
		out := readUntil(t, s, func(o string) bool { return strings.Contains(o, "40 120") })
		if code, err := s.Wait(); err != nil || code != 0 {
			t.Fatalf("wait = %d, %v (output %q)", code, err, out)
		}
	})

	t.Run("signal", func(t *testing.T) {
		t.Parallel()
		s, err := c.PTY(testContext(t), id, client.PTYOptions{Cmd: []string{"sleep", "60"}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Signal("KILL"); err != nil {
			t.Fatal(err)
		}
		readUntil(t, s, func(string) bool { return false })
		if code, err := s.Wait(); err != nil || code != -9 {
			t.Fatalf("wait = %d, %v; want -9", code, err)
		}
	})

	t.Run("close", func(t *testing.T) {
		t.Parallel()
		s, err := c.PTY(testContext(t), id, client.PTYOptions{Cmd: []string{"sleep", "60"}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_ = s.Close()
		_ = s.Close()
		code, err := s.Wait()
		if time.Since(start) > 10*time.Second {
			t.Fatalf("close took %s", time.Since(start))
		}
		if err == nil && code != -15 {
			t.Fatalf("wait after close = %d, nil; want SIGTERM's -15 or an error", code)
		}
	})

	t.Run("context ends the session", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		s, err := c.PTY(ctx, id, client.PTYOptions{Cmd: []string{"sleep", "60"}})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		cancel()
		readUntil(t, s, func(string) bool { return false })
		if _, err := s.Wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("wait after cancel: %v, want context.Canceled", err)
		}
	})

	for _, tc := range []struct {
		name string
		c    *client.Client
		id   string
		cat  faults.Category
	}{
		{"unknown sandbox", c, "nosuch", faults.NotFound},
		{"missing key", client.New(srv.URL, ""), id, faults.Unauthenticated},
		{"wrong key", client.New(srv.URL, "wrong"), id, faults.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := tc.c.PTY(testContext(t), tc.id, client.PTYOptions{Cmd: []string{"true"}})
			if err == nil {
				s.Close()
				t.Fatal("session started")
			}
			if f := faults.Of(err); f.Category != tc.cat {
				t.Fatalf("err = %v (%s), want %s", err, f.Category, tc.cat)
			}
		})
	}
}
