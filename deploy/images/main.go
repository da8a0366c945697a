// Command images builds Orchard's container images without Docker:
// orchard-server, orchard-agent, orchard-shell, orchard-browser and
// orchard-desktop (spec.go), and orchard-harnesses from a harness store
// (--store, harnesses.go), into an OCI layout, a docker-archive tarball
// or a registry.
//
//	go run ./deploy/images [flags] NAME
//	  --out oci:DIR | docker-archive:FILE   (repeatable)
//	  --push REGISTRY/REPO:TAG [--insecure]
//	  --tag REPO:TAG                        (the archive's and layout's name)
//	  --lock FILE [--update-lock]           (pinned packages, JSON)
//	  --store STATE_DIR/harnesses           (orchard-harnesses only)
//
// The root filesystem is made from Debian packages the way distroless and
// apko make theirs, rather than with debootstrap or mmdebstrap: the host's
// apt resolves and pins the closure (its package lists are signed), the
// .debs are downloaded into a cache and checked against the lists'
// SHA256, and dpkg-deb streams each one's files straight into the layer.
// Nothing runs as root or in a chroot, no maintainer script runs (the few
// whose work matters are replaced, scripts.go), and the output depends on
// the inputs alone: a bootstrap tool would run the packages' scripts,
// which write logs, caches and times that must then be scrubbed, and
// needs root. The image digest is printed as the last line of stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// outputs are the repeatable --out flag.
type outputs []string

func (o *outputs) String() string     { return strings.Join(*o, ",") }
func (o *outputs) Set(v string) error { *o = append(*o, v); return nil }

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var outs outputs
	fs.Var(&outs, "out", "oci:DIR or docker-archive:FILE (repeatable)")
	push := fs.String("push", "", "REGISTRY/REPO:TAG to push to")
	insecure := fs.Bool("insecure", false, "push over plain HTTP (implied for localhost and 127.0.0.1)")
	tag := fs.String("tag", "", "name in the archive or layout (default orchard.local/NAME:latest)")
	cache := fs.String("cache", "", "directory of downloaded .debs (default ~/.cache/orchard/images/debs)")
	lock := fs.String("lock", "", "JSON file of pinned packages: built from when it exists, written otherwise")
	updateLock := fs.Bool("update-lock", false, "resolve the packages afresh and rewrite --lock")
	store := fs.String("store", "", "harness store folder (STATE_DIR/harnesses) the orchard-harnesses image is made of")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: images [--out oci:DIR|docker-archive:FILE]... [--push REF] NAME")
	}
	spec := Spec{Name: harnessesName}
	var err error
	if fs.Arg(0) != harnessesName {
		if spec, err = lookup(fs.Arg(0)); err != nil {
			return err
		}
	} else if *store == "" {
		return errors.New("orchard-harnesses is made of a harness store: give --store STATE_DIR/harnesses")
	}
	if len(outs) == 0 && *push == "" {
		return errors.New("nothing to do: give --out or --push")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	o, err := options(ctx, getenv, *cache, log)
	if err != nil {
		return err
	}
	defer os.RemoveAll(o.Work)
	o.Lock, o.UpdateLock = *lock, *updateLock
	if *tag == "" {
		*tag = "orchard.local/" + spec.Name + ":latest"
	}
	ref, err := name.NewTag(*tag)
	if err != nil {
		return fmt.Errorf("--tag %q: %w", *tag, err)
	}

	start := time.Now()
	var img v1.Image
	if spec.Name == harnessesName {
		img, err = harnessImage(*store, o.Epoch)
	} else {
		img, err = build(ctx, spec, o)
	}
	if err != nil {
		return fmt.Errorf("build %s: %w", spec.Name, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("build %s: %w", spec.Name, err)
	}
	log.Info("built", "image", spec.Name, "digest", digest, "took", time.Since(start).Round(time.Millisecond))
	for _, out := range outs {
		if err := write(ctx, out, ref, img); err != nil {
			return err
		}
		log.Info("wrote", "out", out)
	}
	if *push != "" {
		if err := pushImage(ctx, *push, *insecure, img); err != nil {
			return err
		}
		log.Info("pushed", "ref", *push)
	}
	_, err = fmt.Fprintln(stdout, digest)
	return err
}

// options gathers the build's inputs from the environment and the
// source tree.
func options(ctx context.Context, getenv func(string) string, cache string, log *slog.Logger) (Options, error) {
	root, err := gitOutput(ctx, "", "rev-parse", "--show-toplevel")
	if err != nil {
		return Options{}, fmt.Errorf("source tree: %w", err)
	}
	o := Options{Root: root, Cache: cache, Log: log}
	if o.Cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return Options{}, fmt.Errorf("cache directory: %w", err)
		}
		o.Cache = filepath.Join(dir, "orchard", "images", "debs")
	}
	if o.Revision, err = gitOutput(ctx, root, "rev-parse", "HEAD"); err != nil {
		return Options{}, err
	}
	if o.Version, err = gitOutput(ctx, root, "describe", "--always", "--dirty"); err != nil {
		return Options{}, err
	}
	// SOURCE_DATE_EPOCH as reproducible-builds.org defines it; otherwise
	// the commit's time, which the same source always has.
	epoch := getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		if epoch, err = gitOutput(ctx, root, "log", "-1", "--format=%ct"); err != nil {
			return Options{}, err
		}
	}
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return Options{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", epoch, err)
	}
	o.Epoch = time.Unix(secs, 0).UTC()
	if o.Work, err = os.MkdirTemp("", "orchard-images-"); err != nil {
		return Options{}, err
	}
	return o, nil
}

func gitOutput(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// write writes img to an --out destination.
func write(ctx context.Context, out string, ref name.Tag, img v1.Image) error {
	kind, dest, ok := strings.Cut(out, ":")
	if !ok || dest == "" {
		return fmt.Errorf("--out %q: want oci:DIR or docker-archive:FILE", out)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	switch kind {
	case "oci":
		lp, err := layout.FromPath(dest)
		if err != nil {
			if lp, err = layout.Write(dest, empty.Index); err != nil {
				return fmt.Errorf("write %s: %w", out, err)
			}
		}
		// One image per name: a rebuild replaces the previous one.
		ann := map[string]string{"org.opencontainers.image.ref.name": ref.String()}
		if err := lp.ReplaceImage(img, match.Annotation("org.opencontainers.image.ref.name", ref.String()), layout.WithAnnotations(ann)); err != nil {
			return fmt.Errorf("write %s: %w", out, err)
		}
		return nil
	case "docker-archive":
		// Through a private name: a reader never sees half an archive.
		tmp := dest + ".tmp"
		if err := tarball.WriteToFile(tmp, ref, img); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("write %s: %w", out, err)
		}
		return os.Rename(tmp, dest)
	default:
		return fmt.Errorf("--out %q: unknown kind %q (oci, docker-archive)", out, kind)
	}
}

// pushImage writes img to a registry with the credentials of the docker
// config; loopback registries are spoken to over plain HTTP.
func pushImage(ctx context.Context, ref string, insecure bool, img v1.Image) error {
	var opts []name.Option
	if insecure || isLoopback(ref) {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return fmt.Errorf("--push %q: %w", ref, err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}

func isLoopback(ref string) bool {
	host, _, _ := strings.Cut(ref, "/")
	h := host
	if i := strings.LastIndex(host, ":"); i >= 0 && !strings.HasSuffix(host, "]") {
		h = host[:i]
	}
	return h == "localhost" || h == "127.0.0.1" || h == "[::1]"
}
