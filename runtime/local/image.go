package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/faults"
)

// Image reference prefixes for images on the server's filesystem.
const (
	prefixOCILayout     = "oci-layout:"
	prefixDockerArchive = "docker-archive:"
)

// image is a resolved image, ready to mount.
type image struct {
	host       bool
	lowers     []string // overlay lower dirs, top layer first
	env        []string // KEY=VALUE from the image config
	workingDir string
}

// imageInfo is what a sandbox needs of an image config: kept per reference
// so that creating the same image again does not ask the registry.
type imageInfo struct {
	DiffIDs    []string `json:"diff_ids"` // bottom layer first
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// imageStore resolves references and keeps the unpacked layer cache:
// layers/<diffid hex>/fs holds a layer's files, layers/<hex>/.complete
// marks it usable; refs/<sha256 of reference>.json caches resolutions;
// locks/<diffid hex> is flocked while that layer is unpacked.
type imageStore struct {
	layers  string
	refs    string
	lockDir string // one lock file per layer, flocked while it is unpacked
	// dirs are the directories oci-layout: and docker-archive: references
	// may name (Config.ImageDirs, symlinks resolved).
	dirs []string
	log  *slog.Logger

	mu       sync.Mutex // guards resolved and locks
	resolved map[string]imageInfo
	locks    map[string]*sync.Mutex // per reference and per layer
}

func newImageStore(dir string, imageDirs []string, log *slog.Logger) (*imageStore, error) {
	s := &imageStore{
		layers:   filepath.Join(dir, "layers"),
		refs:     filepath.Join(dir, "refs"),
		lockDir:  filepath.Join(dir, "locks"),
		dirs:     imageDirs,
		log:      log,
		resolved: map[string]imageInfo{},
		locks:    map[string]*sync.Mutex{},
	}
	for _, d := range []string{s.layers, s.refs, s.lockDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	// Unpacks interrupted by a crash, but not those another server on this
	// state directory is making now: their layer's lock is held.
	stale, _ := filepath.Glob(filepath.Join(s.layers, "tmp-*"))
	for _, d := range stale {
		hex, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(d), "tmp-"), "-")
		if !ok || len(hex) != 64 {
			_ = os.RemoveAll(d) // an earlier version's
			continue
		}
		if f, err := s.layerFileLock(hex, unix.LOCK_EX|unix.LOCK_NB); err == nil {
			_ = os.RemoveAll(d)
			f.Close()
		}
	}
	return s, nil
}

