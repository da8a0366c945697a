package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"
)

// deb is one pinned Debian package and where to get it.
type deb struct {
	Name     string `json:"name"`
	Version  string `json:"version"`
	URI      string `json:"uri"`
	Filename string `json:"filename"` // pool file name: the cache key
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
	Data     bool   `json:"data,omitempty"` // files only (Spec.DataPackages)
	Path     string `json:"-"`              // in the cache
}

// resolve pins the packages an image installs: the closure of seeds as
// apt would install it on an empty system (Depends and Pre-Depends, no
// Recommends, alternatives chosen by apt's own resolver), plus the
// data packages alone. It asks the host's apt, whose package lists are
// signed by Debian; `apt-get update` refreshes them.
func resolve(ctx context.Context, seeds, data []string) ([]deb, error) {
	pins := map[string]string{}
	if len(seeds) > 0 {
		inst, err := simulate(ctx, seeds)
		if err != nil {
			return nil, err
		}
		for n, v := range inst {
			pins[n] = v
		}
	}
	// A data package that the closure holds anyway is installed whole.
	closure := map[string]bool{}
	for n := range pins {
		closure[n] = true
	}
	dataSet := map[string]bool{}
	if len(data) > 0 {
		inst, err := simulate(ctx, data)
		if err != nil {
			return nil, err
		}
		for _, n := range data {
			dataSet[n] = true
			if _, ok := pins[n]; ok {
				continue
			}
			v, ok := inst[n]
			if !ok {
				return nil, fmt.Errorf("resolve %s: apt would not install it", n)
			}
			pins[n] = v
		}
	}
	names := make([]string, 0, len(pins))
	for n := range pins {
		names = append(names, n)
	}
	sort.Strings(names)
	args := []string{"download", "--print-uris"}
	for _, n := range names {
		args = append(args, n+"="+pins[n])
	}
	out, err := apt(ctx, "apt-get", args...)
	if err != nil {
		return nil, err
	}
	byName := map[string]deb{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// 'URI' FILENAME SIZE SHA256:HEX
		f := strings.Fields(sc.Text())
		if len(f) != 4 || !strings.HasPrefix(f[3], "SHA256:") {
			continue
		}
		size, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("apt-get --print-uris: size in %q: %w", sc.Text(), err)
		}
		n, _, _ := strings.Cut(f[1], "_")
		byName[n] = deb{Name: n, Version: pins[n], URI: strings.Trim(f[0], "'"), Filename: f[1], Size: size,
			SHA256: strings.TrimPrefix(f[3], "SHA256:"), Data: dataSet[n] && !closure[n]}
	}
	debs := make([]deb, 0, len(names))
	for _, n := range names {
		d, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("apt-get --print-uris gave no URI for %s=%s", n, pins[n])
		}
		debs = append(debs, d)
	}
	return debs, nil
}

// simulate returns name → version of what `apt-get install` of pkgs would
// install on a system with no packages: an empty dpkg status file makes
// apt resolve the whole closure, and -s (simulate) needs neither root nor
// locks.
func simulate(ctx context.Context, pkgs []string) (map[string]string, error) {
	args := append([]string{"-s", "-o", "Dir::State::status=/dev/null", "-o", "Debug::NoLocking=1",
		"--no-install-recommends", "install"}, pkgs...)
	out, err := apt(ctx, "apt-get", args...)
	if err != nil {
		return nil, err
	}
	inst := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// Inst NAME (VERSION ORIGINS [ARCH])
		f := strings.Fields(sc.Text())
		if len(f) < 3 || f[0] != "Inst" || !strings.HasPrefix(f[2], "(") {
			continue
		}
		inst[f[1]] = strings.TrimPrefix(f[2], "(")
	}
	if len(inst) == 0 {
		return nil, fmt.Errorf("apt-get install -s %s: nothing to install", strings.Join(pkgs, " "))
	}
	return inst, nil
}

func apt(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args[:min(len(args), 6)], " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// downloadParallel bounds concurrent downloads: a few connections keep the
// mirror's bandwidth busy without hammering it.
const downloadParallel = 4

// fetch makes every deb present in cache (verified against the SHA256 of
// the signed package lists) and sets its Path.
func fetch(ctx context.Context, log *slog.Logger, cache string, debs []deb) error {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return fmt.Errorf("deb cache: %w", err)
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(downloadParallel)
	for i := range debs {
		d := &debs[i]
		d.Path = filepath.Join(cache, d.Filename)
		g.Go(func() error {
			if ok, err := verified(d.Path, d.SHA256); err != nil || ok {
				return err
			}
			log.Info("download", "package", d.Name, "version", d.Version, "bytes", d.Size)
			if err := download(ctx, d); err != nil {
				return fmt.Errorf("download %s=%s: %w", d.Name, d.Version, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// verified reports whether path exists with the given SHA256.
func verified(path, sum string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)) == sum, nil
}

// download writes d.URI to d.Path through a private name, so a partial
// or corrupt file never takes the cache's name.
func download(ctx context.Context, d *deb) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.URI, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", d.URI, resp.Status)
	}
	tmp, err := os.CreateTemp(filepath.Dir(d.Path), ".download-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), resp.Body)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", d.URI, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != d.SHA256 || n != d.Size {
		return fmt.Errorf("GET %s: got %d bytes sha256 %s, want %d bytes sha256 %s", d.URI, n, got, d.Size, d.SHA256)
	}
	return os.Rename(tmp.Name(), d.Path)
}

// packages returns the debs of spec: from the lock file when one is given
// and exists (and update is false), otherwise resolved by apt, then
// written to the lock file if one is given.
func packages(ctx context.Context, spec Spec, lock string, update bool) ([]deb, error) {
	seeds := spec.seeds()
	if len(seeds) == 0 && len(spec.DataPackages) == 0 {
		return nil, nil
	}
	if lock != "" && !update {
		b, err := os.ReadFile(lock)
		if err == nil {
			var debs []deb
			if err := json.Unmarshal(b, &debs); err != nil {
				return nil, fmt.Errorf("lock %s: %w", lock, err)
			}
			have := map[string]bool{}
			for _, d := range debs {
				have[d.Name] = true
			}
			// A lock that lacks a package the spec names is stale; the
			// closure's other members cannot be checked without apt.
			for _, n := range append(slices.Clone(seeds), spec.DataPackages...) {
				if !have[n] {
					return nil, fmt.Errorf("lock %s lacks %s: rebuild with --update-lock", lock, n)
				}
			}
			return debs, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("lock: %w", err)
		}
	}
	debs, err := resolve(ctx, seeds, spec.DataPackages)
	if err != nil {
		return nil, fmt.Errorf("resolve packages: %w", err)
	}
	if lock != "" {
		b, err := json.MarshalIndent(debs, "", "  ")
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(lock, append(b, '\n'), 0o644); err != nil {
			return nil, fmt.Errorf("lock: %w", err)
		}
	}
	return debs, nil
}
