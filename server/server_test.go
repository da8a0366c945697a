package server_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/internal/testing/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// call sends one request and decodes the JSON answer into a map.
type resp struct {
	status int
	header http.Header
	body   map[string]any
	raw    []byte
}

func call(t testing.TB, srv *testserver.Server, method, path string, body any, key ...string) resp {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		buf, _ := json.Marshal(b)
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	k := srv.APIKey
	if len(key) > 0 {
		k = key[0]
	}
	if k != "" {
		req.Header.Set("X-API-Key", k)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := resp{status: res.StatusCode, header: res.Header, raw: raw}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s %s: Content-Type %q, want JSON (body %s)", method, path, ct, raw)
	}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("%s %s: body is not a JSON object: %s", method, path, raw)
	}
	return r
}

// getBody GETs a path that answers other than JSON (an export, an image)
// and returns its body and content type; anything but 200 fails the test.
func getBody(t testing.TB, srv *testserver.Server, path string) ([]byte, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+path, nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
	}
	return b, res.Header.Get("Content-Type")
}

func want(t testing.TB, r resp, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.raw)
	}
}

func TestPublicAuthAndErrors(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	cases := []struct {
		name, method, path string
		body               any
		key                []string
		status             int
		detail             any // expected `detail`, nil = don't check
	}{
		{"root", "GET", "/", nil, []string{""}, 200, nil},
		{"health", "GET", "/health", nil, []string{""}, 200, nil},
		{"openapi public", "GET", "/openapi.json", nil, []string{""}, 200, nil},
		{"missing key", "GET", "/resources", nil, []string{""}, 401, "Missing API key. Please provide X-API-Key header."},
		{"wrong key", "GET", "/resources", nil, []string{"nope"}, 403, "Invalid API key"},
		{"auth before validation", "POST", "/sandboxes", map[string]any{"image": 5}, []string{""}, 401, nil},
		{"malformed JSON before auth", "POST", "/sandboxes", "{not json", []string{""}, 422, nil},
		// Only 64 KiB of a keyless body are read: past that it is refused
		// for its key, not buffered up to the limit a key holder has.
		{"large body without a key", "POST", "/sandboxes", "{" + strings.Repeat("x", 1<<20), []string{""}, 401, nil},
		{"large body with a wrong key", "POST", "/sandboxes", "{" + strings.Repeat("x", 1<<20), []string{"nope"}, 403, nil},
		{"large malformed body with the key", "POST", "/sandboxes", "{" + strings.Repeat("x", 1<<20), nil, 422, nil},
		{"resources", "GET", "/resources", nil, nil, 200, nil},
		{"unknown path", "GET", "/nope", nil, nil, 404, "Not Found"},
		{"wrong method", "PUT", "/health", nil, nil, 405, "Method Not Allowed"},
		{"unknown sandbox", "GET", "/sandboxes/doesnotexist", nil, nil, 404, "Sandbox doesnotexist not found"},
		{"unknown job", "GET", "/jobs/j-1", nil, nil, 404, "Job j-1 not found"},
		{"unknown job wait", "GET", "/jobs/j-1/wait?timeout=1", nil, nil, 404, "Job j-1 not found"},
		{"wait unknown", "GET", "/sandboxes/zz/wait?timeout=1", nil, nil, 404, "Sandbox zz not found"},
		{"wait bad timeout", "GET", "/sandboxes/zz/wait?timeout=abc", nil, nil, 422, nil},
		{"heartbeat unknown", "POST", "/sandboxes/zz/heartbeat", nil, nil, 404, "Sandbox zz not found"},
		{"exec unknown", "POST", "/sandboxes/zz/exec", map[string]any{"command": "true"}, nil, 404, "Sandbox zz not found"},
		{"delete unknown is fine", "DELETE", "/sandboxes/zz", nil, nil, 200, nil},
		{"create missing image", "POST", "/sandboxes", map[string]any{}, nil, 422, nil},
		{"create wrong type", "POST", "/sandboxes", map[string]any{"image": 5}, nil, 422, nil},
		{"create bad id", "POST", "/sandboxes", map[string]any{"image": "host", "sandbox_id": "Bad_ID"}, nil, 400, nil},
		{"create bad memory", "POST", "/sandboxes", map[string]any{"image": "host", "memory": "lots"}, nil, 422, nil},
		{"create unknown fault kind", "POST", "/sandboxes", map[string]any{"image": "host", "faults": map[string]any{"faults": []map[string]any{{"kind": "meteor", "p": 1}}}}, nil, 400, nil},
		{"create fault p out of range", "POST", "/sandboxes", map[string]any{"image": "host", "faults": map[string]any{"faults": []map[string]any{{"kind": "hang", "p": 2}}}}, nil, 400, nil},
		{"create oom fault without a memory limit", "POST", "/sandboxes", map[string]any{"image": "host", "memory": "2Gi", "faults": map[string]any{"faults": []map[string]any{{"kind": "oom", "p": 1}}}}, nil, 400, nil},
		{"create unknown browser engine", "POST", "/sandboxes", map[string]any{"image": "host", "kind": "browser", "browser": map[string]any{"engine": "firefox"}}, nil, 422, nil},
		{"create unknown kind", "POST", "/sandboxes", map[string]any{"image": "host", "kind": "quantum"}, nil, 501, nil},
		{"exec env not strings", "POST", "/sandboxes/zz/exec", map[string]any{"command": "true", "env": map[string]any{"A": 1}}, nil, 422, nil},
		{"exec missing command", "POST", "/sandboxes/zz/exec", map[string]any{}, nil, 422, nil},
		{"download missing path", "GET", "/sandboxes/zz/files", nil, nil, 422, nil},
		{"body array", "POST", "/sandboxes", "[1,2]", nil, 422, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := call(t, srv, tc.method, tc.path, tc.body, tc.key...)
			want(t, r, tc.status)
			if r.header.Get("X-Request-ID") == "" {
				t.Error("no X-Request-ID")
			}
			if tc.detail != nil && r.body["detail"] != tc.detail {
				t.Errorf("detail %v, want %v", r.body["detail"], tc.detail)
			}
			if tc.status >= 400 {
				e, ok := r.body["error"].(map[string]any)
				if !ok || e["code"] == "" || e["category"] == "" || e["source"] == "" {
					t.Errorf("error object missing or incomplete: %s", r.raw)
				}
			}
			if tc.status == 422 {
				if _, ok := r.body["detail"].([]any); !ok {
					t.Errorf("422 detail is not FastAPI's list: %s", r.raw)
				}
			}
		})
	}
	r := call(t, srv, "GET", "/", nil, "")
	if r.body["service"] != "sandbox-orchestrator" || r.body["version"] != "0.1.0" || r.body["status"] != "running" {
		t.Errorf("banner: %s", r.raw)
	}
	if r := call(t, srv, "GET", "/health", nil, ""); r.body["status"] != "healthy" {
		t.Errorf("health: %s", r.raw)
	}
}

