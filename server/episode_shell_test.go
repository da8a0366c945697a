package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/server"
)

// shellRepoTask is a SWE-style task over a Python repository: add() is
// wrong, test_add fails until it is fixed, test_sub passes before and
// after.
func shellRepoTask(id string, setup map[string]any) map[string]any {
	setup["sandbox"] = map[string]any{"kind": "shell", "block_network": true}
	return map[string]any{"id": id, "question": "Make test_add pass.", "setup": setup,
		"eval": map[string]any{"type": "exec", "command": "cd /workspace/r && python3 -m unittest -q {test}",
			"fail_to_pass": []string{"test_m.T.test_add"}, "pass_to_pass": []string{"test_m.T.test_sub"}}}
}

var repoFiles = map[string]string{
	"m.py":      "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n",
	"test_m.py": "import unittest\nimport m\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(m.add(2, 3), 5)\n\n    def test_sub(self):\n        self.assertEqual(m.sub(5, 3), 2)\n",
}

const repoFix = `--- a/r/m.py
+++ b/r/m.py
@@ -1,5 +1,5 @@
 def add(a, b):
-    return a - b
+    return a + b
 
 
 def sub(a, b):
`

// Shell episodes end to end in a real sandbox: a repository copied from
// the host at a commit (a later commit that holds the fix must not be
// seen), exec with cwd, env and a timeout, truncated output, write_file,
// apply_patch (a good one and a bad one), an unknown action, submit;
// the exec eval's FAIL_TO_PASS and PASS_TO_PASS verdicts with and
// without the fix; the step recorded with its action and result and
// exported in every format.
func TestShellEpisode(t *testing.T) {
	root := t.TempDir()
	repo := filepath.Join(root, "repo")
	git := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if err := os.MkdirAll(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	git("init", "-q")
	for name, content := range repoFiles {
		if err := os.WriteFile(filepath.Join(repo, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("add", "-A")
	git("commit", "-qm", "base")
	base := git("rev-parse", "HEAD")
	if err := os.WriteFile(filepath.Join(repo, "m.py"), []byte(strings.Replace(repoFiles["m.py"], "a - b", "a + b", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	git("commit", "-qam", "the fix")

	srv := testserver.Start(t, testserver.Options{Server: server.Config{RepoRoots: []string{root}}})

	t.Run("refused outside the roots", func(t *testing.T) {
		r := call(t, srv, "POST", "/episodes", map[string]any{"task": shellRepoTask("outside", map[string]any{"repo": map[string]any{"path": "/etc"}})})
		wantCode(t, r, 400, "task.invalid")
	})
	t.Run("unknown repo field", func(t *testing.T) {
		r := call(t, srv, "POST", "/episodes", map[string]any{"task": shellRepoTask("typo", map[string]any{"repo": map[string]any{"path": repo, "comit": base}})})
		wantCode(t, r, 400, "task.invalid")
	})

	// The other sources: the host directory as it is (the fix committed,
	// its .git copied), a tarball of it checked out at the base commit,
	// and a symbolic link that leads out of the roots.
	tarball := filepath.Join(root, "repo.tar.gz")
	if out, err := exec.Command("tar", "-czf", tarball, "-C", repo, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	if err := os.Symlink("/etc", filepath.Join(root, "etc")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		repo map[string]any
		want string
	}{
		{"directory", map[string]any{"path": repo}, "1\n2\n"},
		{"tarball at a commit", map[string]any{"tarball": tarball, "commit": base}, "2\n1\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.repo["dir"] = "/workspace/r"
			e := call(t, srv, "POST", "/episodes", map[string]any{"task": shellRepoTask("src", map[string]any{"repo": tt.repo})})
			want(t, e, 200)
			id := e.body["episode_id"].(string)
			defer call(t, srv, "DELETE", "/episodes/"+id, nil)
			r := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": map[string]any{"type": "exec", "cwd": "/workspace/r",
				"command": "grep -c 'a - b' m.py; git log --oneline | wc -l"}})
			want(t, r, 200)
			if o, _ := r.body["observation"].(map[string]any); o["stdout"] != tt.want {
				t.Errorf("observation %v, want stdout %q", o, tt.want)
			}
		})
	}
	t.Run("symlink out of the roots", func(t *testing.T) {
		r := call(t, srv, "POST", "/episodes", map[string]any{"task": shellRepoTask("link", map[string]any{"repo": map[string]any{"path": filepath.Join(root, "etc")}})})
		wantCode(t, r, 400, "task.invalid")
	})

	run := func(t *testing.T, fix bool) (map[string]any, string) {
		t.Helper()
		task := shellRepoTask("add", map[string]any{"repo": map[string]any{"path": repo, "commit": base, "dir": "/workspace/r"}})
		e := call(t, srv, "POST", "/episodes", map[string]any{"task": task, "max_steps": 10})
		want(t, e, 200)
		id := e.body["episode_id"].(string)
		if obs, _ := e.body["observation"].(map[string]any); obs == nil || obs["exit_code"] != 0.0 || obs["stdout"] != "" {
			t.Fatalf("first observation: %s", e.raw)
		}
		if g := call(t, srv, "GET", "/episodes/"+id, nil); g.body["kind"] != "shell" {
			t.Errorf("episode kind: %s", g.raw)
		}
		step := func(actions ...any) map[string]any {
			t.Helper()
			r := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"actions": actions})
			want(t, r, 200)
			return r.body
		}
		obs := func(r map[string]any) map[string]any { o, _ := r["observation"].(map[string]any); return o }

		// The commit asked for, not the host's HEAD, and a git repository.
		r := step(map[string]any{"type": "exec", "command": "grep -c 'a - b' m.py; git log --oneline | wc -l; echo $GREETING >&2", "cwd": "/workspace/r", "env": map[string]string{"GREETING": "hi"}})
		if o := obs(r); o["stdout"] != "2\n1\n" || o["stderr"] != "hi\n" || o["exit_code"] != 0.0 || o["duration_ms"].(float64) <= 0 {
			t.Errorf("exec: %v", o)
		}
		if info, _ := r["info"].(map[string]any); info["step"] != 1.0 || r["done"] != false {
			t.Errorf("info: %v", r)
		}
		r = step(map[string]any{"type": "exec", "command": "exit 3"})
		if o := obs(r); o["exit_code"] != 3.0 || o["stdout_truncated"] != false {
			t.Errorf("exit 3: %v", o)
		}
		r = step(map[string]any{"type": "exec", "command": "head -c 200000 /dev/zero | tr '\\0' x; echo err >&2"})
		if o := obs(r); len(o["stdout"].(string)) != 64<<10 || o["stdout_truncated"] != true || o["stderr_truncated"] != false {
			t.Errorf("truncation: %d bytes, %v %v", len(o["stdout"].(string)), o["stdout_truncated"], o["stderr_truncated"])
		}
		r = step(map[string]any{"type": "exec", "command": "sleep 5", "timeout": 1})
		if o := obs(r); o["exit_code"] != 124.0 {
			t.Errorf("timeout: %v", o)
		}
		r = step(map[string]any{"type": "write_file", "path": "/workspace/r/NOTES", "content": "looked at add\n"},
			map[string]any{"type": "exec", "command": "cat /workspace/r/NOTES"})
		if o := obs(r); o["stdout"] != "looked at add\n" {
			t.Errorf("write_file: %v", o)
		}
		r = step(map[string]any{"type": "apply_patch", "patch": "--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-x\n+y\n"})
		if o := obs(r); o["exit_code"] == 0.0 || o["stderr"] == "" {
			t.Errorf("bad patch: %v", o)
		}
		r = step(map[string]any{"type": "rm_rf"})
		if info, _ := r["info"].(map[string]any); info["error"] == nil || info["error"].(map[string]any)["code"] != "action.invalid" || r["done"] != false {
			t.Errorf("unknown action: %v", r)
		}
		if fix {
			r = step(map[string]any{"type": "apply_patch", "patch": repoFix})
			if o := obs(r); o["exit_code"] != 0.0 {
				t.Errorf("fix: %v", o)
			}
		}
		r = step(map[string]any{"type": "submit"})
		if r["done"] != true {
			t.Errorf("submit did not end the episode: %v", r)
		}
		f := call(t, srv, "POST", "/episodes/"+id+"/finish", nil)
		want(t, f, 200)
		return f.body, id
	}

	t.Run("fixed", func(t *testing.T) {
		res, id := run(t, true)
		if res["outcome"] != "success" {
			t.Fatalf("outcome: %v", res)
		}
		d := res["evaluation"].(map[string]any)["details"].(map[string]any)
		if f2p := d["fail_to_pass"].(map[string]any); f2p["test_m.T.test_add"] != "pass" {
			t.Errorf("fail_to_pass: %v", d)
		}
		if p2p := d["pass_to_pass"].(map[string]any); p2p["test_m.T.test_sub"] != "pass" {
			t.Errorf("pass_to_pass: %v", d)
		}
		checkShellRecording(t, srv, id)
	})
	t.Run("unfixed", func(t *testing.T) {
		res, _ := run(t, false)
		if res["outcome"] != "failure" {
			t.Fatalf("outcome: %v", res)
		}
		d := res["evaluation"].(map[string]any)["details"].(map[string]any)
		if f2p := d["fail_to_pass"].(map[string]any); f2p["test_m.T.test_add"] != "fail" {
			t.Errorf("fail_to_pass: %v", d)
		}
		if p2p := d["pass_to_pass"].(map[string]any); p2p["test_m.T.test_sub"] != "pass" {
			t.Errorf("pass_to_pass: %v", d)
		}
	})
}

// checkShellRecording checks the recording of the fixed run: kind shell,
// steps without screenshots whose action is what the policy sent and
// whose result is the shell observation, and an export in every format.
func checkShellRecording(t *testing.T, srv *testserver.Server, id string) {
	t.Helper()
	r := call(t, srv, "GET", "/recordings/"+id, nil)
	want(t, r, 200)
	m, _ := r.body["manifest"].(map[string]any)
	if m["kind"] != "shell" {
		t.Errorf("manifest kind: %v", m)
	}
	steps, _ := r.body["steps"].([]any)
	if len(steps) < 9 {
		t.Fatalf("%d steps recorded", len(steps))
	}
	s1 := steps[1].(map[string]any)
	if a, _ := s1["action"].(map[string]any); a["type"] != "exec" || a["cwd"] != "/workspace/r" {
		t.Errorf("step 1 action: %v", s1["action"])
	}
	res, _ := s1["result"].(map[string]any)
	for _, k := range []string{"stdout", "stderr", "exit_code", "duration_ms", "stdout_truncated", "stderr_truncated"} {
		if _, ok := res[k]; !ok {
			t.Errorf("step 1 result lacks %s: %v", k, res)
		}
	}
	for _, s := range steps {
		if shot := s.(map[string]any)["screenshot"]; shot != nil {
			t.Errorf("a shell step has a screenshot: %v", shot)
		}
	}
	magic := map[string]string{"jsonl": `{"type":"manifest"`, "parquet": "PAR1", "gif": "GIF89a", "html": "<!"}
	formats := []string{"jsonl", "parquet", "gif", "html"}
	if _, err := exec.LookPath("ffmpeg"); err == nil {
		formats = append(formats, "mp4")
	}
	for _, format := range formats {
		b, _ := getBody(t, srv, "/recordings/"+id+"/export?format="+format)
		if m := magic[format]; len(b) == 0 || !strings.HasPrefix(strings.TrimSpace(string(b[:min(len(b), 64)])), m) && format != "mp4" {
			t.Errorf("export %s: %.64q", format, b)
		}
	}
}

// A shell episode branches like any other: each branch has the files the
// parent wrote so far, continues from its step, and goes its own way.
func TestShellEpisodeFork(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	task := map[string]any{"id": "fork", "question": "Write ok to out.", "setup": map[string]any{"sandbox": map[string]any{"kind": "shell", "block_network": true}},
		"eval": map[string]any{"type": "exec", "command": "cat /workspace/out", "text": "ok"}}
	e := call(t, srv, "POST", "/episodes", map[string]any{"task": task})
	want(t, e, 200)
	id := e.body["episode_id"].(string)
	want(t, call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": map[string]any{"type": "write_file", "path": "/workspace/seen", "content": "parent"}}), 200)
	f := call(t, srv, "POST", "/episodes/"+id+"/fork", map[string]any{"count": 2})
	want(t, f, 200)
	branches, _ := f.body["branches"].([]any)
	if len(branches) != 2 {
		t.Fatalf("fork: %s", f.raw)
	}
	for i, b := range branches {
		b := b.(map[string]any)
		bid := b["episode_id"].(string)
		if info, _ := b["info"].(map[string]any); info["step"] != 1.0 {
			t.Errorf("branch %d info: %v", i, b["info"])
		}
		content := []string{"ok", "no"}[i]
		r := call(t, srv, "POST", "/episodes/"+bid+"/step", map[string]any{"actions": []any{
			map[string]any{"type": "exec", "command": "cat /workspace/seen; printf " + content + " > /workspace/out"},
			map[string]any{"type": "submit"}}})
		want(t, r, 200)
		if o, _ := r.body["observation"].(map[string]any); o["stdout"] != "parent" || r.body["done"] != true {
			t.Errorf("branch %d: %s", i, r.raw)
		}
		res := call(t, srv, "POST", "/episodes/"+bid+"/finish", nil)
		if w := []string{"success", "failure"}[i]; res.body["outcome"] != w {
			t.Errorf("branch %d outcome: %s", i, res.raw)
		}
	}
	call(t, srv, "DELETE", "/episodes/"+id, nil)
}

// A shell episode whose sandbox its client deleted reports it as the
// step's error (the client's, as for a browser episode), not as a
// command's output.
func TestShellEpisodeSandboxDeleted(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	task := map[string]any{"id": "gone", "question": "q", "setup": map[string]any{"sandbox": map[string]any{"kind": "shell", "block_network": true}},
		"eval": map[string]any{"type": "exec", "command": "true"}}
	e := call(t, srv, "POST", "/episodes", map[string]any{"task": task})
	want(t, e, 200)
	id, sb := e.body["episode_id"].(string), e.body["sandbox_id"].(string)
	want(t, call(t, srv, "DELETE", "/sandboxes/"+sb, nil), 200)
	r := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": map[string]any{"type": "exec", "command": "echo hi"}})
	want(t, r, 200)
	info, _ := r.body["info"].(map[string]any)
	if e, _ := info["error"].(map[string]any); e["code"] != "sandbox.not_found" {
		t.Fatalf("step on a deleted sandbox: %s", r.raw)
	}
	call(t, srv, "DELETE", "/episodes/"+id, nil)
}
