package server_test

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// POST /sandboxes without an image is a 422 (ORCHARD_COMPAT §3.4: image is
// required), whatever else the body holds; null is not a string either.
func TestCreateWithoutImage(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	for _, body := range []string{
		`{"block_network":true,"sandbox_id":"image"}`,
		`{"block_network":true,"labels":{"image":"x"}}`,
		`{"block_network":true,"image":null}`,
	} {
		r := call(t, srv, "POST", "/sandboxes", body)
		if r.status == 200 {
			call(t, srv, "DELETE", "/sandboxes/"+r.body["sandbox_id"].(string), nil)
		}
		if r.status != 422 {
			t.Errorf("create %s: %d %s, want 422", body, r.status, r.raw)
			continue
		}
		if d, ok := r.body["detail"].([]any); !ok || len(d) != 1 {
			t.Errorf("create %s: 422 detail %s, want FastAPI's list", body, r.raw)
		}
	}
}

// busyboxImage is a one-layer image holding the host's static busybox as
// /bin/busybox and /bin/sh, and imageMotd in /etc/motd.
const imageMotd = "from the test image\n"

func busyboxImage(t testing.TB) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	testenv.Require(t, "busybox", err == nil, "install busybox-static to build test images")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))},
		{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777},
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/motd", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(imageMotd))},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		body := bb
		if h.Name == "etc/motd" {
			body = []byte(imageMotd)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", goruntime.GOARCH
	cfg.Config.Env = []string{"PATH=/bin"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// writeImages writes img into dir as a docker archive (image.tar) and an
// OCI layout (layout/).
func writeImages(t testing.TB, dir string, img v1.Image) {
	t.Helper()
	tag, _ := name.NewTag("orchard/test:v1")
	if err := tarball.WriteToFile(filepath.Join(dir, "image.tar"), tag, img); err != nil {
		t.Fatal(err)
	}
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
}

// Local image references (docker-archive:, oci-layout:) name files on the
// server: only those in its image directories may be opened, whatever
// symlinks or ".." the path holds, and only regular files (no device
// whose reads never end, no pipe that never opens). A refused path is
// the client's error, given at once by POST /sandboxes.
func TestCreateLocalImagePaths(t *testing.T) {
	allowed, outside := t.TempDir(), t.TempDir()
	img := busyboxImage(t)
	writeImages(t, allowed, img)
	writeImages(t, outside, img) // usable images, but not where the server reads them
	links := map[string]string{
		"inner.tar":  filepath.Join(allowed, "image.tar"),
		"out.tar":    filepath.Join(outside, "image.tar"),
		"shadow":     "/etc/shadow",
		"zero":       "/dev/zero",
		"out-layout": filepath.Join(outside, "layout"),
	}
	for link, target := range links {
		if err := os.Symlink(target, filepath.Join(allowed, link)); err != nil {
			t.Fatal(err)
		}
	}
	// A layout whose blobs are links to another layout's, outside.
	blobs := filepath.Join(allowed, "linked-layout", "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"index.json", "oci-layout"} {
		b, err := os.ReadFile(filepath.Join(outside, "layout", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(allowed, "linked-layout", f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(outside, "layout", "blobs", "sha256"))
	for _, e := range ents {
		if err := os.Symlink(filepath.Join(outside, "layout", "blobs", "sha256", e.Name()), filepath.Join(blobs, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(allowed, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := testserver.Start(t, testserver.Options{ImageDirs: []string{allowed}})

	notAllowed := func(image string) struct{ image, code string } {
		return struct{ image, code string }{image, faults.CodeImagePathNotAllowed}
	}
	notRegular := func(image string) struct{ image, code string } {
		return struct{ image, code string }{image, faults.CodeImagePathNotRegular}
	}
	for _, tc := range []struct{ image, code string }{
		notAllowed("docker-archive:/etc/shadow"),
		notAllowed("docker-archive:/dev/zero"),
		notAllowed("docker-archive:/"),
		notAllowed("oci-layout:/"),
		notAllowed("oci-layout:/etc"),
		notAllowed("docker-archive:" + filepath.Join(outside, "image.tar")),
		notAllowed("oci-layout:" + filepath.Join(outside, "layout")),
		notAllowed("docker-archive:" + filepath.Join(allowed, "out.tar")),
		notAllowed("docker-archive:" + filepath.Join(allowed, "out.tar") + ":orchard/test:v1"),
		notAllowed("docker-archive:" + filepath.Join(allowed, "shadow")),
		notAllowed("docker-archive:" + filepath.Join(allowed, "zero")),
		notAllowed("oci-layout:" + filepath.Join(allowed, "out-layout")),
		notAllowed("oci-layout:" + filepath.Join(allowed, "linked-layout")),
		notAllowed("docker-archive:" + allowed + "/../" + filepath.Base(outside) + "/image.tar"),
		notAllowed("docker-archive:" + allowed + "/../../../../../../etc/shadow"),
		notAllowed("oci-layout:" + allowed + "/layout/../../" + filepath.Base(outside) + "/layout"),
		notRegular("docker-archive:" + filepath.Join(allowed, "fifo")),
		notRegular("docker-archive:" + allowed),
		notRegular("oci-layout:" + filepath.Join(allowed, "image.tar")),
		{"docker-archive:image.tar", faults.CodeImageRef},
	} {
		t.Run(tc.image, func(t *testing.T) {
			r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": tc.image, "block_network": true})
			if r.status == 200 {
				call(t, srv, "DELETE", "/sandboxes/"+r.body["sandbox_id"].(string), nil)
			}
			e, _ := r.body["error"].(map[string]any)
			if r.status < 400 || r.status >= 500 || e["code"] != tc.code || e["source"] != "client" || e["retryable"] != false {
				t.Fatalf("POST /sandboxes: %d %s; want 4xx with code %s, source client", r.status, r.raw, tc.code)
			}
			if s := strings.ToLower(string(r.raw)); strings.Contains(s, "root:") || strings.Contains(s, "no such") {
				t.Errorf("the refusal tells about the host: %s", r.raw)
			}
		})
	}

	for _, image := range []string{
		"docker-archive:" + filepath.Join(allowed, "image.tar"),
		"docker-archive:" + filepath.Join(allowed, "image.tar") + ":orchard/test:v1",
		"docker-archive:" + filepath.Join(allowed, "inner.tar"), // a link that stays inside
		"oci-layout:" + filepath.Join(allowed, "layout"),
		"oci-layout:" + allowed + "/linked-layout/../layout",
	} {
		t.Run(image, func(t *testing.T) {
			id := createReady(t, srv, map[string]any{"image": image})
			if r := call(t, srv, "GET", "/sandboxes/"+id+"/files?path=/etc/motd", nil); r.status != 200 || r.body["content"] != base64.StdEncoding.EncodeToString([]byte(imageMotd)) {
				t.Errorf("/etc/motd in the sandbox of %s: %d %s", image, r.status, r.raw)
			}
			call(t, srv, "DELETE", "/sandboxes/"+id, nil)
		})
	}

	// A missing image in an image directory fails the sandbox, as an
	// unknown registry image does.
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "docker-archive:" + filepath.Join(allowed, "missing.tar"), "block_network": true})
	want(t, r, 200)
	w := call(t, srv, "GET", "/sandboxes/"+r.body["sandbox_id"].(string)+"/wait?timeout=60", nil)
	if w.body["status"] != "failed" {
		t.Errorf("sandbox of a missing archive: %s", w.raw)
	}
}
