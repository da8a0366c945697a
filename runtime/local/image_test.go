package local

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/runtime"
)

// tarEntry is one file of a test layer.
type tarEntry struct {
	name     string
	typ      byte
	body     string
	linkname string
	mode     int64
}

func buildTar(t testing.TB, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.linkname, Mode: e.mode, ModTime: time.Unix(1700000000, 0)}
		if h.Mode == 0 {
			h.Mode = 0o644
			if e.typ == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is a two-layer image: a base with busybox (when the host has
// busybox-static) and files, and a top layer that whites out one base file
// and makes one base directory opaque.
func testImage(t testing.TB) (v1.Image, bool) {
	t.Helper()
	base := []tarEntry{
		{name: "bin/", typ: tar.TypeDir},
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/motd", typ: tar.TypeReg, body: "hello from layer one\n"},
		{name: "etc/hidden", typ: tar.TypeReg, body: "whited out above\n"},
		{name: "etc/opaque/", typ: tar.TypeDir},
		{name: "etc/opaque/lower", typ: tar.TypeReg, body: "hidden by opaque dir\n"},
		{name: "etc/motd.link", typ: tar.TypeSymlink, linkname: "motd"},
		{name: "etc/motd.hard", typ: tar.TypeLink, linkname: "etc/motd"},
		{name: "proc/", typ: tar.TypeDir}, {name: "sys/", typ: tar.TypeDir}, {name: "dev/", typ: tar.TypeDir},
		{name: "tmp/", typ: tar.TypeDir, mode: 0o1777}, {name: "run/", typ: tar.TypeDir},
	}
	bb, err := os.ReadFile("/bin/busybox")
	busybox := err == nil
	if busybox {
		base = append(base, tarEntry{name: "bin/busybox", typ: tar.TypeReg, body: string(bb), mode: 0o755})
		for _, applet := range []string{"sh", "cat", "ls", "test", "echo"} {
			base = append(base, tarEntry{name: "bin/" + applet, typ: tar.TypeSymlink, linkname: "busybox"})
		}
	}
	top := []tarEntry{
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/.wh.hidden", typ: tar.TypeReg},
		{name: "etc/opaque/", typ: tar.TypeDir},
		{name: "etc/opaque/.wh..wh..opq", typ: tar.TypeReg},
		{name: "etc/opaque/upper", typ: tar.TypeReg, body: "from layer two\n"},
		{name: "app/", typ: tar.TypeDir},
	}
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, buildTar(t, base)), layerOf(t, buildTar(t, top)))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Env = []string{"PATH=/bin", "IMAGE_VAR=from-image"}
	cfg.Config.WorkingDir = "/app"
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img, busybox
}

// checkImageRoot asserts the sandbox's root is the test image.
func checkImageRoot(t *testing.T, l *Local, id string, busybox bool) {
	t.Helper()
	root := fmt.Sprintf("/proc/%d/root", l.initPID(t, id))
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	for p, want := range map[string]string{
		"/etc/motd":         "hello from layer one\n",
		"/etc/motd.link":    "hello from layer one\n",
		"/etc/motd.hard":    "hello from layer one\n",
		"/etc/opaque/upper": "from layer two\n",
	} {
		if got := read(p); got != want {
			t.Errorf("%s = %q; want %q", p, got, want)
		}
	}
	for _, p := range []string{"/etc/hidden", "/etc/opaque/lower", "/usr/bin", "/etc/passwd"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s visible in the image sandbox (%v); want hidden", p, err)
		}
	}
	pid := l.initPID(t, id)
	if cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); cwd != "/app" {
		t.Errorf("agent cwd = %q; want the image's WorkingDir /app", cwd)
	}
	env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	for _, kv := range []string{"IMAGE_VAR=from-image", "WORKING_DIR=/app", "PATH=/bin"} {
		if !strings.Contains("\x00"+string(env), "\x00"+kv+"\x00") {
			t.Errorf("agent env lacks %s: %q", kv, env)
		}
	}
	if busybox {
		out, code := l.execForTest(t, id, "/bin/sh", "-c", "cat /etc/motd; test -e /etc/hidden && echo HIDDEN-VISIBLE; ls /workspace >/dev/null && echo ws")
		if code != 0 || !strings.Contains(out, "hello from layer one") || strings.Contains(out, "HIDDEN-VISIBLE") || !strings.Contains(out, "ws") {
			t.Errorf("inside the image sandbox: code %d\n%s", code, out)
		}
	}
}

