package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// randomBytes is n deterministic pseudo-random bytes, made as they are read.
func randomBytes(seed byte, n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{seed}), n)
}

// postRaw sends body to the agent's upload route as it is.
func postRaw(t *testing.T, a *testAgent, body io.Reader) (int, []byte) {
	t.Helper()
	u, rt := a.HTTP()
	req, err := http.NewRequest("POST", u.String()+"/files/upload", body)
	if err != nil {
		t.Fatal(err)
	}
	res, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// TestUploadStreamsInTheAgent sends a 48 MiB file (64 MiB of base64 in
// an UploadRequest, as the server sends it) and checks that the agent's
// heap does not grow by anything like it: the agent's memory is the
// sandbox's, and a sandbox of 256 MiB must be able to take a file of
// 200.
func TestUploadStreamsInTheAgent(t *testing.T) {
	a := startAgent(t, nil)
	const n = 48 << 20
	pr, pw := io.Pipe()
	go func() {
		io.WriteString(pw, `{"path":"/big.bin","content":"`)
		enc := base64.NewEncoder(base64.StdEncoding, pw)
		_, err := io.Copy(enc, randomBytes(1, n))
		if err == nil {
			err = enc.Close()
		}
		if err == nil {
			_, err = io.WriteString(pw, `"}`)
		}
		pw.CloseWithError(err)
	}()
	grew := testenv.HeapPeak()
	status, body := postRaw(t, a, pr)
	peak := grew()
	if status != 200 {
		t.Fatalf("upload: %d %s", status, body)
	}
	f, err := os.Open(filepath.Join(a.root, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, want := sha256.New(), sha256.New()
	io.Copy(got, f)
	io.Copy(want, randomBytes(1, n))
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("the file is not what was sent")
	}
	t.Logf("a %d MiB upload grew the heap by %.1f MiB", n>>20, float64(peak)/(1<<20))
	if peak > 8<<20 {
		t.Fatalf("a %d MiB upload grew the heap by %d MiB", n>>20, peak>>20)
	}
}

// failingReader yields some bytes, then fails.
type failingReader struct {
	n   int
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, f.err
	}
	n := min(len(p), f.n)
	clear(p[:n])
	f.n -= n
	return n, nil
}

func TestUploadFrom(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	ctx := context.Background()
	for _, n := range []int64{0, 1, 2, 3, 4, 5, 24<<10 - 1, 24 << 10, 24<<10 + 1, 1<<20 + 7} {
		data, _ := io.ReadAll(randomBytes(byte(n), n))
		res, err := a.UploadFrom(ctx, "/w/f", iotestHalf(bytes.NewReader(data)), func() string { return "" })
		if err != nil || res.Size != n || !res.Success || res.Path != "/w/f" {
			t.Fatalf("%d bytes: %+v %v", n, res, err)
		}
		if got, _ := os.ReadFile(filepath.Join(a.root, "w/f")); !bytes.Equal(got, data) {
			t.Fatalf("%d bytes: the file holds %d other bytes", n, len(got))
		}
	}

	// The mode is asked for after the content: it may be learned late.
	mode := ""
	content := io.MultiReader(strings.NewReader("#!/bin/sh\n"), readFunc(func() { mode = "0750" }))
	if _, err := a.UploadFrom(ctx, "/w/run.sh", content, func() string { return mode }); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(a.root, "w/run.sh")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("mode: %v %v", fi.Mode(), err)
	}

	// Content that fails leaves nothing, and its error comes back as it is.
	broken := errors.New("the client went away")
	_, err := a.UploadFrom(ctx, "/w/broken", &failingReader{n: 1 << 20, err: broken}, func() string { return "" })
	if !errors.Is(err, broken) {
		t.Fatalf("UploadFrom with failing content: %v", err)
	}
	waitNoUploadLeft(t, filepath.Join(a.root, "w"), "broken")
}

// readFunc is an empty reader that calls f when read.
type readFunc func()

func (f readFunc) Read([]byte) (int, error) { f(); return 0, io.EOF }

// iotestHalf reads at most half of what is asked, at least one byte:
// blocks of every size reach the encoder.
func iotestHalf(r io.Reader) io.Reader { return halfReader{r} }

type halfReader struct{ r io.Reader }

func (h halfReader) Read(p []byte) (int, error) { return h.r.Read(p[:max(1, len(p)/2)]) }

// waitNoUploadLeft waits until dir holds no temporary upload file nor
// name: an abandoned upload is cleaned up when the agent sees its body
// break, which may come just after the client has returned.
func waitNoUploadLeft(t *testing.T, dir, name string) {
	t.Helper()
	for range 200 {
		left, _ := filepath.Glob(filepath.Join(dir, ".orchard-upload-*"))
		_, err := os.Stat(filepath.Join(dir, name))
		if len(left) == 0 && errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: an abandoned upload left files behind", dir)
}

// TestUploadBodies sends request bodies that the server never sends but
// that the agent must still answer right: other orders, repeated or
// missing members, broken JSON.
func TestUploadBodies(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	if err := os.MkdirAll(filepath.Join(a.root, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, body string
		status     int
		code       string
		file       string // a file that must then hold "hi"
	}{
		{"content first", `{"content":"aGk=","path":"/d/first"}`, 200, "", "d/first"},
		{"mode first", `{"mode":"0600","path":"/d/mode","content":"aGk="}`, 200, "", "d/mode"},
		{"null mode", `{"path":"/d/nullmode","content":"aGk=","mode":null}`, 200, "", "d/nullmode"},
		{"content first, invalid", `{"content":"a!k=","path":"/d/x"}`, 400, faults.CodeInvalidBase64, ""},
		{"content first, no path", `{"content":"aGk="}`, 400, faults.CodeValidation, ""},
		{"onto a directory", `{"path":"/d","content":"aGk="}`, 400, faults.CodeIsDirectory, ""},
		{"onto a directory, invalid base64", `{"path":"/d","content":"!"}`, 400, faults.CodeIsDirectory, ""},
		{"content twice", `{"path":"/d/x","content":"aGk=","content":"aGk="}`, 400, faults.CodeValidation, ""},
		{"path not a string", `{"path":["/d/x"],"content":"aGk="}`, 400, faults.CodeInvalidJSON, ""},
		{"content not a string", `{"path":"/d/x","content":5}`, 400, faults.CodeInvalidJSON, ""},
		{"bad mode after content", `{"path":"/d/x","content":"aGk=","mode":"rwx"}`, 400, faults.CodeValidation, ""},
		{"broken JSON", `{"path":"/d/x","content":"aGk="`, 400, faults.CodeInvalidJSON, ""},
		{"not an object", `"aGk="`, 400, faults.CodeInvalidJSON, ""},
		{"long path", `{"path":"/d/` + strings.Repeat("x", maxUploadField) + `","content":"aGk="}`, 400, faults.CodeValidation, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := postRaw(t, a, strings.NewReader(tt.body))
			if status != tt.status || (tt.code != "" && !strings.Contains(string(body), `"code":"`+tt.code+`"`)) {
				t.Fatalf("got %d %s, want %d %s", status, body, tt.status, tt.code)
			}
			if tt.file != "" {
				if b, err := os.ReadFile(filepath.Join(a.root, tt.file)); err != nil || string(b) != "hi" {
					t.Fatalf("%s: %q %v", tt.file, b, err)
				}
			}
		})
	}
	if fi, err := os.Stat(filepath.Join(a.root, "d/mode")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode before content: %v %v", fi.Mode(), err)
	}
	waitNoUploadLeft(t, filepath.Join(a.root, "d"), "x")
}
