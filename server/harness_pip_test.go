package server_test

import (
	"archive/zip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/harness"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// hermesWheel builds, in dir, a stand-in for the hermes-agent package
// from its source: a wheel is a zip of the modules with its metadata, so
// no build backend (setuptools, wheel) is needed, and pip installs it
// without an index. This proves the pip path (a Python runtime copied
// with its libraries, started by the store's loader) where no Python
// index is reachable.
func hermesWheel(t *testing.T, dir string) string {
	t.Helper()
	const dist = "hermes_agent-0.0.7.dist-info/"
	files := []struct{ name, body string }{
		{"hermes_cli.py", `import json, ssl, sys
def main():
    if sys.argv[1:] == ["--version"]:
        print("hermes-agent 0.0.7 (python %d.%d, %s)" % (sys.version_info[0], sys.version_info[1], ssl.OPENSSL_VERSION))
        return 0
    print(json.dumps(sys.argv[1:]))
    return 0
`},
		{dist + "METADATA", "Metadata-Version: 2.1\nName: hermes-agent\nVersion: 0.0.7\n"},
		{dist + "WHEEL", "Wheel-Version: 1.0\nGenerator: orchard-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{dist + "entry_points.txt", "[console_scripts]\nhermes = hermes_cli:main\n"},
	}
	p := filepath.Join(dir, "hermes_agent-0.0.7-py3-none-any.whl")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	var record strings.Builder
	for _, fl := range files {
		w, err := zw.Create(fl.name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(w, fl.body); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(fl.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", fl.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(fl.body))
	}
	record.WriteString(dist + "RECORD,,\n")
	w, err := zw.Create(dist + "RECORD")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(w, record.String()); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// A pip harness installed from a source folder runs in a busybox-only
// sandbox (no Python, no glibc) with the store's Python.
func TestHarnessPip(t *testing.T) {
	_, err := exec.LookPath("python3")
	pipOK := err == nil && exec.Command("python3", "-m", "pip", "--version").Run() == nil
	testenv.Require(t, "pip", pipOK, "python3 with pip installs pip harnesses (apt-get install python3-pip)")
	src := hermesWheel(t, t.TempDir())
	s := &harness.Store{Dir: t.TempDir(), PipSource: map[string]string{"hermes": src}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := s.Install(ctx, []string{"hermes"}); err != nil {
		t.Fatal(err)
	}
	hs, err := s.List()
	if err != nil || len(hs) != 1 || hs[0].Name != "hermes" || hs[0].Version != "0.0.7" {
		t.Fatalf("store after installing hermes: %+v, %v", hs, err)
	}
	if lock, _ := s.ReadLock(); lock["hermes"] != "" {
		t.Errorf("a harness from a source folder was pinned in the lock file: %v", lock)
	}
	images := t.TempDir()
	writeImages(t, images, busyboxImage(t))
	srv := testserver.Start(t, testserver.Options{ImageDirs: []string{images}, HarnessDir: s.Dir})
	id := createReady(t, srv, map[string]any{"image": "oci-layout:" + filepath.Join(images, "layout"), "harnesses": []string{"hermes"}})
	j := execWait(t, srv, id, map[string]any{"command": "hermes --version"})
	if j.ExitCode == nil || *j.ExitCode != 0 || !strings.HasPrefix(j.Stdout, "hermes-agent 0.0.7 (python 3.") || !strings.Contains(j.Stdout, "OpenSSL") {
		t.Errorf("hermes --version: exit %v, stdout %q, stderr %q", exitOf(j), j.Stdout, j.Stderr)
	}
	if j := execWait(t, srv, id, map[string]any{"command": "command -v python3 node"}); j.ExitCode == nil || *j.ExitCode == 0 {
		t.Errorf("the busybox image has python3 or node on PATH: %q", j.Stdout)
	}

	// Removing it writes a new generation: new creates cannot ask for it,
	// the running sandbox keeps the generation it started with.
	if err := s.Remove([]string{"hermes"}); err != nil {
		t.Fatal(err)
	}
	if hs, err := s.List(); err != nil || len(hs) != 0 {
		t.Errorf("store after rm hermes: %+v, %v", hs, err)
	}
	if r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "harnesses": []string{"hermes"}}); r.status != 422 {
		t.Errorf("create with a removed harness: %d %s, want 422", r.status, r.raw)
	}
	if j := execWait(t, srv, id, map[string]any{"command": "hermes --version"}); j.ExitCode == nil || *j.ExitCode != 0 {
		t.Errorf("hermes in the sandbox created before rm: exit %v, stderr %q", exitOf(j), j.Stderr)
	}
}
