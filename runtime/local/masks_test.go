package local

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/runtime"
)

func TestBuildMasksLayer(t *testing.T) {
	testenv.RequireRoot(t)
	// Host paths to hide, with their own modes.
	host, err := os.MkdirTemp("/var/cache", "orchard-mask-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(host) })
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{host, 0o751}, {filepath.Join(host, "dir"), 0o750}, {filepath.Join(host, "sub"), 0o711},
		{filepath.Join(host, "db"), 0o700}, {filepath.Join(host, "db", "shown"), 0o705}} {
		if err := os.MkdirAll(d.path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(host, "dir", "secret"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "sub", "key"), []byte("secret"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("dir", filepath.Join(host, "link")); err != nil {
		t.Fatal(err)
	}

	m := masks{
		writable: []string{"/tmp", filepath.Join(host, "scratch")},
		hidden: []string{
			filepath.Join(host, "link"), // hides what it points to
			filepath.Join(host, "sub", "key"),
			filepath.Join(host, "missing"),
			filepath.Join(host, "db"),
		},
		visible: []string{filepath.Join(host, "db", "shown")},
	}
	f, err := buildMasksLayer(m)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := overlayTakesLayer(f, m); err != nil {
		t.Errorf("overlayfs refuses the layer (sandboxes fall back to a mount per mask): %v", err)
	}
	layer := fdPath(f)

	cases := []struct {
		path   string // on the host; "" want: absent from the layer
		mode   os.FileMode
		opaque bool
		empty  bool
		// redirect: the layer sends overlayfs on to the host's folder.
		redirect bool
	}{
		{path: "/tmp", mode: os.ModeDir | os.ModeSticky | 0o777, opaque: true, empty: true},
		{path: host, mode: os.ModeDir | 0o751}, // a parent: the host's mode, merged
		{path: filepath.Join(host, "scratch"), mode: os.ModeDir | 0o755, opaque: true, empty: true},
		{path: filepath.Join(host, "dir"), mode: os.ModeDir | 0o750, opaque: true, empty: true},
		{path: filepath.Join(host, "sub"), mode: os.ModeDir | 0o711}, // a parent
		{path: filepath.Join(host, "sub", "key"), mode: 0o640, empty: true},
		{path: filepath.Join(host, "link")},
		{path: filepath.Join(host, "missing")},
		{path: filepath.Join(host, "db"), mode: os.ModeDir | 0o700, opaque: true},
		{path: filepath.Join(host, "db", "shown"), mode: os.ModeDir | 0o705, redirect: true},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			p := filepath.Join(layer, tc.path)
			fi, err := os.Lstat(p)
			if tc.mode == 0 {
				if err == nil {
					t.Fatalf("%s in the masks layer; want absent", tc.path)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != tc.mode {
				t.Errorf("mode %v; want %v", fi.Mode(), tc.mode)
			}
			buf := make([]byte, 4096)
			n, _ := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
			if opaque := n == 1 && buf[0] == 'y'; opaque != tc.opaque {
				t.Errorf("opaque %v; want %v", opaque, tc.opaque)
			}
			n, _ = unix.Lgetxattr(p, "trusted.overlay.redirect", buf)
			if redirect := string(buf[:max(n, 0)]); tc.redirect && redirect != tc.path || !tc.redirect && n > 0 {
				t.Errorf("redirect %q; want %v", redirect, tc.redirect)
			}
			if tc.empty {
				if fi.IsDir() {
					if ents, _ := os.ReadDir(p); len(ents) > 0 {
						t.Errorf("%d entries; want none", len(ents))
					}
				} else if fi.Size() != 0 {
					t.Errorf("size %d; want 0", fi.Size())
				}
			}
		})
	}

}

func TestContainerConfigMasks(t *testing.T) {
	layer, err := os.Open("/") // any file: only nil or not matters here
	if err != nil {
		t.Fatal(err)
	}
	defer layer.Close()
	m := masks{
		writable: []string{"/tmp", "/root"},
		hidden:   []string{"/work", "/etc/shadow", "/var/lib", "/var/log", "/srv"},
		visible:  []string{"/var/lib/dpkg"},
	}
	expose := []string{"/var/log/app", "/srv", "/opt/data"}
	cases := []struct {
		name       string
		masks      *os.File
		host       bool
		wantMounts []string // of the masks and exposed paths, in order
		wantMasked []string // MaskPaths beyond runc's defaults
	}{
		{"layer", layer, true, []string{"/opt/data", "/srv", "/var/log/app"}, nil},
		{"mounts", nil, true, []string{"/opt/data", "/root", "/srv", "/tmp", "/var/lib", "/var/lib/dpkg", "/var/log", "/var/log/app"},
			[]string{"/work", "/etc/shadow"}},
		{"image", layer, false, nil, nil},
		{"image without layer", nil, false, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := &Local{hostMasks: m, masks: tc.masks, cfg: Config{HostExpose: expose}}
			cfg := l.containerConfig(runtime.Spec{ID: "x"}, &image{host: tc.host}, "/rootfs")
			var got []string
			for _, mnt := range cfg.Mounts {
				if !strings.HasPrefix(mnt.Destination, "/dev") && mnt.Destination != "/proc" && mnt.Destination != "/sys" && mnt.Destination != agentMount {
					got = append(got, mnt.Destination)
					if mnt.Device == "bind" && mnt.Flags&unix.MS_RDONLY == 0 {
						t.Errorf("bind mount of %s is writable", mnt.Destination)
					}
				}
			}
			if !slices.Equal(got, tc.wantMounts) {
				t.Errorf("mask mounts %v; want %v", got, tc.wantMounts)
			}
			if extra := cfg.MaskPaths[len(maskedPaths):]; !slices.Equal(extra, tc.wantMasked) {
				t.Errorf("masked paths beyond runc's: %v; want %v", extra, tc.wantMasked)
			}
		})
	}
}
