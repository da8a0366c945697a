package server_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/harness"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// ptyRun runs cmd through the PTY WebSocket (a login shell when login is
// set) and returns its output and exit code.
func ptyRun(t *testing.T, srv *testserver.Server, id string, cmd []string, login bool) (string, int) {
	t.Helper()
	u := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/exec/pty?api_key=" + srv.APIKey
	conn, _, err := websocket.DefaultDialer.Dial(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	init := map[string]any{"type": "init", "cmd": cmd, "env": map[string]string{}, "cwd": nil, "rows": 24, "cols": 200, "login_shell": login}
	if err := conn.WriteJSON(init); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
	var out strings.Builder
	for {
		var f struct {
			Type    string `json:"type"`
			Data    []byte `json:"data"`
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := conn.ReadJSON(&f); err != nil {
			t.Fatalf("pty %v: %v (output so far %q)", cmd, err, out.String())
		}
		switch f.Type {
		case api.PTYStdout:
			out.Write(f.Data)
		case api.PTYExit:
			return out.String(), f.Code
		case api.PTYError:
			t.Fatalf("pty %v: error frame %q", cmd, f.Message)
		}
	}
}

// exitOf is a job's exit code, or "none".
func exitOf(j api.Job) any {
	if j.ExitCode == nil {
		return "none"
	}
	return *j.ExitCode
}

// Sandboxes that ask for harnesses have codex, claude, opencode and pi on
// PATH — in the host image and in a busybox-only image, which has no
// Node.js, no glibc and no bash — through exec and through a PTY login
// shell; the store is one read-only mount shared by every sandbox; a
// sandbox without harnesses has none; unknown or missing names are 422s.
func TestHarness(t *testing.T) {
	storeDir := testenv.HarnessStore(t)
	installed, err := (&harness.Store{Dir: storeDir}).List()
	if err != nil {
		t.Fatal(err)
	}
	versions := map[string]string{}
	for _, h := range installed {
		versions[h.Name] = h.Version
	}
	// The store honours the lock file the test environment installs from.
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	lock, err := (&harness.Store{LockFile: filepath.Join(root, "harness", "testdata", "harnesses.lock")}).ReadLock()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range testenv.NPMHarnesses {
		if versions[n] == "" || versions[n] != lock[n] {
			t.Fatalf("store has %s at %q, the lock file pins %q", n, versions[n], lock[n])
		}
	}
	images := t.TempDir()
	writeImages(t, images, busyboxImage(t))
	srv := testserver.Start(t, testserver.Options{ImageDirs: []string{images}, HarnessDir: storeDir})

	host := createReady(t, srv, map[string]any{"harnesses": testenv.NPMHarnesses})
	busybox := createReady(t, srv, map[string]any{"image": "oci-layout:" + filepath.Join(images, "layout"), "harnesses": "all"})
	plain := createReady(t, srv, nil)

	for _, sb := range []struct{ name, id string }{{"host", host}, {"busybox", busybox}} {
		for _, n := range testenv.NPMHarnesses {
			t.Run(sb.name+"/"+n, func(t *testing.T) {
				j := execWait(t, srv, sb.id, map[string]any{"command": []string{n, "--version"}, "timeout": 120})
				// pi prints its version to stderr.
				if j.ExitCode == nil || *j.ExitCode != 0 || !strings.Contains(j.Stdout+j.Stderr, versions[n]) {
					t.Errorf("%s --version: exit %v, stdout %q, stderr %q; want 0 and %s", n, exitOf(j), j.Stdout, j.Stderr, versions[n])
				}
				out, code := ptyRun(t, srv, sb.id, []string{n, "--version"}, true)
				if code != 0 || !strings.Contains(out, versions[n]) {
					t.Errorf("%s --version in a login shell: exit %d, output %q; want 0 and %s", n, code, out, versions[n])
				}
			})
		}
	}

	t.Run("none without harnesses", func(t *testing.T) {
		for _, cmd := range []string{"command -v codex claude opencode pi", "ls /.orchard/harnesses"} {
			if j := execWait(t, srv, plain, map[string]any{"command": cmd}); j.ExitCode == nil || *j.ExitCode == 0 {
				t.Errorf("%q in a sandbox without harnesses: exit %v, stdout %q", cmd, exitOf(j), j.Stdout)
			}
		}
		if out, code := ptyRun(t, srv, plain, []string{"codex", "--version"}, true); code == 0 {
			t.Errorf("codex in a login shell of a sandbox without harnesses: exit 0, output %q", out)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		for _, id := range []string{host, busybox} {
			for _, p := range []string{"/.orchard/harnesses/new", "/.orchard/harnesses/codex/bin/codex"} {
				j := execWait(t, srv, id, map[string]any{"command": "echo x >> " + p})
				if j.ExitCode == nil || *j.ExitCode == 0 || !strings.Contains(j.Stderr, "Read-only") {
					t.Errorf("write to %s in %s: exit %v, stderr %q; want a read-only file system", p, id, exitOf(j), j.Stderr)
				}
			}
		}
	})

	t.Run("shared", func(t *testing.T) {
		// The same inode as the store's file on the host, in both
		// sandboxes: a mount of one copy, nothing copied per sandbox.
		cur, err := (&harness.Store{Dir: storeDir}).Current()
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(cur, "codex", "bin", "codex"))
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprint(fi.Sys().(*syscall.Stat_t).Ino)
		for _, id := range []string{host, busybox} {
			j := execWait(t, srv, id, map[string]any{"command": "stat -c %i /.orchard/harnesses/codex/bin/codex"})
			if got := strings.TrimSpace(j.Stdout); got != want {
				t.Errorf("inode of the codex launcher in %s: %q (stderr %q), want the store's %s", id, got, j.Stderr, want)
			}
		}
	})

	t.Run("fork", func(t *testing.T) {
		// A fork keeps its source's harnesses; a fork of a sandbox
		// without any has none.
		for _, tc := range []struct {
			id   string
			want bool
		}{{host, true}, {plain, false}} {
			r := call(t, srv, "POST", "/sandboxes/"+tc.id+"/fork", map[string]any{"count": 1})
			want(t, r, 200)
			sbs, _ := r.body["sandboxes"].([]any)
			if len(sbs) != 1 {
				t.Fatalf("fork: %s", r.raw)
			}
			fork := sbs[0].(map[string]any)["sandbox_id"].(string)
			j := execWait(t, srv, fork, map[string]any{"command": "codex --version"})
			if got := j.ExitCode != nil && *j.ExitCode == 0; got != tc.want {
				t.Errorf("codex in a fork of %s: exit %v, stdout %q; want it on PATH: %v", tc.id, exitOf(j), j.Stdout, tc.want)
			}
			call(t, srv, "DELETE", "/sandboxes/"+fork, nil)
		}
	})

	t.Run("unknown names", func(t *testing.T) {
		for _, tc := range []struct {
			harnesses any
			name      string
		}{
			{[]string{"codex", "nope"}, "nope"},
			{[]string{"../../etc"}, "../../etc"},
			{"hermes", "hermes"}, // known, not installed
		} {
			r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "harnesses": tc.harnesses})
			if r.status == 200 {
				call(t, srv, "DELETE", "/sandboxes/"+r.body["sandbox_id"].(string), nil)
			}
			if r.status != 422 || !strings.Contains(string(r.raw), tc.name) {
				t.Errorf("harnesses %v: %d %s, want 422 naming %s", tc.harnesses, r.status, r.raw, tc.name)
			}
		}
	})
}