// layerFileLock flocks the lock file of layer hex (how: LOCK_EX, maybe
// LOCK_NB): other server processes on the same state directory share the
// cache, and the in-process mutexes do not reach them. Closing the file
// releases the lock.
func (s *imageStore) layerFileLock(hex string, how int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(s.lockDir, hex), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := flock(f, how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// lock returns the mutex for key, creating it. Mutexes are few (one per
// reference and per layer ever seen) and tiny, so they are kept.
func (s *imageStore) lock(key string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.locks[key]
	if !ok {
		m = &sync.Mutex{}
		s.locks[key] = m
	}
	return m
}

// resolve turns a Spec.Image into mountable layers, pulling and unpacking
// what the cache lacks.
func (s *imageStore) resolve(ctx context.Context, ref string) (*image, error) {
	if ref == ImageHost {
		return &image{host: true, lowers: []string{"/"}}, nil
	}
	src, err := s.parseSource(ref)
	if err != nil {
		return nil, err
	}
	mu := s.lock("ref:" + src.key)
	mu.Lock()
	defer mu.Unlock()

	info, cached := s.cached(src)
	if !cached || !s.complete(info) {
		img, err := src.open(ctx)
		if err != nil {
			return nil, err
		}
		if info, err = configOf(img, ref); err != nil {
			return nil, err
		}
		if info.User != "" && !isRoot(info.User) {
			s.log.Warn("image user ignored: sandboxes run as root", "image", ref, "user", info.User)
		}
		if err := s.unpackAll(ctx, ref, img, info); err != nil {
			return nil, err
		}
		s.remember(src, info)
	}

	out := &image{env: info.Env, workingDir: info.WorkingDir}
	for i := len(info.DiffIDs) - 1; i >= 0; i-- {
		out.lowers = append(out.lowers, s.layerFS(info.DiffIDs[i]))
	}
	if len(out.lowers) == 0 {
		// overlayfs needs a lower layer; an image without layers is empty.
		empty := filepath.Join(s.layers, "empty")
		if err := os.MkdirAll(empty, 0o755); err != nil {
			return nil, unpackFailed(ref, err)
		}
		out.lowers = []string{empty}
	}
	return out, nil
}

func isRoot(user string) bool {
	u, _, _ := strings.Cut(user, ":")
	return u == "" || u == "root" || u == "0"
}

func (s *imageStore) cached(src source) (imageInfo, bool) {
	s.mu.Lock()
	info, ok := s.resolved[src.key]
	s.mu.Unlock()
	if ok || !src.persist {
		return info, ok
	}
	b, err := os.ReadFile(s.refFile(src.key))
	if err != nil {
		return imageInfo{}, false
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return imageInfo{}, false
	}
	s.mu.Lock()
	s.resolved[src.key] = info
	s.mu.Unlock()
	return info, true
}

func (s *imageStore) remember(src source, info imageInfo) {
	s.mu.Lock()
	s.resolved[src.key] = info
	s.mu.Unlock()
	if !src.persist {
		return
	}
	b, err := json.Marshal(info)
	if err == nil {
		err = writeFileAtomic(s.refFile(src.key), b)
	}
	if err != nil {
		s.log.Warn("cache image resolution", "image", src.ref, "err", err)
	}
}

func (s *imageStore) refFile(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.refs, hex.EncodeToString(sum[:])+".json")
}

func (s *imageStore) layerDir(diffID string) string {
	return filepath.Join(s.layers, strings.TrimPrefix(diffID, "sha256:"))
}

func (s *imageStore) layerFS(diffID string) string {
	return filepath.Join(s.layerDir(diffID), "fs")
}

const completeMarker = ".complete"

func (s *imageStore) complete(info imageInfo) bool {
	for _, d := range info.DiffIDs {
		if _, err := os.Stat(filepath.Join(s.layerDir(d), completeMarker)); err != nil {
			return false
		}
	}
	return true
}

func (s *imageStore) unpackAll(ctx context.Context, ref string, img v1.Image, info imageInfo) error {
	layers, err := img.Layers()
	if err != nil {
		return pullFailed(ref, err)
	}
	if len(layers) != len(info.DiffIDs) {
		return unpackFailed(ref, fmt.Errorf("%d layers but %d diff ids in config", len(layers), len(info.DiffIDs)))
	}
	for i, layer := range layers {
		if err := ctx.Err(); err != nil {
			return pullFailed(ref, context.Cause(ctx))
		}
		if err := s.unpackLayer(ctx, ref, layer, info.DiffIDs[i]); err != nil {
			return err
		}
	}
	return nil
}

// unpackLayer unpacks one layer into the cache unless it is there already.
// A per-layer lock makes concurrent pulls of images sharing a layer unpack
// it once; the unpack goes to a temporary directory renamed into place, so
// a crash never leaves a layer that looks complete.
func (s *imageStore) unpackLayer(ctx context.Context, ref string, layer v1.Layer, diffID string) error {
	if !strings.HasPrefix(diffID, "sha256:") || len(diffID) != len("sha256:")+64 {
		return unpackFailed(ref, fmt.Errorf("unsupported diff id %q", diffID))
	}
	mu := s.lock("layer:" + diffID)
	mu.Lock()
	defer mu.Unlock()
	hex := strings.TrimPrefix(diffID, "sha256:")
	lf, err := s.layerFileLock(hex, unix.LOCK_EX)
	if err != nil {
		return unpackFailed(ref, err)
	}
	defer lf.Close()
	dir := s.layerDir(diffID)
	if _, err := os.Stat(filepath.Join(dir, completeMarker)); err == nil {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil { // a crash between rename and marker
		return unpackFailed(ref, err)
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(s.layers, "tmp-"+hex+"-")
	if err != nil {
		return unpackFailed(ref, err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return unpackFailed(ref, err)
	}
	fsDir := filepath.Join(tmp, "fs")
	if err := os.Mkdir(fsDir, 0o755); err != nil {
		return unpackFailed(ref, err)
	}
	rc, err := layer.Uncompressed()
	if err != nil {
		return pullFailed(ref, err)
	}
	err = unpackTar(ctx, rc, fsDir)
	if cerr := rc.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		if isNetwork(err) {
			return pullFailed(ref, err)
		}
		return unpackFailed(ref, fmt.Errorf("layer %s: %w", diffID, err))
	}
	if err := os.Rename(tmp, dir); err != nil {
		return unpackFailed(ref, err)
	}
	if err := os.WriteFile(filepath.Join(dir, completeMarker), nil, 0o600); err != nil {
		return unpackFailed(ref, err)
	}
	s.log.Debug("layer unpacked", "image", ref, "diff_id", diffID, "took", time.Since(start))
	return nil
}

func configOf(img v1.Image, ref string) (imageInfo, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return imageInfo{}, pullFailed(ref, err)
	}
	info := imageInfo{
		Env:        cfg.Config.Env,
		WorkingDir: cfg.Config.WorkingDir,
		User:       cfg.Config.User,
	}
	for _, d := range cfg.RootFS.DiffIDs {
		info.DiffIDs = append(info.DiffIDs, d.String())
	}
	if info.WorkingDir != "" && !filepath.IsAbs(info.WorkingDir) {
		info.WorkingDir = "/" + info.WorkingDir
	}
	return info, nil
}

// source is a parsed image reference.
type source struct {
	ref     string
	key     string // cache key: the reference, plus a file's identity for local images
	persist bool   // cache the resolution on disk (registry images)
	open    func(ctx context.Context) (v1.Image, error)
}

// CheckImage refuses a "docker-archive:" or "oci-layout:" reference whose
// path the server may not read (outside Config.ImageDirs, a device, ...)
// or cannot parse, so that the create request fails with the reason
// (runtime.ImageChecker). Whether the image is there is for Create to
// find, as it is for registry images.
func (l *Local) CheckImage(ref string) error {
	if !isLocalRef(ref) {
		return nil
	}
	if _, err := l.images.parseSource(ref); err != nil && !faults.Is(err, faults.CodeImageNotFound) {
		return err
	}
	return nil
}

// isLocalRef reports whether ref names an image on the server's file
// system.
func isLocalRef(ref string) bool {
	return strings.HasPrefix(ref, prefixOCILayout) || strings.HasPrefix(ref, prefixDockerArchive)
}

func (s *imageStore) parseSource(ref string) (source, error) {
	switch {
	case strings.HasPrefix(ref, prefixOCILayout):
		return s.ociLayoutSource(ref)
	case strings.HasPrefix(ref, prefixDockerArchive):
		return s.dockerArchiveSource(ref)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return source{}, invalidRef(ref, err)
	}
	platform := v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}
	return source{
		ref:     ref,
		key:     r.Name(),
		persist: true,
		open: func(ctx context.Context) (v1.Image, error) {
			img, err := remote.Image(r,
				remote.WithContext(ctx),
				remote.WithPlatform(platform),
				remote.WithAuthFromKeychain(authn.DefaultKeychain),
				// Retrying is the caller's decision (the error says
				// whether it can help); keep our own retries short.
				remote.WithRetryBackoff(remote.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 2}),
			)
			if err != nil {
				return nil, classifyPull(ref, err)
			}
			return img, nil
		},
	}, nil
}