// countingRegistry is an in-process registry that counts requests.
type countingRegistry struct {
	srv  *httptest.Server
	hits atomic.Int64
}

func newRegistry(t testing.TB) *countingRegistry {
	r := &countingRegistry{}
	h := registry.New(registry.Logger(nopLogger()))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *countingRegistry) host() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }

func TestImages(t *testing.T) {
	_, err := os.Stat("/bin/busybox")
	testenv.Require(t, "busybox", err == nil, "install busybox-static to run commands inside image sandboxes")
	dir := t.TempDir()
	l := newLocal(t, func(c *Config) { c.ImageDirs = []string{dir} })
	img, busybox := testImage(t)

	// OCI layout with a ref annotation.
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	// Docker archive.
	tag, _ := name.NewTag("orchard/test:v1")
	archive := filepath.Join(dir, "image.tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	// Registry.
	reg := newRegistry(t)
	ref := reg.host() + "/orchard/test:v1"
	rref, _ := name.ParseReference(ref)
	if err := remote.Write(rref, img); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ name, image string }{
		{"OCILayout", "oci-layout:" + filepath.Join(dir, "layout") + "@v1"},
		{"OCILayoutOnly", "oci-layout:" + filepath.Join(dir, "layout")},
		{"DockerArchive", "docker-archive:" + archive},
		{"DockerArchiveTag", "docker-archive:" + archive + ":orchard/test:v1"},
		{"Registry", ref},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := strings.ToLower(tc.name)
			inst := create(t, l, runtime.Spec{ID: id, Image: tc.image})
			if inst.Image != tc.image {
				t.Errorf("Image = %q; want %q", inst.Image, tc.image)
			}
			checkImageRoot(t, l, id, busybox)
			if err := l.Delete(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			checkGone(t, l, id)
		})
	}

	t.Run("CachedResolution", func(t *testing.T) {
		before := reg.hits.Load()
		create(t, l, runtime.Spec{ID: "cached", Image: ref})
		if n := reg.hits.Load() - before; n != 0 {
			t.Errorf("second create of %s made %d registry requests; want 0", ref, n)
		}
		// A new Local on the same state dir resolves from the disk cache.
		l2, err := New(l.cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l2.Close() }) // after the Delete below

		create(t, l2, runtime.Spec{ID: "cached2", Image: ref})
		if n := reg.hits.Load() - before; n != 0 {
			t.Errorf("create after restart made %d registry requests; want 0", n)
		}
	})

	t.Run("ConcurrentPulls", func(t *testing.T) {
		// A fresh state dir: every create needs the layers at once.
		lc := newLocal(t)
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("pull-%d", i)
				_, errs[i] = lc.Create(ctxTimeout(t, 2*time.Minute), runtime.Spec{ID: id, Image: ref})
				t.Cleanup(func() { _ = lc.Delete(context.Background(), id) })
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("create #%d: %v", i, err)
			}
		}
		entries, _ := os.ReadDir(lc.images.layers)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if len(entries) != 2 {
			t.Errorf("layer cache = %v; want exactly the image's 2 layers, no temp dirs", names)
		}
	})
}

