package agent

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

func b64(s string) *string {
	e := base64.StdEncoding.EncodeToString([]byte(s))
	return &e
}

func ptr[T any](v T) *T { return &v }

// outsideDir makes a directory next to (not inside) root with a secret in
// it, and returns its host path.
func outsideDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secret.txt"), []byte("OUTSIDE-SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestUploadDownload(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	ctx := context.Background()

	tests := []struct {
		name    string
		path    string
		content string
		mode    string
		host    string // where the file lands, relative to the root
		perm    os.FileMode
	}{
		{name: "parents created", path: "/workspace/a/b/c.txt", content: "hello\n", host: "workspace/a/b/c.txt", perm: 0o644},
		{name: "relative to cwd", path: "rel/x.txt", content: "rel", host: "workspace/rel/x.txt", perm: 0o644},
		{name: "mode", path: "/workspace/run.sh", content: "#!/bin/sh\n", mode: "0755", host: "workspace/run.sh", perm: 0o755},
		{name: "binary", path: "/bin.dat", content: "\x00\xff\xfe", host: "bin.dat", perm: 0o644},
		{name: "empty", path: "/workspace/empty", content: "", host: "workspace/empty", perm: 0o644},
		{name: "dot-dot inside the root", path: "/workspace/a/../dd.txt", content: "dd", host: "workspace/dd.txt", perm: 0o644},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := a.Upload(ctx, api.UploadRequest{Path: ptr(tt.path), Content: b64(tt.content), Mode: tt.mode})
			if err != nil {
				t.Fatal(err)
			}
			if res != (api.UploadResult{Success: true, Path: tt.path, Size: int64(len(tt.content))}) {
				t.Fatalf("upload = %+v", res)
			}
			host := filepath.Join(a.root, tt.host)
			b, err := os.ReadFile(host)
			if err != nil || string(b) != tt.content {
				t.Fatalf("host file %s = %q, %v", host, b, err)
			}
			fi, _ := os.Stat(host)
			// The default mode is 0666 less the umask; tests run with 022.
			if fi.Mode().Perm() != tt.perm {
				t.Errorf("mode = %v, want %v", fi.Mode().Perm(), tt.perm)
			}
			got, err := a.Download(ctx, tt.path)
			if err != nil {
				t.Fatal(err)
			}
			if got.Path != tt.path || got.Size != int64(len(tt.content)) || got.Content != *b64(tt.content) {
				t.Fatalf("download = %+v", got)
			}
		})
	}

	t.Run("overwrite keeps mode", func(t *testing.T) {
		p := "/workspace/over.sh"
		if _, err := a.Upload(ctx, api.UploadRequest{Path: &p, Content: b64("one-long"), Mode: "0750"}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Upload(ctx, api.UploadRequest{Path: &p, Content: b64("two")}); err != nil {
			t.Fatal(err)
		}
		host := filepath.Join(a.root, "workspace/over.sh")
		b, _ := os.ReadFile(host)
		fi, _ := os.Stat(host)
		if string(b) != "two" || fi.Mode().Perm() != 0o750 {
			t.Fatalf("after overwrite: %q %v", b, fi.Mode())
		}
		left, _ := filepath.Glob(filepath.Join(a.root, "workspace", ".orchard-upload-*"))
		if len(left) != 0 {
			t.Fatalf("temp files left: %v", left)
		}
	})

	t.Run("overwrite keeps owner", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("chown needs root")
		}
		host := filepath.Join(a.root, "workspace/owned")
		if err := os.WriteFile(host, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(host, 1234, 2345); err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct{ mode, want string }{{"", "-rw-r--r--"}, {"04755", "urwxr-xr-x"}} {
			p := "/workspace/owned"
			if _, err := a.Upload(ctx, api.UploadRequest{Path: &p, Content: b64("new"), Mode: tt.mode}); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(host)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != 1234 || st.Gid != 2345 || fi.Mode().String() != tt.want {
				t.Fatalf("mode %q: after overwrite %d:%d %v, want 1234:2345 %s", tt.mode, st.Uid, st.Gid, fi.Mode(), tt.want)
			}
		}
		// A new file is the agent's.
		p := "/workspace/fresh"
		if _, err := a.Upload(ctx, api.UploadRequest{Path: &p, Content: b64("x")}); err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(filepath.Join(a.root, "workspace/fresh"))
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Geteuid() {
			t.Fatalf("new file owned by %d", st.Uid)
		}
	})
}

