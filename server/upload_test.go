package server_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/server"
)

// randomData is n deterministic pseudo-random bytes, produced as they are
// read: a test can send hundreds of megabytes without holding them.
func randomData(seed uint64, n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)}), n)
}

// sha256Hex is the hex SHA-256 of r's bytes.
func sha256Hex(t testing.TB, r io.Reader) string {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// uploadBody is an upload request whose content is data, base64-encoded as
// it is read, between head and tail (the JSON around the content string).
// Its length is known, as the SDK's is.
func uploadBody(head string, data io.Reader, n int64, tail string) (io.ReadCloser, int64) {
	pr, pw := io.Pipe()
	go func() {
		enc := base64.NewEncoder(base64.StdEncoding, pw)
		_, err := io.Copy(enc, data)
		if err == nil {
			err = enc.Close()
		}
		pw.CloseWithError(err)
	}()
	body := io.MultiReader(strings.NewReader(head), pr, strings.NewReader(tail))
	return struct {
		io.Reader
		io.Closer
	}{body, pr}, int64(len(head)) + int64(base64.StdEncoding.EncodedLen(int(n))) + int64(len(tail))
}

// postUpload sends an upload body and returns the status and the decoded
// answer. length < 0 sends the body chunked.
func postUpload(t testing.TB, hc *http.Client, url, key, id string, body io.ReadCloser, length int64) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/sandboxes/"+id+"/files", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = length
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("upload: %d %q", res.StatusCode, raw)
	}
	return res.StatusCode, m
}

// sandboxSHA256 is the SHA-256 of a file in the sandbox, computed there.
func sandboxSHA256(t testing.TB, srv *testserver.Server, id, path string) string {
	t.Helper()
	j := execWait(t, srv, id, map[string]any{"command": "sha256sum " + path})
	sum, _, _ := strings.Cut(j.Stdout, " ")
	if j.ExitCode == nil || *j.ExitCode != 0 || len(sum) != 64 {
		t.Fatalf("sha256sum %s: %+v", path, j)
	}
	return sum
}

// errorCode is the `error.code` of an error body.
func errorCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// TestUploadStreams uploads a 48 MiB file (64 MiB of base64 in JSON)
// and checks that the server's heap does not grow by anything like it:
// the body is decoded as it arrives and passed on to the sandbox's agent,
// never held. Held, it costs several times its size (the body, the
// decoded string, the agent request).
func TestUploadStreams(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "1Gi"})
	const n = 48 << 20
	body, length := uploadBody(`{"path":"/workspace/big.bin","content":"`, randomData(1, n), n, `"}`)

	grew := testenv.HeapPeak()
	status, res := postUpload(t, http.DefaultClient, srv.URL, srv.APIKey, id, body, length)
	peak := grew()
	if status != 200 || res["size"] != float64(n) || res["path"] != "/workspace/big.bin" || res["success"] != true {
		t.Fatalf("upload: %d %v", status, res)
	}
	if got, want := sandboxSHA256(t, srv, id, "/workspace/big.bin"), sha256Hex(t, randomData(1, n)); got != want {
		t.Fatalf("the file in the sandbox has SHA-256 %s, want %s", got, want)
	}
	t.Logf("a %d MiB upload (%d MiB body) grew the server's heap by %.1f MiB", n>>20, length>>20, float64(peak)/(1<<20))
	if peak > 16<<20 {
		t.Fatalf("a %d MiB upload grew the heap by %d MiB", n>>20, peak>>20)
	}
}

