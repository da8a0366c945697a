// Command kubeimage writes the container images of the local Kubernetes
// node (scripts/kube.sh up --node) as one docker-archive tarball, without
// Docker or a registry, for `ctr images import`:
//
//   - the sandbox image: the static program in ./pause at /pause;
//   - the agent image: a static bin/orchard-agent at /orchard-agent, which an
//     init container installs into a pod's emptyDir with
//     `/orchard-agent install PATH` (the image needs nothing else);
//   - the shell image: Debian's busybox-static at /bin/busybox with a link
//     per applet, so a pod's main container has sh, sleep, cat, ...
//
// These are the smallest images that prove the runtime on a node, built in
// seconds; the images users deploy (Debian-based, with git, python3,
// Chromium) come from deploy/images.
//
// Usage: go run ./scripts/kubeimage -out images.tar [-agent bin/orchard-agent]
// [-busybox /bin/busybox] [-pause-image ref] [-agent-image ref] [-shell-image ref]
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeimage:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kubeimage", flag.ContinueOnError)
	out := fs.String("out", "", "docker-archive tarball to write (required)")
	agent := fs.String("agent", "bin/orchard-agent", "static orchard-agent binary")
	busybox := fs.String("busybox", "/bin/busybox", "static busybox binary (Debian's busybox-static)")
	pauseRef := fs.String("pause-image", "orchard.local/pause:dev", "reference of the sandbox image")
	agentRef := fs.String("agent-image", "orchard.local/agent:dev", "reference of the agent image")
	shellRef := fs.String("shell-image", "orchard.local/shell:dev", "reference of the shell image")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("-out is required")
	}

	tmp, err := os.MkdirTemp("", "kubeimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	pause := filepath.Join(tmp, "pause")
	if err := buildPause(ctx, pause); err != nil {
		return fmt.Errorf("build pause: %w", err)
	}

	images := map[name.Reference]v1.Image{}
	for _, spec := range []struct {
		ref   string
		build func() (v1.Image, error)
	}{
		{*pauseRef, func() (v1.Image, error) { return binaryImage(pause, "/pause") }},
		{*agentRef, func() (v1.Image, error) { return agentImage(*agent, *busybox) }},
		{*shellRef, func() (v1.Image, error) { return shellImage(ctx, *busybox) }},
	} {
		ref, err := name.NewTag(spec.ref)
		if err != nil {
			return fmt.Errorf("image reference %q: %w", spec.ref, err)
		}
		img, err := spec.build()
		if err != nil {
			return fmt.Errorf("image %s: %w", spec.ref, err)
		}
		images[ref] = img
	}
	if err := tarball.MultiRefWriteToFile(*out+".tmp", images); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	return os.Rename(*out+".tmp", *out)
}

// buildPause compiles ./pause statically: the sandbox image has no libc.
func buildPause(ctx context.Context, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out,
		"github.com/orchard/orchard/scripts/kubeimage/pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// binaryImage is one static binary at path, run as the entrypoint.
func binaryImage(binary, path string) (v1.Image, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	var l layer
	l.base()
	l.file(path, 0o755, data)
	return l.image([]string{path})
}

// agentImage is the agent plus what an init container needs to copy it:
// `cp /orchard-agent /agent/` (and sh and ls to look around).
func agentImage(agent, busybox string) (v1.Image, error) {
	data, err := os.ReadFile(agent)
	if err != nil {
		return nil, err
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	var l layer
	l.base()
	l.file("/orchard-agent", 0o755, data)
	l.dir("/bin", 0o755)
	l.file("/bin/busybox", 0o755, bb)
	for _, applet := range []string{"cp", "sh", "ls", "chmod"} {
		l.symlink("/bin/"+applet, "busybox")
	}
	return l.image([]string{"/orchard-agent"})
}

// bashStatic is Debian's bash-static.
const bashStatic = "/bin/bash-static"

// shellImage is busybox with a link per applet in /bin: the links are what
// lets a container run `sh -c` or `sleep` by name.
func shellImage(ctx context.Context, busybox string) (v1.Image, error) {
	data, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	list, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	var l layer
	l.base()
	l.dir("/bin", 0o755)
	l.file("/bin/busybox", 0o755, data)
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" && !strings.Contains(applet, "/") {
			l.symlink("/bin/"+applet, "busybox")
		}
	}
	// Commands run through bash (as in Orchard Env's sandbox image):
	// Debian's static bash, when installed, is the image's bash.
	if b, err := os.ReadFile(bashStatic); err == nil {
		l.file("/bin/bash", 0o755, b)
	}
	return l.image([]string{"/bin/sh"})
}

// layer builds one uncompressed layer tarball in memory; the images are a
// few megabytes each. The fixed modification time keeps digests stable
// across runs for the same inputs.
type layer struct {
	buf bytes.Buffer
	tw  *tar.Writer
	err error
}

var epoch = time.Unix(0, 0)

func (l *layer) header(h *tar.Header, data []byte) {
	if l.err != nil {
		return
	}
	if l.tw == nil {
		l.tw = tar.NewWriter(&l.buf)
	}
	h.Name = strings.TrimPrefix(h.Name, "/")
	h.ModTime = epoch
	h.Format = tar.FormatPAX
	if l.err = l.tw.WriteHeader(h); l.err == nil && data != nil {
		_, l.err = l.tw.Write(data)
	}
}

func (l *layer) dir(path string, mode int64) {
	l.header(&tar.Header{Typeflag: tar.TypeDir, Name: path + "/", Mode: mode}, nil)
}

func (l *layer) file(path string, mode int64, data []byte) {
	l.header(&tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: mode, Size: int64(len(data))}, data)
}

func (l *layer) symlink(path, target string) {
	l.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: path, Linkname: target, Mode: 0o777}, nil)
}

// base is what programs expect of any root: a world-writable /tmp and a
// passwd and group file that name root and nobody.
func (l *layer) base() {
	l.dir("/tmp", 0o1777)
	l.dir("/root", 0o700)
	l.dir("/etc", 0o755)
	l.file("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
	l.file("/etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"))
}

func (l *layer) image(entrypoint []string) (v1.Image, error) {
	if l.err == nil {
		l.err = l.tw.Close()
	}
	if l.err != nil {
		return nil, l.err
	}
	data := l.buf.Bytes()
	lay, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, lay)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	// containerd imports only images for its own platform.
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = entrypoint
	cfg.Config.Env = []string{"PATH=/bin:/usr/bin:/sbin:/usr/sbin"}
	cfg.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cfg)
}
