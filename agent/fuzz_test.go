package agent

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/upload"
)

// FuzzConfine checks path resolution and every file operation against
// arbitrary paths in a tree full of hostile symlinks: a resolved path is
// always local to the root, nothing read is ever the file outside, and the
// outside directory never changes. Run with
//
//	go test ./agent -run '^$' -fuzz FuzzConfine
func FuzzConfine(f *testing.F) {
	parent := f.TempDir()
	root := filepath.Join(parent, "root")
	out := filepath.Join(parent, "outside")
	ws := filepath.Join(root, "workspace")
	for _, d := range []string{out, filepath.Join(ws, "dir", "deep")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	secret := filepath.Join(out, "secret.txt")
	if err := os.WriteFile(secret, []byte("OUTSIDE-SECRET"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "file.txt"), []byte("inside"), 0o644); err != nil {
		f.Fatal(err)
	}
	links := map[string]string{
		"workspace/abs-out":     out,
		"workspace/abs-secret":  secret,
		"workspace/abs-root":    "/",
		"workspace/rel-out":     "../../outside",
		"workspace/rel-secret":  "../../outside/secret.txt",
		"workspace/dir/up":      "../..",
		"workspace/dir/upup":    "../../..",
		"workspace/dir/deep/in": "../../file.txt",
		"workspace/loop":        "loop",
		"workspace/loop-a":      "loop-b",
		"workspace/loop-b":      "loop-a",
		"workspace/dangling":    "missing/x",
		"workspace/host-tmp":    parent,
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			f.Fatal(err)
		}
	}
	s, err := New(Config{Root: root, Cwd: "/workspace", Env: []string{}, Logger: testLogger})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	secretInfo, err := os.Stat(secret)
	if err != nil {
		f.Fatal(err)
	}
	outInfo, err := os.Stat(out)
	if err != nil {
		f.Fatal(err)
	}

	for _, seed := range []string{
		"", ".", "/", "..", "../../etc/passwd", "/../outside/secret.txt",
		"file.txt", "abs-out/secret.txt", "abs-secret", "abs-root/../outside",
		"rel-out/secret.txt", "rel-secret", "dir/up/../outside", "dir/upup/outside/secret.txt",
		"dir/deep/in", "loop", "loop-a/x", "dangling", "host-tmp/outside/secret.txt",
		"/workspace/dir/../../../outside", "a/../../..", "x\x00y", "//workspace//./file.txt",
		"abs-root" + out + "/secret.txt",
	} {
		f.Add(seed)
	}

	f.Fuzz(func(t *testing.T, p string) {
		if rel, err := s.resolve(p); err == nil {
			if rel != "." && !filepath.IsLocal(rel) {
				t.Fatalf("resolve(%q) = %q: not local to the root", p, rel)
			}
		}

		if fl, _, err := s.openForDownload(p); err == nil {
			fi, _ := fl.Stat()
			b, _ := io.ReadAll(fl)
			fl.Close()
			if os.SameFile(fi, secretInfo) || string(b) == "OUTSIDE-SECRET" {
				t.Fatalf("download %q read the outside file", p)
			}
		}

		if rel, err := s.resolve(p); err == nil {
			if d, err := s.root.Open(rel); err == nil {
				fi, _ := d.Stat()
				d.Close()
				if os.SameFile(fi, outInfo) || os.SameFile(fi, secretInfo) {
					t.Fatalf("%q opened %s outside the root", p, fi.Name())
				}
			}
		}
		_, _ = s.list(p)

		if err := uploadAt(s, p, "Zm9v"); err == nil {
			// It landed somewhere inside the root; nothing outside moved.
			ents, err := os.ReadDir(out)
			if err != nil || len(ents) != 1 || ents[0].Name() != "secret.txt" {
				t.Fatalf("upload %q changed the outside dir: %v %v", p, ents, err)
			}
			if b, _ := os.ReadFile(secret); string(b) != "OUTSIDE-SECRET" {
				t.Fatalf("upload %q overwrote the outside file", p)
			}
		}
		// The host's parent directory holds only root and outside.
		ents, _ := os.ReadDir(parent)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if strings.Join(names, ",") != "outside,root" {
			t.Fatalf("after %q the parent holds %v", p, names)
		}
	})
}

// uploadAt writes base64 content to sandbox path p as an upload does.
func uploadAt(s *Server, p, content string) error {
	u, err := s.openUpload(p)
	if err != nil {
		return err
	}
	if _, err := upload.Decode(u.f, strings.NewReader(content)); err != nil {
		u.abort()
		return err
	}
	if err := u.commit(0, false); err != nil {
		u.abort()
		return err
	}
	return nil
}