func TestOpenAPICoversEveryRoute(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	r := call(t, srv, "GET", "/openapi.json", nil, "")
	want(t, r, 200)
	paths, _ := r.body["paths"].(map[string]any)
	engine := srv.HTTP.Config.Handler.(*gin.Engine)
	for _, rt := range engine.Routes() {
		p := rt.Path
		for _, seg := range strings.Split(p, "/") {
			if strings.HasPrefix(seg, ":") || strings.HasPrefix(seg, "*") {
				p = strings.Replace(p, seg, "{"+seg[1:]+"}", 1)
			}
		}
		item, ok := paths[p].(map[string]any)
		if !ok {
			t.Errorf("route %s %s missing from OpenAPI", rt.Method, p)
			continue
		}
		if _, ok := item[strings.ToLower(rt.Method)]; !ok {
			t.Errorf("method %s of %s missing from OpenAPI", rt.Method, p)
		}
	}
	if len(paths) < 15 {
		t.Errorf("only %d paths documented", len(paths))
	}
	// No request or response is an object of unknown shape, but where
	// it is free-form by design (freeForm says why).
	for _, where := range untypedSchemas(r.body) {
		t.Errorf("%s: untyped schema", where)
	}
}

// createReady creates a sandbox the way the SDK does (POST then /wait).
func createReady(t testing.TB, srv *testserver.Server, body map[string]any) string {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	if _, ok := body["image"]; !ok {
		body["image"] = "host"
	}
	if _, ok := body["block_network"]; !ok {
		body["block_network"] = true
	}
	r := call(t, srv, "POST", "/sandboxes", body)
	want(t, r, 200)
	for _, k := range []string{"sandbox_id", "namespace", "image", "block_network", "cpu", "memory", "timeout", "status"} {
		if _, ok := r.body[k]; !ok {
			t.Fatalf("create response lacks %q: %s", k, r.raw)
		}
	}
	if r.body["status"] != "pending" {
		t.Fatalf("create status %v, want pending", r.body["status"])
	}
	id := r.body["sandbox_id"].(string)
	// The SDK sends the echoed timeout as an integer, never in exponent form.
	timeout, _ := r.body["timeout"].(float64)
	w := call(t, srv, "GET", fmt.Sprintf("/sandboxes/%s/wait?timeout=%d", id, int64(timeout)), nil)
	want(t, w, 200)
	if w.body["ready"] != true || w.body["status"] != "ready" {
		t.Fatalf("wait: %s", w.raw)
	}
	return id
}

