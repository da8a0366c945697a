package agent

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// Uploading to an existing FIFO (or device node, or socket) must not
// replace that node with a regular file: /dev/null, a named pipe another
// process reads or a unix socket would be silently destroyed.
func TestUploadKeepsSpecialFiles(t *testing.T) {
	a := startAgent(t, nil)
	ws := filepath.Join(a.root, "workspace")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(ws, "pipe")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("pipe", filepath.Join(ws, "to-pipe")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/workspace/pipe", "/workspace/to-pipe"} {
		_, err := a.Upload(context.Background(), api.UploadRequest{Path: ptr(p), Content: b64("data")})
		fi, lerr := os.Lstat(fifo)
		if lerr != nil {
			t.Fatal(lerr)
		}
		if fi.Mode()&os.ModeNamedPipe == 0 {
			t.Fatalf("upload onto a FIFO replaced it with %v (upload err %v)", fi.Mode(), err)
		}
		wantFault(t, err, 400, faults.InvalidRequest, faults.CodeNotRegular)
	}
	if left, _ := filepath.Glob(filepath.Join(ws, ".orchard-upload-*")); len(left) != 0 {
		t.Fatalf("temp files left: %v", left)
	}
}

// Files whose stat size is 0 but that have content (procfs, most pseudo
// files) must come back whole, as Orchard's open().read() returns them.
func TestDownloadPseudoFile(t *testing.T) {
	a := startAgent(t, func(c *Config) { c.Root = "/" })
	fc, err := a.Download(context.Background(), "/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	b, err := base64.StdEncoding.DecodeString(fc.Content)
	if err != nil || fc.Size == 0 || int64(len(b)) != fc.Size || !strings.Contains(string(b), "Pid:") {
		t.Fatalf("download of /proc/self/status = size %d, content %q (%v); want its text", fc.Size, b, err)
	}
}