// ociLayoutSource parses "oci-layout:/path[@tag-or-digest]".
func (s *imageStore) ociLayoutSource(ref string) (source, error) {
	rest := strings.TrimPrefix(ref, prefixOCILayout)
	path, sel := rest, ""
	if i := strings.LastIndexByte(rest, '@'); i > strings.LastIndexByte(rest, '/') {
		path, sel = rest[:i], rest[i+1:]
	}
	if !filepath.IsAbs(path) {
		return source{}, invalidRef(ref, errors.New("oci-layout path must be absolute"))
	}
	path, fi, err := s.localPath(ref, path)
	if err != nil {
		return source{}, err
	}
	if !fi.IsDir() {
		return source{}, notRegular(ref, "not a directory")
	}
	if err := s.checkLayout(ref, path); err != nil {
		return source{}, err
	}
	fi, err = os.Stat(filepath.Join(path, "index.json"))
	if err != nil {
		return source{}, localNotFound(ref, err)
	}
	return source{
		ref: ref,
		key: fmt.Sprintf("%s|%d|%d", ref, fi.ModTime().UnixNano(), fi.Size()),
		open: func(context.Context) (v1.Image, error) {
			p, err := layout.FromPath(path)
			if err != nil {
				return nil, localNotFound(ref, err)
			}
			idx, err := p.ImageIndex()
			if err != nil {
				return nil, unpackFailed(ref, err)
			}
			img, err := pickImage(idx, sel)
			if err != nil {
				return nil, faults.Wrap(err, faults.CodeImageNotFound, faults.NotFound, faults.Client,
					fmt.Sprintf("image %s not found", ref))
			}
			return img, nil
		},
	}, nil
}