func TestImageErrors(t *testing.T) {
	dir := t.TempDir()
	l := newLocal(t, func(c *Config) { c.ImageDirs = []string{dir} })
	reg := newRegistry(t)

	// A docker archive whose layer is not a tar.
	garbage := layerOf(t, bytes.Repeat([]byte("not a tar "), 100))
	bad, err := mutate.AppendLayers(empty.Image, garbage)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("orchard/bad:v1")
	corrupt := filepath.Join(dir, "corrupt.tar")
	if err := tarball.WriteToFile(corrupt, tag, bad); err != nil {
		t.Fatal(err)
	}
	// A layer that writes outside its directory.
	evil, err := mutate.AppendLayers(empty.Image, layerOf(t, buildTar(t, []tarEntry{
		{name: "../../escaped", typ: tar.TypeReg, body: "x"},
	})))
	if err != nil {
		t.Fatal(err)
	}
	escape := filepath.Join(dir, "escape.tar")
	if err := tarball.WriteToFile(escape, tag, evil); err != nil {
		t.Fatal(err)
	}
	// Paths the server must not open, found only by Create when the
	// manager's check (CheckImage) is skipped.
	outside := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(outside, tag, evil); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "out.tar")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		image     string
		code      string
		cat       faults.Category
		retryable bool
	}{
		{"Not A Valid::Reference", faults.CodeImageRef, faults.InvalidRequest, false},
		{"oci-layout:relative/path", faults.CodeImageRef, faults.InvalidRequest, false},
		{"oci-layout:" + filepath.Join(dir, "nothing"), faults.CodeImageNotFound, faults.NotFound, false},
		{"docker-archive:" + filepath.Join(dir, "nothing.tar"), faults.CodeImageNotFound, faults.NotFound, false},
		{"docker-archive:" + corrupt + ":orchard/other:v9", faults.CodeImageNotFound, faults.NotFound, false},
		{reg.host() + "/orchard/missing:v1", faults.CodeImageNotFound, faults.NotFound, false},
		{"127.0.0.1:1/orchard/unreachable:v1", faults.CodeImagePull, faults.Unavailable, true},
		{"docker-archive:" + corrupt, faults.CodeImageUnpack, faults.Internal, false},
		{"docker-archive:" + escape, faults.CodeImageUnpack, faults.Internal, false},
		{"docker-archive:/etc/shadow", faults.CodeImagePathNotAllowed, faults.PermissionDenied, false},
		{"docker-archive:" + outside, faults.CodeImagePathNotAllowed, faults.PermissionDenied, false},
		{"docker-archive:" + filepath.Join(dir, "out.tar"), faults.CodeImagePathNotAllowed, faults.PermissionDenied, false},
		{"docker-archive:" + dir + "/../../etc/shadow", faults.CodeImagePathNotAllowed, faults.PermissionDenied, false},
		{"oci-layout:/", faults.CodeImagePathNotAllowed, faults.PermissionDenied, false},
		{"docker-archive:" + filepath.Join(dir, "fifo"), faults.CodeImagePathNotRegular, faults.InvalidRequest, false},
	} {
		t.Run(tc.image, func(t *testing.T) {
			_, err := l.Create(ctxTimeout(t, time.Minute), runtime.Spec{ID: "img-err", Image: tc.image})
			e := faults.Of(err)
			if err == nil || e.Code != tc.code || e.Category != tc.cat || e.Retryable != tc.retryable {
				t.Fatalf("Create(%s) = %v (%+v); want code %s, category %s, retryable %v", tc.image, err, e, tc.code, tc.cat, tc.retryable)
			}
			checkGone(t, l, "img-err")
		})
	}
	if _, err := os.Stat(filepath.Join(l.images.layers, "escaped")); err == nil {
		t.Errorf("a layer wrote outside the cache")
	}
	entries, _ := os.ReadDir(l.images.layers)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "tmp-") {
			t.Errorf("temporary layer dir %s left in the cache", e.Name())
		}
	}
}

func TestImageDirsValidated(t *testing.T) {
	state := t.TempDir()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"/", state, filepath.Join(state, "images"), filepath.Dir(state), "relative", "/nonexistent-orchard-dir", file} {
		t.Run(dir, func(t *testing.T) {
			if err := os.MkdirAll(filepath.Join(state, "images"), 0o700); err != nil {
				t.Fatal(err)
			}
			cfg := Config{StateDir: state, AgentPath: testenv.AgentBinary(t), ImageDirs: []string{dir}}
			if err := cfg.validate(); err == nil {
				t.Errorf("image directory %s accepted", dir)
			}
		})
	}
}
