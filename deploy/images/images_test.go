package main

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// The sandbox tests run images on the local runtime, whose containers
// start by re-executing the test binary.
func TestMain(m *testing.M) { testserver.Main(m) }

// buildTimeout bounds one image build: the desktop image downloads about
// 150 MB of packages on a cold cache and compresses about 1 GB.
const buildTimeout = 10 * time.Minute

// buildImage builds the image named name as the command does.
func buildImage(t *testing.T, name string) v1.Image {
	t.Helper()
	spec, err := lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.seeds())+len(spec.DataPackages) > 0 {
		requireDebian(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	o, err := options(ctx, os.Getenv, "", log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(o.Work) })
	start := time.Now()
	img, err := build(ctx, spec, o)
	if err != nil {
		t.Fatal(err)
	}
	// Digest reads the layer, which lives in o.Work until cleanup.
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s %s in %s", name, d, time.Since(start).Round(time.Millisecond))
	return img
}

// requireDebian skips (or fails, with ORCHARD_TEST_REQUIRE=all) when the
// Debian mirror the host's apt uses is out of reach.
func requireDebian(t *testing.T) {
	t.Helper()
	c, err := net.DialTimeout("tcp", "deb.debian.org:80", 5*time.Second)
	if err == nil {
		c.Close()
	}
	testenv.Require(t, "network", err == nil, "deb.debian.org unreachable, the image's packages cannot be downloaded")
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Two builds from the same source and packages are the same image. The
// agent image is a Go build only; the shell image's case is in
// TestShellImage, which builds it anyway.
func TestReproducible(t *testing.T) {
	for _, name := range []string{"orchard-agent"} {
		t.Run(name, func(t *testing.T) {
			a, b := buildImage(t, name), buildImage(t, name)
			if da, db := digest(t, a), digest(t, b); da != db {
				t.Errorf("two builds: %s and %s", da, db)
			}
		})
	}
}

// The outputs hold the built image: a layout, an archive and a registry
// give back the digest the build printed.
func TestOutputs(t *testing.T) {
	img := buildImage(t, "orchard-agent")
	// The layer's digests, hashed while it was written, match its bytes
	// read back compressed and not.
	if err := validate.Image(img); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tag, _ := name.NewTag("orchard.local/orchard-agent:test")
	ctx := context.Background()
	for _, out := range []string{"oci:" + filepath.Join(dir, "layout"), "docker-archive:" + filepath.Join(dir, "agent.tar")} {
		// Twice: a rebuild replaces the layout's image.
		for range 2 {
			if err := write(ctx, out, tag, img); err != nil {
				t.Fatal(err)
			}
		}
	}
	lp, err := layout.FromPath(filepath.Join(dir, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Digest != digest(t, img) {
		t.Errorf("layout index %+v, want one image %s", m.Manifests, digest(t, img))
	}

	// A loopback registry is spoken to over plain HTTP without --insecure.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/orchard-agent:test"
	if err := pushImage(ctx, ref, false, img); err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Get(r, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if pulled.Digest != digest(t, img) {
		t.Errorf("pushed %s, registry has %s", digest(t, img), pulled.Digest)
	}

	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.Labels["org.opencontainers.image.revision"] == "" || cfg.Created.Unix() == 0 {
		t.Errorf("config: labels %v, created %v", cfg.Config.Labels, cfg.Created)
	}
}

// sandbox starts a server whose image directory holds img as a
// docker-archive and returns a client and a ready sandbox from it.
func sandbox(t *testing.T, ctx context.Context, img v1.Image) (*client.Client, string) {
	t.Helper()
	dir := t.TempDir()
	tag, _ := name.NewTag("orchard.local/test:latest")
	archive := filepath.Join(dir, "image.tar")
	if err := write(ctx, "docker-archive:"+archive, tag, img); err != nil {
		t.Fatal(err)
	}
	srv := testserver.Start(t, testserver.Options{ImageDirs: []string{dir}})
	c := client.New(srv.URL, srv.APIKey)
	resp, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "docker-archive:" + archive, BlockNetwork: client.Ptr(true)})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.WaitSandbox(ctx, resp.SandboxID, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Status != "ready" {
		t.Fatalf("sandbox from the image: %s %s", sb.Status, sb.StatusMessage)
	}
	return c, resp.SandboxID
}

// execOK runs cmd in the sandbox and returns its stdout; a non-zero exit
// fails the test.
func execOK(t *testing.T, ctx context.Context, c *client.Client, id, cmd string) string {
	t.Helper()
	job, err := c.Exec(ctx, id, api.ExecRequest{Command: client.Command(cmd), Wait: true, TimeoutSeconds: client.Ptr(120)})
	if err != nil {
		t.Fatal(err)
	}
	if job.ExitCode == nil || *job.ExitCode != 0 {
		t.Fatalf("%s: exit %v\nstdout: %s\nstderr: %s", cmd, job.ExitCode, job.Stdout, job.Stderr)
	}
	return job.Stdout
}

// The shell image is reproducible and runs what Orchard Env's sandbox
// image offers, on the local runtime.
func TestShellImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 300 MB image twice")
	}
	img := buildImage(t, "orchard-shell")
	t.Run("reproducible", func(t *testing.T) {
		if d1, d2 := digest(t, img), digest(t, buildImage(t, "orchard-shell")); d1 != d2 {
			t.Errorf("two builds: %s and %s", d1, d2)
		}
	})
	t.Run("sandbox", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c, id := sandbox(t, ctx, img)
		out := execOK(t, ctx, c, id, `git --version && python3 -c 'print(1)' && bash --version | head -1 && `+
			`python3 -c 'import ssl; print(len(ssl.create_default_context().get_ca_certs()) > 100)' && `+
			`dpkg -s git | grep -c '^Status: install ok installed' && awk 'BEGIN { print "awk" }' && id -un && grep -x /usr/bin/bash /etc/shells`)
		for _, want := range []string{"git version 2.", "\n1\n", "GNU bash, version 5.", "\nTrue\n", "\n1\nawk\nroot\n/usr/bin/bash\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})
}

// imagesEnv gates the browser and desktop images' tests: each builds an
// image of 350-400 MB in two to three minutes.
const imagesEnv = "ORCHARD_TEST_IMAGES"

func requireImagesEnv(t *testing.T) {
	t.Helper()
	if testing.Short() || os.Getenv(imagesEnv) != "1" {
		t.Skip("set " + imagesEnv + "=1 to build and run the browser and desktop images (minutes each)")
	}
}

// Chromium in the browser image starts headless and answers CDP.
func TestBrowserImage(t *testing.T) {
	requireImagesEnv(t)
	img := buildImage(t, "orchard-browser")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, id := sandbox(t, ctx, img)
	// bash's /dev/tcp is the HTTP client: the image has no curl.
	out := execOK(t, ctx, c, id, `chromium --headless --no-sandbox --disable-gpu --remote-debugging-port=9222 about:blank >/tmp/chromium.log 2>&1 &
for i in $(seq 100); do
  if exec 3<>/dev/tcp/127.0.0.1/9222; then
    # DevTools answers HTTP/1.1 only, and keeps the connection open.
    printf 'GET /json/version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
    timeout 5 cat <&3; exit 0
  fi 2>/dev/null
  sleep 0.2
done
cat /tmp/chromium.log; exit 1`)
	if !strings.Contains(out, `"Browser": "Chrome/`) || !strings.Contains(out, "webSocketDebuggerUrl") {
		t.Errorf("/json/version: %s", out)
	}
}

// Xvfb in the desktop image starts and serves its display; the window
// manager and the terminal the desktop starts are there.
func TestDesktopImage(t *testing.T) {
	requireImagesEnv(t)
	img := buildImage(t, "orchard-desktop")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, id := sandbox(t, ctx, img)
	out := execOK(t, ctx, c, id, `Xvfb :7 -screen 0 1024x768x24 -nolisten tcp >/tmp/xvfb.log 2>&1 &
for i in $(seq 100); do [ -S /tmp/.X11-unix/X7 ] && break; sleep 0.1; done
[ -S /tmp/.X11-unix/X7 ] || { cat /tmp/xvfb.log; exit 1; }
DISPLAY=:7 timeout 5 xterm -e true && echo xterm-ok
command -v openbox x11vnc chromium`)
	for _, want := range []string{"xterm-ok", "/usr/bin/openbox", "/usr/bin/x11vnc", "/usr/bin/chromium"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// A lock file pins what apt resolved: it is written on the first build,
// read back as is on the next, and refused when the spec names a package
// it lacks.
func TestLock(t *testing.T) {
	_, err := exec.LookPath("apt-get")
	testenv.Require(t, "apt", err == nil, "apt-get not in PATH")
	ctx := context.Background()
	spec, err := lookup("orchard-server")
	if err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(t.TempDir(), "server.lock")
	resolved, err := packages(ctx, spec, lock, false)
	if err != nil {
		t.Fatal(err)
	}
	read, err := packages(ctx, spec, lock, false)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(resolved, read) || len(read) == 0 {
		t.Errorf("lock gave %+v, resolved %+v", read, resolved)
	}
	for _, d := range read {
		if d.Data != (d.Name == "ca-certificates" || d.Name == "tzdata") || d.SHA256 == "" || d.Version == "" {
			t.Errorf("locked %+v", d)
		}
	}
	spec.Packages = append(spec.Packages, "git")
	if _, err := packages(ctx, spec, lock, false); err == nil || !strings.Contains(err.Error(), "lacks git") {
		t.Errorf("stale lock: %v", err)
	}
}