func execWait(t testing.TB, srv *testserver.Server, id string, body map[string]any) api.Job {
	t.Helper()
	body["wait"] = true
	r := call(t, srv, "POST", "/sandboxes/"+id+"/exec", body)
	want(t, r, 200)
	for _, k := range []string{"job_id", "sandbox_id", "command", "status", "created_at", "stdout", "stderr", "exit_code", "started_at", "completed_at", "error"} {
		if _, ok := r.body[k]; !ok {
			t.Fatalf("job lacks %q: %s", k, r.raw)
		}
	}
	var j api.Job
	if err := json.Unmarshal(r.raw, &j); err != nil {
		t.Fatal(err)
	}
	return j
}

func TestSandboxLifecycleSDKSequence(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"sandbox_id": "sdk-seq", "cpu": "1", "memory": "512Mi", "timeout": 120})
	if id != "sdk-seq" {
		t.Fatalf("id %q", id)
	}
	g := call(t, srv, "GET", "/sandboxes/"+id, nil)
	want(t, g, 200)
	if g.body["pod_name"] != "sandbox-sdk-seq" || g.body["cpu"] != "1" || g.body["memory"] != "512Mi" || g.body["ready"] != true {
		t.Fatalf("get: %s", g.raw)
	}
	if exp, _ := g.body["expires_at"].(float64); math.Abs(exp-g.body["created_at"].(float64)-2*3600) > 0.01 {
		t.Fatalf("expires_at is not created_at + the 2 h TTL: %s", g.raw)
	}
	if r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "sandbox_id": id}); r.status != 409 {
		t.Fatalf("duplicate id: %d %s", r.status, r.raw)
	}

	cases := []struct {
		name   string
		body   map[string]any
		status string
		code   int
		stdout string
		stderr string
		errMsg any
	}{
		{"echo", map[string]any{"command": "echo hello"}, "succeeded", 0, "hello\n", "", nil},
		{"list command joined unquoted", map[string]any{"command": []string{"echo", "a", "b"}}, "succeeded", 0, "a b\n", "", nil},
		{"stderr and exit", map[string]any{"command": "echo out; echo err >&2; exit 3"}, "failed", 3, "out\n", "err\n", nil},
		{"default cwd", map[string]any{"command": "pwd"}, "succeeded", 0, "/workspace\n", "", nil},
		{"env", map[string]any{"command": "echo $FOO", "env": map[string]string{"FOO": "bar"}}, "succeeded", 0, "bar\n", "", nil},
		{"invalid utf8 replaced per byte", map[string]any{"command": `printf 'a\xff\xfeb'`}, "succeeded", 0, "a\uFFFD\uFFFDb", "", nil},
		{"timeout", map[string]any{"command": "echo partial; sleep 30", "timeout_seconds": 1}, "failed", 124, "partial\n",
			"\nCommand timed out after 1s and was killed", "Command timed out after 1s"},
		{"login shell", map[string]any{"command": "echo $0", "login_shell": true}, "succeeded", 0, "bash\n", "", nil},
		{"login shell stderr re-joined", map[string]any{"command": "echo err >&2", "login_shell": true}, "succeeded", 0, "", "err", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := execWait(t, srv, id, tc.body)
			if j.Status != tc.status || j.ExitCode == nil || *j.ExitCode != tc.code || j.Stdout != tc.stdout {
				t.Fatalf("got status=%s exit=%v stdout=%q stderr=%q", j.Status, j.ExitCode, j.Stdout, j.Stderr)
			}
			if tc.name != "login shell" && j.Stderr != tc.stderr {
				t.Fatalf("stderr %q, want %q", j.Stderr, tc.stderr)
			}
			if tc.errMsg != nil && (j.Error == nil || *j.Error != tc.errMsg) {
				t.Fatalf("error %v, want %v", j.Error, tc.errMsg)
			}
			if j.StartedAt == nil || j.CompletedAt == nil || *j.CompletedAt < *j.StartedAt {
				t.Fatalf("timestamps: %+v", j)
			}
		})
	}

	// wait:false → queued, then poll /jobs/{id} as the SDK does.
	r := call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "sleep 0.2; echo later"})
	want(t, r, 200)
	if r.body["status"] != "queued" || r.body["job_id"] == "" {
		t.Fatalf("no-wait exec: %s", r.raw)
	}
	jobID := r.body["job_id"].(string)
	w := call(t, srv, "GET", "/jobs/"+jobID+"/wait?timeout=30", nil)
	want(t, w, 200)
	if w.body["status"] != "succeeded" || w.body["stdout"] != "later\n" {
		t.Fatalf("job wait: %s", w.raw)
	}
	// A job wait that times out answers 200 with the running state.
	r = call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "sleep 3"})
	jobID = r.body["job_id"].(string)
	w = call(t, srv, "GET", "/jobs/"+jobID+"/wait?timeout=1", nil)
	want(t, w, 200)
	if w.body["status"] != "running" && w.body["status"] != "queued" {
		t.Fatalf("job wait timeout: %s", w.raw)
	}

	// Execs of one sandbox are serialised: the second starts after the first ends.
	j1 := call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "sleep 0.5; date +%s.%N"})
	j2 := execWait(t, srv, id, map[string]any{"command": "date +%s.%N"})
	first := call(t, srv, "GET", "/jobs/"+j1.body["job_id"].(string)+"/wait?timeout=30", nil)
	if first.body["completed_at"].(float64) > *j2.StartedAt {
		t.Fatalf("jobs overlapped: first completed %v, second started %v", first.body["completed_at"], *j2.StartedAt)
	}

	hb := call(t, srv, "POST", "/sandboxes/"+id+"/heartbeat", nil)
	want(t, hb, 200)
	if hb.body["status"] != "ok" || hb.body["sandbox_id"] != id {
		t.Fatalf("heartbeat: %s", hb.raw)
	}
	if g := call(t, srv, "GET", "/sandboxes/"+id, nil); g.body["last_heartbeat"] == nil {
		t.Fatalf("heartbeat not recorded: %s", g.raw)
	}
	l := call(t, srv, "GET", "/sandboxes", nil)
	if sbs, _ := l.body["sandboxes"].([]any); len(sbs) != 1 {
		t.Fatalf("list: %s", l.raw)
	}

	d := call(t, srv, "DELETE", "/sandboxes/"+id, nil)
	want(t, d, 200)
	if d.body["status"] != "deleted" || d.body["sandbox_id"] != id {
		t.Fatalf("delete: %s", d.raw)
	}
	want(t, call(t, srv, "GET", "/sandboxes/"+id, nil), 404)
	want(t, call(t, srv, "DELETE", "/sandboxes/"+id, nil), 200)
}

