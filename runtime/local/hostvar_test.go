package local

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/runtime"
)

// hostData makes a private folder (0700, like a database's) holding a
// file in each of dirs, removed at cleanup, and returns the files.
func hostData(t *testing.T, tag string, dirs ...string) []string {
	t.Helper()
	var files []string
	for _, dir := range dirs {
		d := filepath.Join(dir, tag)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		f := filepath.Join(d, "data")
		if err := os.WriteFile(f, []byte("secret of "+dir+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// hostSandbox creates a "host" sandbox on l, with the masks layer or, when
// mounts is set, with a mount per mask (as on kernels without the layer).
func hostSandbox(t *testing.T, l *Local, id string, mounts bool) {
	t.Helper()
	if mounts && l.masks != nil {
		l.masks.Close()
		l.masks = nil
	}
	if !mounts {
		testenv.Require(t, "masks layer", l.masks != nil, "this kernel's overlayfs does not stack a detached layer")
	}
	create(t, l, runtime.Spec{ID: id})
}

// Other services' data under /var (a database in /var/lib, logs and the
// journal, mail, queues, backups, caches) is hidden from "host"
// sandboxes, whose root keeps CAP_DAC_OVERRIDE and so reads 0700 folders;
// the package database and the font cache stay visible.
func TestHostVarMasked(t *testing.T) {
	testenv.RequireRoot(t)
	tag := fmt.Sprintf("orchard-test-%d", time.Now().UnixNano())
	dirs := []string{"/var/lib", "/var/log", "/var/spool", "/var/mail", "/var/backups", "/var/cache"}
	private := hostData(t, tag, dirs...)
	if _, err := os.Stat("/var/lib/postgresql"); err == nil {
		private = append(private, "/var/lib/postgresql")
	}
	if _, err := os.Stat("/var/log/journal"); err == nil {
		private = append(private, "/var/log/journal")
	}
	var fontCaches int
	if ents, err := os.ReadDir("/var/cache/fontconfig"); err == nil {
		fontCaches = len(ents)
	}
	_, dpkgErr := os.Stat("/var/lib/dpkg/status")

	for _, mode := range []struct {
		name   string
		mounts bool
	}{{"Layer", false}, {"Mounts", true}} {
		t.Run(mode.name, func(t *testing.T) {
			l := newLocal(t)
			id := "var-" + strings.ToLower(mode.name)
			hostSandbox(t, l, id, mode.mounts)

			args := []string{"sh", "-c", `for p in "$@"; do if [ -e "$p" ]; then echo "visible $p"; cat "$p" 2>&1; ls -A "$p" 2>&1; fi; done; echo checked`, "sh"}
			out, _ := l.execForTest(t, id, append(args, private...)...)
			if strings.Contains(out, "visible") || strings.Contains(out, "secret") || !strings.Contains(out, "checked") {
				t.Errorf("host data under /var readable in the sandbox:\n%s", out)
			}
			for _, dir := range dirs {
				out, code := l.execForTest(t, id, "ls", "-A", dir)
				var left []string
				for _, name := range strings.Fields(out) {
					if !slices.Contains(l.hostMasks.visible, filepath.Join(dir, name)) {
						left = append(left, name)
					}
				}
				if code != 0 || len(left) > 0 {
					t.Errorf("ls -A %s in the sandbox (exit %d): %v; want only the visible folders", dir, code, left)
				}
			}

			if dpkgErr == nil {
				out, code := l.execForTest(t, id, "dpkg-query", "-W", "-f=${Status}", "dpkg")
				if code != 0 || out != "install ok installed" {
					t.Errorf("dpkg-query in the sandbox (exit %d): %q; want the host's package database", code, out)
				}
			}
			if fontCaches > 0 {
				out, _ := l.execForTest(t, id, "sh", "-c", "ls /var/cache/fontconfig | wc -l")
				if strings.TrimSpace(out) != fmt.Sprint(fontCaches) {
					t.Errorf("font caches in the sandbox: %s; want the host's %d", out, fontCaches)
				}
			}
			if !mode.mounts && dpkgErr == nil {
				// Visible folders take writes in the sandbox's own layer,
				// as the rest of its root does.
				probe := "/var/lib/dpkg/" + tag
				out, code := l.execForTest(t, id, "sh", "-c", "echo x > "+probe+" && ls /var/lib/dpkg/status "+probe)
				if code != 0 {
					t.Errorf("write in /var/lib/dpkg in the sandbox (exit %d): %s", code, out)
				}
				if _, err := os.Stat(probe); err == nil {
					os.Remove(probe)
					t.Errorf("a write in the sandbox's /var/lib/dpkg reached the host")
				}
			}
		})
	}
}

// A host path the operator exposes (HostExpose) is readable in "host"
// sandboxes, inside a masked folder, and not writable.
func TestHostExpose(t *testing.T) {
	testenv.RequireRoot(t)
	tag := fmt.Sprintf("orchard-test-%d", time.Now().UnixNano())
	shared := filepath.Dir(hostData(t, tag+"-shared", "/var/lib")[0])
	secret := hostData(t, tag, "/var/lib")[0]
	// A link to the folder: exposed where it leads.
	link := filepath.Join(t.TempDir(), "shared")
	if err := os.Symlink(shared, link); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct {
		name   string
		mounts bool
	}{{"Layer", false}, {"Mounts", true}} {
		t.Run(mode.name, func(t *testing.T) {
			l := newLocal(t, func(c *Config) { c.HostExpose = []string{link} })
			id := "expose-" + strings.ToLower(mode.name)
			hostSandbox(t, l, id, mode.mounts)

			out, code := l.execForTest(t, id, "cat", filepath.Join(shared, "data"))
			if code != 0 || out != "secret of /var/lib\n" {
				t.Errorf("exposed file in the sandbox (exit %d): %q", code, out)
			}
			for _, cmd := range []string{
				"echo x >> " + filepath.Join(shared, "data"),
				"touch " + filepath.Join(shared, "new"),
				"rm " + filepath.Join(shared, "data"),
			} {
				out, code := l.execForTest(t, id, "sh", "-c", cmd)
				if code == 0 || !strings.Contains(out, "Read-only file system") {
					t.Errorf("%s in the sandbox: exit %d, %q; want a read-only file system", cmd, code, out)
				}
			}
			if b, err := os.ReadFile(filepath.Join(shared, "data")); err != nil || string(b) != "secret of /var/lib\n" {
				t.Errorf("exposed file on the host after the sandbox's writes: %q, %v", b, err)
			}
			out, _ = l.execForTest(t, id, "sh", "-c", `test -e "$1" && echo visible; ls -A /var/lib`, "sh", secret)
			if strings.Contains(out, "visible") || strings.Contains(out, tag+"\n") {
				t.Errorf("the rest of /var/lib shows in the sandbox:\n%s", out)
			}
		})
	}
}

func TestCheckExposed(t *testing.T) {
	testenv.RequireRoot(t)
	state := t.TempDir()
	masked := t.TempDir() // a configured HostMasks path
	open := t.TempDir()
	toKeys := filepath.Join(open, "keys")
	if err := os.Symlink("/etc/ssl/private", toKeys); err != nil {
		t.Fatal(err)
	}
	m := hostMasks(state, []string{masked})
	secrets := append([]string{state, "/var/lib/orchard", masked}, keyFiles()...)
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/var/log", true},
		{"/var/lib/dpkg", true},
		{open, true},
		{"/", false},
		{"/proc/self", false},
		{"/sys", false},
		{"/dev", false},
		{"/etc", false},        // holds /etc/shadow
		{"/etc/shadow", false}, // a key file
		{"/etc/ssl", false},    // holds TLS keys
		{toKeys, false},        // leads to them
		{"/var", false},        // holds /var/lib, /var/log...
		{"/var/lib", false},    // holds /var/lib/orchard
		{state, false},
		{filepath.Join(state, "."), false},
		{masked, false},
		{filepath.Dir(state), false}, // holds the state directory
		{"/nonexistent-" + filepath.Base(open), false},
	} {
		t.Run(tc.path, func(t *testing.T) {
			got, err := checkExposed(tc.path, m, secrets)
			if (err == nil) != tc.ok {
				t.Fatalf("checkExposed(%s) = %q, %v; want ok %v", tc.path, got, err, tc.ok)
			}
		})
	}
	// New refuses it.
	if l, err := New(Config{StateDir: state, AgentPath: testenv.AgentBinary(t), HostExpose: []string{"/etc"}}); err == nil {
		l.Close()
		t.Errorf("New exposing /etc: no error")
	}
}
