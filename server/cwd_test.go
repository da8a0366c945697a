package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// An exec whose cwd does not exist when it starts fails, without running
// the command: Orchard Env runs it in "/" and reports success. It is a
// failed job rather than a 4xx, because the directory is looked for when
// the job runs (a job queued behind one that creates it finds it), and
// because a 4xx makes Orchard Env's SDK post the command a second time.
func TestExecMissingCwd(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "256Mi"})
	if j := execWait(t, srv, id, map[string]any{"command": "touch /tmp/a-file"}); j.Status != "succeeded" {
		t.Fatalf("setup: %+v", j)
	}
	cases := []struct {
		name, cwd, code, msg string
	}{
		{"missing", "/doesnotexist", faults.CodePathNotFound, "Working directory not found: /doesnotexist"},
		{"a file", "/tmp/a-file", faults.CodeNotDirectory, "Working directory is not a directory: /tmp/a-file"},
		{"relative and missing", "nowhere", faults.CodePathNotFound, "Working directory not found: nowhere"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := execWait(t, srv, id, map[string]any{"command": "touch /tmp/ran", "cwd": tc.cwd})
			if j.Status != "failed" || j.ExitCode != nil || j.Error == nil || *j.Error != tc.msg {
				t.Fatalf("job %+v (error %v), want failed, no exit code, error %q", j, deref(j.Error), tc.msg)
			}
			if j.Fault == nil || j.Fault.Code != tc.code || j.Fault.Source != "client" || j.Fault.Retryable {
				t.Fatalf("fault %+v, want %s from the client", j.Fault, tc.code)
			}
			if r := execWait(t, srv, id, map[string]any{"command": "test -e /tmp/ran"}); r.Status != "failed" {
				t.Fatal("the command ran somewhere else")
			}
		})
	}
	t.Run("no wait, then the job", func(t *testing.T) {
		r := call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "pwd", "cwd": "/doesnotexist"})
		want(t, r, 200)
		w := call(t, srv, "GET", "/jobs/"+r.body["job_id"].(string)+"/wait?timeout=30", nil)
		if w.body["status"] != "failed" || w.body["error"] != "Working directory not found: /doesnotexist" || w.body["exit_code"] != nil {
			t.Fatalf("job: %s", w.raw)
		}
	})
	t.Run("default cwd", func(t *testing.T) {
		for _, cwd := range []any{nil, ""} {
			if j := execWait(t, srv, id, map[string]any{"command": "pwd", "cwd": cwd}); j.Status != "succeeded" || j.Stdout != "/workspace\n" {
				t.Errorf("cwd %q: %+v", cwd, j)
			}
		}
	})
	t.Run("made by the job queued before", func(t *testing.T) {
		r := call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "sleep 0.3; mkdir /tmp/made-later"})
		want(t, r, 200)
		if j := execWait(t, srv, id, map[string]any{"command": "pwd", "cwd": "/tmp/made-later"}); j.Status != "succeeded" || j.Stdout != "/tmp/made-later\n" {
			t.Errorf("job %+v", j)
		}
	})
	t.Run("pty", func(t *testing.T) {
		u := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/exec/pty?api_key=" + srv.APIKey
		conn, _, err := websocket.DefaultDialer.Dial(u, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		init := map[string]any{"type": "init", "cmd": []string{"touch", "/tmp/pty-ran"}, "env": map[string]string{}, "cwd": "/doesnotexist", "rows": 24, "cols": 80, "login_shell": false}
		if err := conn.WriteJSON(init); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		var frames []map[string]any
		for {
			var f map[string]any
			if err := conn.ReadJSON(&f); err != nil {
				ce, ok := err.(*websocket.CloseError)
				if !ok || ce.Code != 4400 {
					t.Fatalf("end %v after %v, want close 4400", err, frames)
				}
				break
			}
			frames = append(frames, f)
		}
		if len(frames) != 1 || frames[0]["type"] != "error" || frames[0]["message"] != "Working directory not found: /doesnotexist" {
			t.Fatalf("frames %v, want one error frame", frames)
		}
		if j := execWait(t, srv, id, map[string]any{"command": "test -e /tmp/pty-ran"}); j.Status != "failed" {
			t.Fatal("the PTY command ran")
		}
	})
}

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}