func TestFilesAndPatch(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "512Mi"})
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

	up := call(t, srv, "POST", "/sandboxes/"+id+"/files", map[string]any{"path": "/workspace/a/b/hello.txt", "content": b64("hi there\n")})
	want(t, up, 200)
	if up.body["success"] != true || up.body["path"] != "/workspace/a/b/hello.txt" || up.body["size"] != 9.0 {
		t.Fatalf("upload: %s", up.raw)
	}
	dl := call(t, srv, "GET", "/sandboxes/"+id+"/files?path=/workspace/a/b/hello.txt", nil)
	want(t, dl, 200)
	if dl.body["content"] != b64("hi there\n") || dl.body["size"] != 9.0 {
		t.Fatalf("download: %s", dl.raw)
	}
	if j := execWait(t, srv, id, map[string]any{"command": "cat /workspace/a/b/hello.txt"}); j.Stdout != "hi there\n" {
		t.Fatalf("exec sees %q", j.Stdout)
	}
	ls := call(t, srv, "GET", "/sandboxes/"+id+"/files/list?path=/workspace/a", nil)
	want(t, ls, 200)
	files := ls.body["files"].([]any)
	if len(files) != 1 || files[0].(map[string]any)["name"] != "b" || files[0].(map[string]any)["type"] != "directory" {
		t.Fatalf("list: %s", ls.raw)
	}
	if r := call(t, srv, "GET", "/sandboxes/"+id+"/files/list", nil); r.body["path"] != "/workspace" {
		t.Fatalf("default list path: %s", r.raw)
	}
	r := call(t, srv, "GET", "/sandboxes/"+id+"/files?path=/workspace/missing", nil)
	want(t, r, 404)
	if r.body["detail"] != "File not found: /workspace/missing" {
		t.Fatalf("missing file detail: %s", r.raw)
	}
	r = call(t, srv, "GET", "/sandboxes/"+id+"/files/list?path=/nope", nil)
	want(t, r, 404)
	if r.body["detail"] != "Path not found: /nope" {
		t.Fatalf("missing dir detail: %s", r.raw)
	}
	// Invalid base64 is a 500 in Orchard Env; the error object says why.
	want(t, call(t, srv, "POST", "/sandboxes/"+id+"/files", map[string]any{"path": "/workspace/x", "content": "!!!"}), 500)

	// apply_patch: -p1 from /workspace with git apply.
	execWait(t, srv, id, map[string]any{"command": "printf 'one\\ntwo\\n' > /workspace/f.txt"})
	patch := "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+three\n"
	p := call(t, srv, "POST", "/sandboxes/"+id+"/apply_patch", map[string]any{"patch": patch})
	want(t, p, 200)
	if p.body["success"] != true || p.body["exit_code"] != 0.0 {
		t.Fatalf("patch: %s", p.raw)
	}
	if j := execWait(t, srv, id, map[string]any{"command": "cat /workspace/f.txt"}); j.Stdout != "one\nthree\n" {
		t.Fatalf("patched file %q", j.Stdout)
	}
	p = call(t, srv, "POST", "/sandboxes/"+id+"/apply_patch", map[string]any{"patch": patch})
	want(t, p, 200)
	if p.body["success"] != false || p.body["exit_code"] == 0.0 || p.body["stderr"] == "" {
		t.Fatalf("failing patch: %s", p.raw)
	}
}

