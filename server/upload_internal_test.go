package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/jsonstream"
)

func TestUploadGate(t *testing.T) {
	g := newUploadGate(2, 50*time.Millisecond)
	ctx := context.Background()
	var releases []func()
	for _, length := range []int64{smallUpload + 1, -1} {
		release, err := g.acquire(ctx, length)
		if err != nil {
			t.Fatalf("turn for %d bytes: %v", length, err)
		}
		releases = append(releases, release)
	}
	// Small uploads never wait.
	for range 10 {
		release, err := g.acquire(ctx, smallUpload)
		if err != nil {
			t.Fatalf("a small upload waited: %v", err)
		}
		defer release()
	}
	start := time.Now()
	_, err := g.acquire(ctx, 200<<20)
	if f := faults.Of(err); f == nil || f.Code != faults.CodeUploadsBusy || f.Category != faults.Capacity || !f.Retryable {
		t.Fatalf("third large upload: %v", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("refused after %v, before its wait", waited)
	}
	// The refusal is a 503 with Retry-After, as every capacity error.
	gin.SetMode(gin.ReleaseMode)
	w := httptest.NewRecorder()
	c, _ := gin.CreateTestContext(w)
	c.Request = httptest.NewRequest("POST", "/sandboxes/x/files", nil)
	renderError(c, slog.New(slog.DiscardHandler), err)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("refusal: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}

	for _, release := range releases {
		release()
	}

	// A turn given back goes to the one waiting. The wait is long here:
	// a loaded machine must not turn it into a refusal.
	g = newUploadGate(1, time.Minute)
	release, err := g.acquire(ctx, -1)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		release, err := g.acquire(ctx, -1)
		if err == nil {
			release()
		}
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	release()
	if err := <-got; err != nil {
		t.Fatalf("waiting upload: %v", err)
	}
	// A caller that goes away stops waiting.
	release, _ = g.acquire(ctx, -1)
	defer release()
	cctx, cancel := context.WithCancelCause(ctx)
	gone := errors.New("client went away")
	cancel(gone)
	if _, err := g.acquire(cctx, -1); !errors.Is(err, gone) {
		t.Fatalf("canceled wait: %v", err)
	}
	// No bound.
	unbounded := newUploadGate(-1, 0)
	for range 100 {
		if _, err := unbounded.acquire(ctx, -1); err != nil {
			t.Fatal(err)
		}
	}
}

// FuzzUploadRequestAgrees: reading an upload body as it streams refuses
// and accepts what decoding it whole did (decodeJSON into UploadRequest,
// then the required fields), with the same 422s. Bodies that name a field
// twice are left out: the stream refuses them, where decoding whole kept
// the last.
func FuzzUploadRequestAgrees(f *testing.F) {
	for _, seed := range []string{
		`{"path":"/x","content":"aGk="}`, `{"content":"aGk=","path":"/x","mode":"0755"}`, `{"path":"/x"}`, `{"content":""}`,
		`{"path":5,"content":"x"}`, `{"path":"/x","content":[1]}`, `{"path":"/x","content":{}}`, `{"path":"/x","content":true}`,
		`{"path":"/x","content":null}`, `{"path":null,"content":"x"}`, `{"path":"/x","content":"x","mode":7}`, `{"PATH":"/x","Content":"x"}`,
		`{"other":[{"path":1}],"path":"/x","content":"x"}`, `[]`, `null`, `"s"`, `5`, `true`, ``, ` `, `{}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(bytes.Trim(body, " \t\r\n")) > 0 && !json.Valid(body) {
			return // refused as not JSON before decoding, both ways (jsonstream's own tests)
		}
		r := jsonstream.Reader{Stream: "content", Keep: []string{"path", "mode"}, MaxValue: maxUploadField}
		doc, err := r.Read(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if doc.Duplicate != "" {
			return
		}
		got, gerr := uploadRequest(doc)
		var want api.UploadRequest
		werr := decodeJSON(body, &want)
		if werr == nil {
			switch {
			case want.Path == nil:
				werr = faults.Validation(missingField("body", "path", nil))
			case want.Content == nil:
				werr = faults.Validation(missingField("body", "content", nil))
			}
		}
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("%q: streamed %v, whole %v", body, gerr, werr)
		}
		if werr != nil {
			g, w := faults.Of(gerr), faults.Of(werr)
			if g.StatusOf() != w.StatusOf() || g.Code != w.Code || g.Message != w.Message {
				t.Fatalf("%q: streamed %d %s %q, whole %d %s %q", body, g.StatusOf(), g.Code, g.Message, w.StatusOf(), w.Code, w.Message)
			}
			return
		}
		if *got.Path != *want.Path || got.Mode != want.Mode {
			t.Fatalf("%q: streamed %q %q, whole %q %q", body, *got.Path, got.Mode, *want.Path, want.Mode)
		}
	})
}