// localPath resolves p, the absolute path of a local image, and checks
// that it lies in one of the image directories: first as written with
// ".." resolved, so that nothing outside them is even looked at (a refusal
// tells nothing of what exists there), then with its symlinks resolved,
// so that no link leads out. The caller opens the resolved path.
func (s *imageStore) localPath(ref, p string) (string, os.FileInfo, error) {
	p = filepath.Clean(p)
	if !s.inImageDirs(p) {
		return "", nil, pathNotAllowed(ref)
	}
	rp, err := filepath.EvalSymlinks(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			return "", nil, localNotFound(ref, err)
		}
		return "", nil, invalidRef(ref, err)
	}
	if !s.inImageDirs(rp) {
		return "", nil, pathNotAllowed(ref)
	}
	fi, err := os.Stat(rp)
	if err != nil {
		return "", nil, localNotFound(ref, err)
	}
	return rp, fi, nil
}

func (s *imageStore) inImageDirs(p string) bool {
	return slices.ContainsFunc(s.dirs, func(d string) bool { return within(p, d) })
}

// checkLayout refuses a layout at dir that holds anything but
// directories, regular files and links to regular files in the image
// directories: the layout library opens its files by path, so a blob that
// links to /etc/shadow, or is a device or a pipe, would be read.
func (s *imageStore) checkLayout(ref, dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return unpackFailed(ref, err)
		}
		switch t := d.Type(); {
		case t.IsDir(), t.IsRegular():
			return nil
		case t&fs.ModeSymlink != 0:
			rp, err := filepath.EvalSymlinks(p)
			if err != nil {
				return notRegular(ref, "the layout holds a broken link")
			}
			if !s.inImageDirs(rp) {
				return pathNotAllowed(ref)
			}
			if fi, err := os.Stat(rp); err != nil || !fi.Mode().IsRegular() {
				return notRegular(ref, "the layout holds a link to something other than a file")
			}
			return nil
		}
		return notRegular(ref, "the layout holds a device, pipe or socket")
	})
}

// Annotations naming an image in an OCI layout's index.
const (
	annotationRefName    = "org.opencontainers.image.ref.name"
	annotationImageName  = "io.containerd.image.name"
	mediaTypeOCIIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeDockerIndex = "application/vnd.docker.distribution.manifest.list.v2+json"
)

// pickImage chooses the manifest named sel (a ref-name annotation or a
// digest) in idx, or its only manifest when sel is empty; a nested index
// is narrowed to this machine's platform.
func pickImage(idx v1.ImageIndex, sel string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var match []v1.Descriptor
	for _, d := range im.Manifests {
		switch {
		case sel == "":
			match = append(match, d)
		case strings.HasPrefix(sel, "sha256:"):
			if d.Digest.String() == sel {
				match = append(match, d)
			}
		default:
			n, full := d.Annotations[annotationRefName], d.Annotations[annotationImageName]
			if n == sel || full == sel || strings.HasSuffix(full, ":"+sel) {
				match = append(match, d)
			}
		}
	}
	switch {
	case len(match) == 0 && sel == "":
		return nil, errors.New("layout holds no image")
	case len(match) == 0:
		return nil, fmt.Errorf("no image named %q in layout", sel)
	case len(match) > 1:
		return nil, fmt.Errorf("%d images match %q in layout: name one (ref annotation or digest)", len(match), sel)
	}
	d := match[0]
	switch string(d.MediaType) {
	case mediaTypeOCIIndex, mediaTypeDockerIndex:
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		cm, err := child.IndexManifest()
		if err != nil {
			return nil, err
		}
		for _, m := range cm.Manifests {
			if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == goruntime.GOARCH {
				return child.Image(m.Digest)
			}
		}
		return nil, fmt.Errorf("no linux/%s image in index %s", goruntime.GOARCH, d.Digest)
	}
	return idx.Image(d.Digest)
}