func TestFileOpsOnFailedSandbox(t *testing.T) {
	images := t.TempDir()
	srv := testserver.Start(t, testserver.Options{ImageDirs: []string{images}})
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "oci-layout:" + images + "/nonexistent", "block_network": true})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil)
	want(t, w, 200)
	if w.body["status"] != "failed" || w.body["status_message"] == "" {
		t.Fatalf("bad image wait: %s", w.raw)
	}
	up := call(t, srv, "POST", "/sandboxes/"+id+"/files", map[string]any{"path": "/x", "content": ""})
	want(t, up, 400)
	if up.body["detail"] != "Sandbox "+id+" is not ready" {
		t.Fatalf("not-ready detail: %s", up.raw)
	}
	ex := call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "true", "wait": true})
	want(t, ex, 404)
	if ex.body["detail"] != "Sandbox "+id+" agent not ready" {
		t.Fatalf("agent-not-ready detail: %s", ex.raw)
	}
}

func TestWaitTimeout408(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": stuckRegistry(t) + "/stuck:latest", "block_network": true})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	start := time.Now()
	w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=1", nil)
	want(t, w, 408)
	if w.body["detail"] != fmt.Sprintf("Sandbox %s did not become ready within 1s", id) {
		t.Fatalf("408 detail: %s", w.raw)
	}
	if el := time.Since(start); el < time.Second || el > 5*time.Second {
		t.Fatalf("wait returned after %v", el)
	}
	g := call(t, srv, "GET", "/sandboxes/"+id, nil)
	if g.body["status"] != "pending" || g.body["ready"] != false {
		t.Fatalf("pending sandbox: %s", g.raw)
	}
	// The SDK deletes after a 408; the pending create is abandoned.
	want(t, call(t, srv, "DELETE", "/sandboxes/"+id, nil), 200)
	want(t, call(t, srv, "GET", "/sandboxes/"+id, nil), 404)
}

// stuckRegistry is the address of a registry that accepts connections and
// never answers: a sandbox pulling from it stays pending as long as a test
// needs.
func stuckRegistry(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // guards conns
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String()
}