// BenchmarkHarness measures what harnesses cost a sandbox: its create to
// ready with and without every harness (a bind mount, so no measurable
// difference is the goal), and each harness's --version through exec in
// a busybox-only sandbox and in a host sandbox.
//
//	go test -run '^$' -bench BenchmarkHarness -benchtime 10x ./server/
func BenchmarkHarness(b *testing.B) {
	storeDir := testenv.HarnessStore(b)
	images := b.TempDir()
	writeImages(b, images, busyboxImage(b))
	srv := testserver.Start(b, testserver.Options{ImageDirs: []string{images}, HarnessDir: storeDir})
	busyboxRef := "oci-layout:" + filepath.Join(images, "layout")
	for _, tc := range []struct {
		name string
		body map[string]any
	}{
		{"create/host/none", map[string]any{}},
		{"create/host/all", map[string]any{"harnesses": "all"}},
		{"create/busybox/none", map[string]any{"image": busyboxRef}},
		{"create/busybox/all", map[string]any{"image": busyboxRef, "harnesses": "all"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				body := map[string]any{}
				for k, v := range tc.body {
					body[k] = v
				}
				id := createReady(b, srv, body)
				b.StopTimer()
				call(b, srv, "DELETE", "/sandboxes/"+id, nil)
				b.StartTimer()
			}
		})
	}
	for _, image := range []string{"host", busyboxRef} {
		id := createReady(b, srv, map[string]any{"image": image, "harnesses": "all"})
		label := "host"
		if image != "host" {
			label = "busybox"
		}
		for _, n := range testenv.NPMHarnesses {
			b.Run("version/"+label+"/"+n, func(b *testing.B) {
				for b.Loop() {
					if j := execWait(b, srv, id, map[string]any{"command": n + " --version", "timeout": 120}); j.ExitCode == nil || *j.ExitCode != 0 {
						b.Fatalf("%s --version: %+v", n, j)
					}
				}
			})
		}
	}
}