// dockerArchiveSource parses "docker-archive:/path.tar[:repo:tag]". The
// path is the longest prefix that is a file, so paths may contain ':'.
func (s *imageStore) dockerArchiveSource(ref string) (source, error) {
	rest := strings.TrimPrefix(ref, prefixDockerArchive)
	if !filepath.IsAbs(rest) {
		return source{}, invalidRef(ref, errors.New("docker-archive path must be absolute"))
	}
	// The longest prefix that is there decides: what it is, or why it
	// may not be opened.
	path, tagStr := rest, ""
	p, fi, err := s.localPath(ref, path)
	for i := len(rest) - 1; i > 0 && faults.Is(err, faults.CodeImageNotFound); i-- {
		if rest[i] == ':' {
			if cp, cfi, cerr := s.localPath(ref, rest[:i]); !faults.Is(cerr, faults.CodeImageNotFound) {
				p, fi, err, tagStr = cp, cfi, cerr, rest[i+1:]
			}
		}
	}
	if err != nil {
		return source{}, err
	}
	path = p
	if !fi.Mode().IsRegular() {
		return source{}, notRegular(ref, "not a regular file")
	}
	var tag *name.Tag
	if tagStr != "" {
		t, err := name.NewTag(tagStr)
		if err != nil {
			return source{}, invalidRef(ref, err)
		}
		tag = &t
	}
	return source{
		ref: ref,
		key: fmt.Sprintf("%s|%d|%d", ref, fi.ModTime().UnixNano(), fi.Size()),
		open: func(context.Context) (v1.Image, error) {
			img, err := tarball.ImageFromPath(path, tag)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || strings.Contains(err.Error(), "tag") {
					return nil, localNotFound(ref, err)
				}
				return nil, unpackFailed(ref, err)
			}
			return img, nil
		},
	}, nil
}

func invalidRef(ref string, err error) error {
	return faults.Wrap(err, faults.CodeImageRef, faults.InvalidRequest, faults.Client,
		fmt.Sprintf("invalid image reference %q", ref))
}

func pathNotAllowed(ref string) error {
	return faults.Newf(faults.CodeImagePathNotAllowed, faults.PermissionDenied, faults.Client,
		"image %s: the server reads local images only from the directories it is configured with (ORCHARD_IMAGE_DIRS)", ref)
}

func notRegular(ref, why string) error {
	return faults.Newf(faults.CodeImagePathNotRegular, faults.InvalidRequest, faults.Client, "image %s: %s", ref, why)
}

func localNotFound(ref string, err error) error {
	return faults.Wrap(err, faults.CodeImageNotFound, faults.NotFound, faults.Client,
		fmt.Sprintf("image %s not found", ref))
}

func pullFailed(ref string, err error) error {
	if e := (*faults.Error)(nil); errors.As(err, &e) {
		return err
	}
	return faults.Wrap(err, faults.CodeImagePull, faults.Unavailable, faults.Network,
		fmt.Sprintf("pull image %s", ref))
}

func unpackFailed(ref string, err error) error {
	if e := (*faults.Error)(nil); errors.As(err, &e) {
		return err
	}
	return faults.Wrap(err, faults.CodeImageUnpack, faults.Internal, faults.Platform,
		fmt.Sprintf("unpack image %s", ref))
}

// classifyPull maps a registry error to a fault: a missing or forbidden
// image is the client's problem; an unreachable or failing registry may
// work on retry.
func classifyPull(ref string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound, http.StatusUnauthorized, http.StatusForbidden:
			return faults.Wrap(err, faults.CodeImageNotFound, faults.NotFound, faults.Client,
				fmt.Sprintf("image %s not found or not accessible", ref))
		}
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode,
				transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return faults.Wrap(err, faults.CodeImageNotFound, faults.NotFound, faults.Client,
					fmt.Sprintf("image %s not found or not accessible", ref))
			}
		}
		if te.StatusCode >= 400 && te.StatusCode < 500 && te.StatusCode != http.StatusTooManyRequests {
			return faults.Wrap(err, faults.CodeImagePull, faults.InvalidRequest, faults.Client,
				fmt.Sprintf("pull image %s: registry refused the request", ref))
		}
	}
	if strings.Contains(err.Error(), "no child with platform") {
		return faults.Wrap(err, faults.CodeImageNotFound, faults.NotFound, faults.Client,
			fmt.Sprintf("image %s has no linux/%s variant", ref, goruntime.GOARCH))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return faults.Wrap(err, faults.CodeImagePull, faults.Timeout, faults.Network,
			fmt.Sprintf("pull image %s: timed out", ref))
	}
	return pullFailed(ref, err)
}

// isNetwork reports whether err came from the network rather than the data.
func isNetwork(err error) bool {
	var ne net.Error
	var ue *url.Error
	var te *transport.Error
	return errors.As(err, &ne) || errors.As(err, &ue) || errors.As(err, &te) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