// TestUploadEdges sends uploads that are unusual in size, order or form,
// and checks the answer and, for those that succeed, the file, byte for
// byte.
func TestUploadEdges(t *testing.T) {
	const limit = 4 << 20
	srv := testserver.Start(t, testserver.Options{Server: server.Config{MaxBodyBytes: limit}})
	id := createReady(t, srv, map[string]any{"memory": "256Mi"})
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	random := func(seed uint64, n int) []byte {
		b, _ := io.ReadAll(randomData(seed, int64(n)))
		return b
	}
	big := random(7, 3<<20-60) // just under the limit once base64-encoded

	type check struct {
		status int
		code   string // error.code, for failures
		path   string // a file to compare with data, for successes
		data   []byte
	}
	cases := []struct {
		name  string
		body  string
		chunk bool // send without a Content-Length
		want  check
	}{
		{"empty file", `{"path":"/workspace/e/empty","content":""}`, false, check{200, "", "/workspace/e/empty", nil}},
		{"one byte", `{"path":"/workspace/e/one","content":"` + b64([]byte{0xff}) + `"}`, false, check{200, "", "/workspace/e/one", []byte{0xff}}},
		{"two bytes", `{"path":"/workspace/e/two","content":"` + b64([]byte{0, 1}) + `"}`, false, check{200, "", "/workspace/e/two", []byte{0, 1}}},
		{"three bytes", `{"path":"/workspace/e/three","content":"` + b64([]byte{1, 2, 3}) + `"}`, false, check{200, "", "/workspace/e/three", []byte{1, 2, 3}}},
		{"near the limit", `{"path":"/workspace/e/big","content":"` + b64(big) + `"}`, false, check{200, "", "/workspace/e/big", big}},
		{"near the limit, chunked", `{"path":"/workspace/e/bigc","content":"` + b64(big) + `"}`, true, check{200, "", "/workspace/e/bigc", big}},
		{"content before path", `{"content":"` + b64(random(2, 100000)) + `","path":"/workspace/e/first"}`, false, check{200, "", "/workspace/e/first", random(2, 100000)}},
		{"mode after content", `{"path":"/workspace/e/mode","content":"` + b64([]byte("#!/bin/sh\n")) + `","mode":"0700"}`, false, check{200, "", "/workspace/e/mode", []byte("#!/bin/sh\n")}},
		{"escaped JSON", `{"p\u0061th":"\/workspace\/e\/esc","content":"` + strings.ReplaceAll(b64([]byte("a?>b??c~")), "/", `\/`) + `"}`, false, check{200, "", "/workspace/e/esc", []byte("a?>b??c~")}},
		{"line-wrapped base64", `{"path":"/workspace/e/wrap","content":"` + b64(random(3, 120)[:60]) + `\n` + b64(random(3, 120)[60:]) + `"}`, false, check{200, "", "/workspace/e/wrap", random(3, 120)}},
		{"spaces, as Python's json.dumps writes", "{\"path\": \"/workspace/e/py\", \"content\": \"aGk=\"}\n", false, check{200, "", "/workspace/e/py", []byte("hi")}},
		{"extra members", `{"x":[1,{"content":2}],"path":"/workspace/e/extra","y":null,"content":"aGk="}`, false, check{200, "", "/workspace/e/extra", []byte("hi")}},

		// Orchard Env answers invalid base64 with a 500; the error object
		// says what it is.
		{"invalid base64", `{"path":"/workspace/e/bad","content":"!!!!"}`, false, check{500, faults.CodeInvalidBase64, "", nil}},
		{"invalid base64 late", `{"path":"/workspace/e/bad","content":"` + b64(big[:1<<20]) + `@"}`, false, check{500, faults.CodeInvalidBase64, "", nil}},
		{"unpadded base64", `{"path":"/workspace/e/bad","content":"YWJ"}`, false, check{500, faults.CodeInvalidBase64, "", nil}},
		{"invalid base64 before the path", `{"content":"*","path":"/workspace/e/bad"}`, false, check{500, faults.CodeInvalidBase64, "", nil}},
		{"not JSON", `{"path":"/workspace/e/bad","content":"aGk="`, false, check{422, faults.CodeInvalidJSON, "", nil}},
		{"not JSON after a large content", `{"path":"/workspace/e/bad","content":"` + b64(big[:1<<20]) + `",}`, false, check{422, faults.CodeInvalidJSON, "", nil}},
		{"trailing garbage", `{"path":"/workspace/e/bad","content":"aGk="} x`, false, check{422, faults.CodeInvalidJSON, "", nil}},
		{"empty body", ``, false, check{422, faults.CodeValidation, "", nil}},
		{"no path", `{"content":"aGk="}`, false, check{422, faults.CodeValidation, "", nil}},
		{"no content", `{"path":"/workspace/e/bad"}`, false, check{422, faults.CodeValidation, "", nil}},
		{"null content", `{"path":"/workspace/e/bad","content":null}`, false, check{422, faults.CodeValidation, "", nil}},
		{"content not a string", `{"path":"/workspace/e/bad","content":[1,2]}`, false, check{422, faults.CodeValidation, "", nil}},
		{"path not a string", `{"path":5,"content":"aGk="}`, false, check{422, faults.CodeValidation, "", nil}},
		{"not an object", `["path","content"]`, false, check{422, faults.CodeValidation, "", nil}},
		{"over the limit", `{"path":"/workspace/e/bad","content":"` + strings.Repeat("A", limit) + `"}`, false, check{413, faults.CodeTooLarge, "", nil}},
		{"over the limit, chunked", `{"path":"/workspace/e/bad","content":"` + strings.Repeat("A", limit) + `"}`, true, check{413, faults.CodeTooLarge, "", nil}},
		{"unknown sandbox", `{"path":"/workspace/e/bad","content":"aGk="}`, false, check{404, faults.CodeSandboxNotFound, "", nil}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := id
			if tc.name == "unknown sandbox" {
				sb = "nosuch"
			}
			length := int64(len(tc.body))
			if tc.chunk {
				length = -1
			}
			status, res := postUpload(t, http.DefaultClient, srv.URL, srv.APIKey, sb, io.NopCloser(strings.NewReader(tc.body)), length)
			if status != tc.want.status || (tc.want.code != "" && errorCode(res) != tc.want.code) {
				t.Fatalf("got %d %v, want %d %s", status, res, tc.want.status, tc.want.code)
			}
			if tc.want.path == "" {
				return
			}
			if res["size"] != float64(len(tc.want.data)) || res["success"] != true {
				t.Fatalf("answer %v, want size %d", res, len(tc.want.data))
			}
			dl := call(t, srv, "GET", "/sandboxes/"+id+"/files?path="+tc.want.path, nil)
			want(t, dl, 200)
			if dl.body["content"] != b64(tc.want.data) {
				t.Fatalf("downloaded %d bytes of base64, want %d", len(dl.body["content"].(string)), len(b64(tc.want.data)))
			}
		})
	}
	if j := execWait(t, srv, id, map[string]any{"command": "stat -c %a /workspace/e/mode; ls -A /workspace/e | grep -c orchard-upload; test ! -e /workspace/e/bad"}); j.Stdout != "700\n0\n" {
		t.Fatalf("mode of /workspace/e/mode, temp files left, no file for failed uploads: %q %q", j.Stdout, j.Stderr)
	}

	// A body cut short by its client leaves no file and no temp file.
	t.Run("truncated body", func(t *testing.T) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		part := `{"path":"/workspace/e/cut","content":"` + b64(big[:1<<20])
		fmt.Fprintf(conn, "POST /sandboxes/%s/files HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			id, srv.APIKey, len(part)+100, part)
		time.Sleep(200 * time.Millisecond)
		conn.Close()
		deadline := time.Now().Add(10 * time.Second)
		for {
			j := execWait(t, srv, id, map[string]any{"command": "ls -A /workspace/e | grep -c -e orchard-upload -e cut"})
			if j.Stdout == "0\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after a truncated upload: %q", j.Stdout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// TestUploadReadOnlyPaths: an upload where nothing can be written — the
// agent's own binary (a read-only bind mount), /proc/sys (read-only in
// every sandbox) and /sys — is refused as read-only, 403, not reported as
// a failure of the sandbox (500) or a missing file (404).
func TestUploadReadOnlyPaths(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "256Mi"})
	for _, path := range []string{
		"/.orchard/bin/orchard-agent",
		"/proc/sys/kernel/hostname",
		"/proc/sys/orchard-new",
		"/proc/sys/orchard-dir/new",
		"/proc/sys/net/../kernel/orchard-new",
		"/sys/orchard-new",
		"/sys/kernel/orchard-dir/new",
	} {
		t.Run(path, func(t *testing.T) {
			r := call(t, srv, "POST", "/sandboxes/"+id+"/files", map[string]any{"path": path, "content": "aGk="})
			e, _ := r.body["error"].(map[string]any)
			if r.status != 403 || e["code"] != faults.CodeReadOnly || e["category"] != string(faults.PermissionDenied) || e["source"] != string(faults.Client) {
				t.Fatalf("got %d %s, want 403 %s", r.status, r.raw, faults.CodeReadOnly)
			}
			if d, _ := r.body["detail"].(string); !strings.Contains(d, path) {
				t.Fatalf("detail %q does not name the path", d)
			}
		})
	}
	// The agent is untouched and nothing was left behind.
	if j := execWait(t, srv, id, map[string]any{"command": "ls -A /.orchard/bin"}); j.Stdout != "orchard-agent\n" {
		t.Fatalf("/.orchard/bin holds %q", j.Stdout)
	}
}
