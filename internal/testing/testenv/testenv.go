// Package testenv holds helpers that tests use to find or build the real
// dependencies they run against (root, the agent binary, system packages)
// and to decide whether a missing dependency skips the test or fails it.
//
// On a laptop a missing dependency skips; when ORCHARD_TEST_REQUIRE is "all"
// (CI sets it) or names the dependency in a comma-separated list, it fails,
// so that a green run never hides tests that did not run.
package testenv

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// RequireEnv is the environment variable that turns skips into failures:
// "all", or a comma-separated list of dependency names ("root,busybox").
const RequireEnv = "ORCHARD_TEST_REQUIRE"

// Required reports whether the dependency called name must be present.
func Required(name string) bool {
	v := strings.TrimSpace(os.Getenv(RequireEnv))
	if v == "" {
		return false
	}
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "all" || f == name {
			return true
		}
	}
	return false
}

// Require skips the test when ok is false, or fails it when the dependency
// called name is required (see RequireEnv). why says what is missing.
func Require(t testing.TB, name string, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if Required(name) {
		t.Fatalf("%s required (%s=%s) but unavailable: %s", name, RequireEnv, os.Getenv(RequireEnv), why)
	}
	t.Skipf("%s unavailable: %s", name, why)
}

// RequireRoot skips (or fails, see Require) unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	Require(t, "root", os.Geteuid() == 0, "test needs root (namespaces, mounts, cgroups)")
}

// agentBuild builds the agent at most once per test process.
var agentBuild struct {
	once sync.Once
	path string
	err  string
}

// AgentBinary returns the path of a static orchard-agent binary: $ORCHARD_AGENT
// when set, otherwise ./cmd/orchard-agent built with CGO_ENABLED=0, once per
// test process, into the user's cache directory.
func AgentBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("ORCHARD_AGENT"); p != "" {
		return p
	}
	agentBuild.once.Do(func() {
		agentBuild.path, agentBuild.err = buildAgent()
	})
	if agentBuild.err != "" {
		t.Fatalf("build orchard-agent: %s", agentBuild.err)
	}
	return agentBuild.path
}

func buildAgent() (string, string) {
	return buildCached("orchard-agent", "./cmd/orchard-agent", "CGO_ENABLED=0")
}

// buildCached builds pkg into the user's cache directory as name and
// returns its path (or an error text). A fixed place rather than
// t.TempDir: the binary outlives any one test and must not pile up across
// runs. Builds go to a private name and are renamed into place, so
// concurrent test processes never run half a file (a process already
// running keeps its inode).
func buildCached(name, pkg, cgo string, tags ...string) (string, string) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err.Error()
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	// One folder per checkout: tests of two checkouts of the module (a
	// second work tree) at once must not run each other's binaries.
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(cache, "orchard", "testenv", hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err.Error()
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err.Error()
	}
	defer os.RemoveAll(tmp)
	built := filepath.Join(tmp, name)
	args := []string{"build", "-trimpath"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, "-o", built, pkg)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), cgo)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", err.Error() + ": " + string(b)
	}
	out := filepath.Join(dir, name)
	if err := os.Rename(built, out); err != nil {
		return "", err.Error()
	}
	return out, ""
}

// ModuleRoot returns the directory holding the main module's go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	gomod := string(bytes.TrimSpace(out))
	if gomod == "" || gomod == os.DevNull {
		return "", os.ErrNotExist
	}
	return filepath.Dir(gomod), nil
}

// ProcessesNamed is a shell command that prints the /proc entry of every
// process whose name is name and succeeds: run in a sandbox, it shows
// what is left of a killed command without needing ps.
func ProcessesNamed(name string) string {
	return `for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = ` + name + ` ] && echo $p; done; true`
}
