package local

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/internal/testing/testenv"
)

func TestUnpackWhiteouts(t *testing.T) {
	testenv.RequireRoot(t) // whiteouts are device nodes, opaque dirs trusted xattrs
	dir := t.TempDir()
	b := buildTar(t, []tarEntry{
		{name: "./a/", typ: tar.TypeDir},
		{name: "./a/.wh.gone", typ: tar.TypeReg},
		{name: "./a/.wh..wh..opq", typ: tar.TypeReg},
		{name: "./a/.wh..wh.plnk", typ: tar.TypeReg},
		{name: "/b/c/d", typ: tar.TypeReg, body: "deep", mode: 0o4755},
		{name: "b/c/d", typ: tar.TypeReg, body: "replaced", mode: 0o4755},
	})
	if err := unpackTar(context.Background(), bytes.NewReader(b), dir); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "a/gone"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout a/gone: mode %o rdev %d; want a 0/0 char device", st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(dir, "a"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr on a: %q, %v", buf[:n], err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "a/.wh..wh.plnk")); !os.IsNotExist(err) {
		t.Errorf("AUFS metadata entry unpacked: %v", err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "b/c/d"))
	fi, _ := os.Stat(filepath.Join(dir, "b/c/d"))
	if string(got) != "replaced" || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("b/c/d = %q mode %v; want the later entry, setuid kept", got, fi.Mode())
	}
}

func TestUnpackRefusesEscapes(t *testing.T) {
	for name, entries := range map[string][]tarEntry{
		"DotDot":          {{name: "../x", typ: tar.TypeReg, body: "x"}},
		"DotDotInside":    {{name: "a/../../x", typ: tar.TypeReg, body: "x"}},
		"ThroughSymlink":  {{name: "l", typ: tar.TypeSymlink, linkname: "/tmp"}, {name: "l/x", typ: tar.TypeReg, body: "x"}},
		"RelativeSymlink": {{name: "l", typ: tar.TypeSymlink, linkname: "../../.."}, {name: "l/x", typ: tar.TypeReg, body: "x"}},
		"HardlinkOut":     {{name: "h", typ: tar.TypeLink, linkname: "../../etc/passwd"}},
		"HardlinkViaLink": {{name: "l", typ: tar.TypeSymlink, linkname: "/etc"}, {name: "h", typ: tar.TypeLink, linkname: "l/passwd"}},
		"WhiteoutDotDot":  {{name: "a/.wh...", typ: tar.TypeReg}},
	} {
		t.Run(name, func(t *testing.T) {
			outer := t.TempDir()
			dir := filepath.Join(outer, "layer")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			err := unpackTar(context.Background(), bytes.NewReader(buildTar(t, entries)), dir)
			if err == nil {
				t.Fatal("unpack succeeded; want a refusal")
			}
			if !errors.Is(err, errEscape) {
				t.Logf("refused with %v", err)
			}
			if _, err := os.Lstat(filepath.Join(outer, "x")); err == nil {
				t.Error("file written outside the layer")
			}
			if _, err := os.Lstat("/tmp/x"); err == nil {
				t.Log("note: /tmp/x exists on this host")
			}
		})
	}
}

func TestLocalPath(t *testing.T) {
	for in, want := range map[string]string{
		"a/b": "a/b", "./a/b/": "a/b", "/a": "a", "./": ".", "a//b": "a/b",
	} {
		if got, err := localPath(in); err != nil || got != want {
			t.Errorf("localPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"..", "../a", "a/../../b", "a/.."} {
		if _, err := localPath(in); !errors.Is(err, errEscape) {
			t.Errorf("localPath(%q) = %v; want errEscape", in, err)
		}
	}
}
