package local

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/runtime"
)

// initBinary is orchard-init from this source tree, built with the same
// seccomp choice as this test binary.
func initBinary(t testing.TB) string {
	t.Helper()
	p, err := testenv.InitBinary(seccompEnabled)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestContainerInit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		initPath func(t *testing.T) string
		wantErr  bool
	}{
		{"ThisBinary", func(*testing.T) string { return "" }, false},
		{"OrchardInit", func(t *testing.T) string { return initBinary(t) }, false},
		// An init that exits at once: the create fails only if the
		// container's init really ran as the configured binary.
		{"RedirectTaken", func(*testing.T) string { return "/bin/false" }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.initPath(t)
			l := newLocal(t, func(c *Config) { c.InitPath = path })
			id := "init-" + strings.ToLower(tc.name)
			_, err := l.Create(ctxTimeout(t, 2*time.Minute), runtime.Spec{ID: id})
			if tc.wantErr {
				if err == nil {
					_ = l.Delete(t.Context(), id)
					t.Fatalf("Create with init %s succeeded; want the init's failure", path)
				}
				checkGone(t, l, id)
				return
			}
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			t.Cleanup(func() { _ = l.Delete(t.Context(), id) })
			// The sealed init is the init's to run, not the sandbox's to keep.
			fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", l.initPID(t, id)))
			for _, fd := range fds {
				if link, _ := os.Readlink(fd); strings.Contains(link, "orchard-init") {
					t.Errorf("agent holds %s -> %s", fd, link)
				}
			}
			if out, code := l.execForTest(t, id, "echo", "ok"); code != 0 || out != "ok\n" {
				t.Errorf("exec in sandbox: %d %q", code, out)
			}
		})
	}
}

func TestNewRejectsMissingInit(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := New(Config{StateDir: t.TempDir(), AgentPath: testenv.AgentBinary(t), InitPath: filepath.Join(t.TempDir(), "none")})
	if err == nil || !strings.Contains(err.Error(), "container init") {
		t.Fatalf("New with a missing init: %v; want a container init error", err)
	}
}
