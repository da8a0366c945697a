package server_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	goruntime "runtime"
	"testing"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// A download passes the agent's answer on as it streams: the server holds
// no copy of the file, decoded or encoded. The bytes that arrive are the
// FileContent of ORCHARD_COMPAT §3.15, checked by hash against the file.
func TestDownloadStreams(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "512Mi"})
	const size = 48 << 20
	// A file made in the sandbox: an upload would pass through this
	// process too.
	r := call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{
		"command": fmt.Sprintf("head -c %d /dev/zero | tr '\\0' 'o' > /workspace/big", size), "wait": true})
	if r.status != 200 || r.body["exit_code"] != float64(0) {
		t.Fatalf("make the file: %s", r.raw)
	}
	content := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("o"), size))
	want := sha256.Sum256([]byte(`{"path":"/workspace/big","content":"` + content + `","size":` + fmt.Sprint(size) + "}\n"))
	content = ""

	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/"+id+"/files?path=/workspace/big", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	goruntime.GC()
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	_, err = io.CopyBuffer(h, res.Body, make([]byte, 64<<10))
	res.Body.Close()
	goruntime.ReadMemStats(&after)
	if err != nil || res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("download: %d %q %v", res.StatusCode, res.Header.Get("Content-Type"), err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
		t.Fatal("the download is not the file's FileContent")
	}
	// Holding the file would allocate its 48 MiB and the 64 MiB of its
	// encoding at least; streaming allocates buffers.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Fatalf("a %d MiB download allocated %d MiB in the server", size>>20, alloc>>20)
	}
}