func TestFileErrors(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	ctx := context.Background()
	if err := os.MkdirAll(filepath.Join(a.root, "workspace/dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.root, "workspace/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	upload := func(p, content string) error {
		_, err := a.Upload(ctx, api.UploadRequest{Path: &p, Content: &content})
		return err
	}
	download := func(p string) error { _, err := a.Download(ctx, p); return err }
	list := func(p string) error { _, err := a.List(ctx, p); return err }

	tests := []struct {
		name   string
		call   func() error
		status int
		cat    faults.Category
		code   string
		msg    string
	}{
		{"download missing", func() error { return download("/workspace/nope.txt") }, 404, faults.NotFound, faults.CodeFileNotFound, "File not found: /workspace/nope.txt"},
		{"download under a file", func() error { return download("/workspace/f/x") }, 404, faults.NotFound, faults.CodeFileNotFound, "File not found: /workspace/f/x"},
		{"download directory", func() error { return download("/workspace/dir") }, 400, faults.InvalidRequest, faults.CodeIsDirectory, ""},
		{"download no path", func() error { return download("") }, 400, faults.InvalidRequest, faults.CodeValidation, ""},
		{"list missing", func() error { return list("/nope") }, 404, faults.NotFound, faults.CodePathNotFound, "Path not found: /nope"},
		{"list file", func() error { return list("/workspace/f") }, 400, faults.InvalidRequest, faults.CodeNotDirectory, ""},
		{"upload invalid base64", func() error { return upload("/workspace/b", "@@@") }, 400, faults.InvalidRequest, faults.CodeInvalidBase64, ""},
		{"upload unpadded base64", func() error { return upload("/workspace/b", "YWJ") }, 400, faults.InvalidRequest, faults.CodeInvalidBase64, ""},
		{"upload onto a directory", func() error { return upload("/workspace/dir", "") }, 400, faults.InvalidRequest, faults.CodeIsDirectory, ""},
		{"upload under a file", func() error { return upload("/workspace/f/x", "") }, 400, faults.InvalidRequest, faults.CodeNotDirectory, ""},
		{"upload bad mode", func() error {
			_, err := a.Upload(ctx, api.UploadRequest{Path: ptr("/m"), Content: b64(""), Mode: "rwx"})
			return err
		}, 400, faults.InvalidRequest, faults.CodeValidation, ""},
		{"upload no content", func() error { _, err := a.Upload(ctx, api.UploadRequest{Path: ptr("/m")}); return err }, 400, faults.InvalidRequest, faults.CodeValidation, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := wantFault(t, tt.call(), tt.status, tt.cat, tt.code)
			if tt.msg != "" && e.Message != tt.msg {
				t.Errorf("message = %q, want %q", e.Message, tt.msg)
			}
		})
	}
	if left, _ := filepath.Glob(filepath.Join(a.root, "workspace", ".orchard-upload-*")); len(left) != 0 {
		t.Fatalf("temp files left after failed uploads: %v", left)
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	ws := filepath.Join(a.root, "workspace")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(ws, "sub"), 0o755))
	must(os.WriteFile(filepath.Join(ws, "b.txt"), []byte("12345"), 0o644))
	must(os.WriteFile(filepath.Join(ws, ".hidden"), []byte("h"), 0o644))
	must(os.WriteFile(filepath.Join(ws, "B-upper"), nil, 0o644))
	must(os.Symlink("sub", filepath.Join(ws, "link-dir")))
	must(os.Symlink("b.txt", filepath.Join(ws, "link-file")))
	must(os.Symlink("/workspace/b.txt", filepath.Join(ws, "link-abs")))
	must(os.Symlink("nowhere", filepath.Join(ws, "dangling")))
	must(os.Symlink("../../../../../../etc", filepath.Join(ws, "escaping")))
	mtime := time.Date(2024, 5, 6, 7, 8, 9, 0, time.Local)
	must(os.Chtimes(filepath.Join(ws, "b.txt"), mtime, mtime))

	for _, p := range []string{"", "/workspace", "/workspace/", "/workspace/link-dir/.."} {
		got, err := a.List(context.Background(), p)
		if err != nil {
			t.Fatalf("List(%q): %v", p, err)
		}
		wantPath := p
		if p == "" {
			wantPath = "/workspace"
		}
		if got.Path != wantPath {
			t.Errorf("List(%q).Path = %q", p, got.Path)
		}
		type row struct {
			name, typ string
			size      int64
		}
		dirSize := func(p string) int64 { fi, _ := os.Stat(p); return fi.Size() }
		lsize := func(p string) int64 { fi, _ := os.Lstat(p); return fi.Size() }
		want := []row{
			{".hidden", "file", 1},
			{"B-upper", "file", 0},
			{"b.txt", "file", 5},
			{"dangling", "file", lsize(filepath.Join(ws, "dangling"))},
			{"escaping", "file", lsize(filepath.Join(ws, "escaping"))},
			{"link-abs", "file", 5},
			{"link-dir", "directory", dirSize(filepath.Join(ws, "sub"))},
			{"link-file", "file", 5},
			{"sub", "directory", dirSize(filepath.Join(ws, "sub"))},
		}
		if len(got.Files) != len(want) {
			t.Fatalf("List(%q) = %+v", p, got.Files)
		}
		stamp := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$`)
		for i, w := range want {
			f := got.Files[i]
			if f.Name != w.name || f.Type != w.typ || f.Size != w.size {
				t.Errorf("entry %d = %s %s %d, want %+v", i, f.Name, f.Type, f.Size, w)
			}
			if f.Modified == nil || !stamp.MatchString(*f.Modified) {
				t.Errorf("entry %s modified = %v", f.Name, f.Modified)
			}
			if f.Name == "b.txt" && *f.Modified != "2024-05-06T07:08:09" {
				t.Errorf("b.txt modified = %s", *f.Modified)
			}
		}
	}
}

// TestConfinement: no path, however it is spelled or wherever its symlinks
// point, reads or writes outside the root.
func TestConfinement(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	ctx := context.Background()
	out := outsideDir(t)
	ws := filepath.Join(a.root, "workspace")
	if err := os.MkdirAll(filepath.Join(ws, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "data", "in.txt"), []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(ws, out)
	if err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"abs-out":  out,                  // absolute: means <root>/<out> in here
		"rel-out":  rel,                  // relative, climbs out of the root
		"rel-in":   "data",               // relative, stays inside
		"abs-in":   "/workspace/data",    // absolute, inside
		"abs-root": "/",                  // the sandbox's /
		"etc":      "../../../../../etc", // climbs out through /
	} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}

	escape := func(t *testing.T, err error) {
		t.Helper()
		wantFault(t, err, 400, faults.InvalidRequest, faults.CodePathEscape)
	}
	notFound := func(t *testing.T, err error) {
		t.Helper()
		wantFault(t, err, 404, faults.NotFound, faults.CodeFileNotFound)
	}
	tests := []struct {
		name    string
		path    string
		escapes bool // refused; otherwise it resolves inside the root
	}{
		{"relative traversal", "../../etc/passwd", true},
		{"absolute traversal", "/../../etc/passwd", true},
		{"traversal after a dir", "/workspace/../../../etc/passwd", true},
		{"relative symlink escape", "/workspace/rel-out/secret.txt", true},
		{"relative symlink to /etc", "/workspace/etc/passwd", true},
		{"absolute symlink stays in root", "/workspace/abs-out/secret.txt", false},
		{"root symlink stays in root", "/workspace/abs-root" + out + "/secret.txt", false},
	}
	for _, tt := range tests {
		t.Run("download "+tt.name, func(t *testing.T) {
			fc, err := a.Download(ctx, tt.path)
			if err == nil {
				t.Fatalf("read %q outside the root: %+v", tt.path, fc)
			}
			if tt.escapes {
				escape(t, err)
			} else {
				notFound(t, err)
			}
		})
	}
	// Uploads after all downloads: the ones that land inside the root
	// create the files the downloads above expect to be missing.
	for _, tt := range tests {
		t.Run("upload "+tt.name, func(t *testing.T) {
			_, err := a.Upload(ctx, api.UploadRequest{Path: ptr(tt.path), Content: b64("pwned")})
			if tt.escapes {
				escape(t, err)
			} else if err != nil {
				t.Fatalf("upload inside the root: %v", err)
			}
			b, _ := os.ReadFile(filepath.Join(out, "secret.txt"))
			if string(b) != "OUTSIDE-SECRET" {
				t.Fatalf("outside file changed: %q", b)
			}
			if ents, _ := os.ReadDir(out); len(ents) != 1 {
				t.Fatalf("outside dir gained entries: %v", ents)
			}
		})
	}
	t.Run("absolute symlink write lands in the root", func(t *testing.T) {
		if _, err := a.Upload(ctx, api.UploadRequest{Path: ptr("/workspace/abs-out/new.txt"), Content: b64("n")}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(a.root, out, "new.txt")); err != nil {
			t.Fatalf("not written under the root: %v", err)
		}
	})
	t.Run("symlinks inside work", func(t *testing.T) {
		for _, p := range []string{"/workspace/rel-in/in.txt", "/workspace/abs-in/in.txt", "/workspace/abs-root/workspace/data/in.txt"} {
			fc, err := a.Download(ctx, p)
			if err != nil || fc.Content != *b64("inside") {
				t.Errorf("Download(%q) = %+v, %v", p, fc, err)
			}
		}
	})
	t.Run("list through symlinks", func(t *testing.T) {
		l, err := a.List(ctx, "/workspace/rel-in")
		if err != nil || len(l.Files) != 1 || l.Files[0].Name != "in.txt" {
			t.Fatalf("List = %+v, %v", l, err)
		}
		_, err = a.List(ctx, "/workspace/rel-out")
		escape(t, err)
	})
}
