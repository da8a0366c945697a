package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/recordings"
)

// An export is written as it is made: the jsonl export of a recording
// with 48 MiB of screenshots (64 MiB of base64) arrives whole while the
// server's heap stays a fraction of it; it held the whole export before.
// An unknown format is still answered as an error.
func TestRecordingExportStreams(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	st, err := recordings.NewStore(filepath.Join(srv.StateDir, "recordings"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := st.Create(recordings.Manifest{ID: "big", Question: "stream me"})
	if err != nil {
		t.Fatal(err)
	}
	const steps, size = 24, 2 << 20
	img := make([]byte, size)
	for i := range img {
		img[i] = byte(i * 7)
	}
	for n := range steps {
		if err := w.Append(recordings.Step{N: n, URL: "about:blank"}, img, "png"); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(nil); err != nil {
		t.Fatal(err)
	}
	rec, err := st.Open("big")
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.New()
	if _, err := rec.Export(context.Background(), "jsonl", want); err != nil {
		t.Fatal(err)
	}

	if r := call(t, srv, "GET", "/recordings/big/export?format=tiff", nil); r.status != 400 {
		t.Fatalf("unknown format: %d %s", r.status, r.raw)
	}

	heapPeak := testenv.HeapPeak()
	req, _ := http.NewRequest("GET", srv.URL+"/recordings/big/export?format=jsonl", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	_, err = io.CopyBuffer(got, res.Body, make([]byte, 64<<10))
	res.Body.Close()
	grew := heapPeak()
	if err != nil || res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("export: %d %q %v", res.StatusCode, res.Header.Get("Content-Type"), err)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("the export that arrived is not the recording's jsonl export")
	}
	t.Logf("the heap grew by %d MiB at most", grew>>20)
	if grew > 40<<20 {
		t.Fatalf("exporting %d MiB of screenshots grew the heap by %d MiB", steps*size>>20, grew>>20)
	}
}
