package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// ServerBinaryEnv names a prebuilt `orchard` binary for OrchardBinary to
// use instead of building one.
const ServerBinaryEnv = "ORCHARD_SERVER_BIN"

// orchardBuild builds the server at most once per test process.
var orchardBuild struct {
	once sync.Once
	path string
	err  string
}

// OrchardBinary returns the path of an `orchard` server binary, for tests
// that run `orchard serve` as a real process: $ORCHARD_SERVER_BIN when set,
// otherwise ./cmd/orchard built with cgo and -tags seccomp (libcontainer's
// syscall filter needs libseccomp-dev), once per test process, into the
// user's cache directory. The agent is not embedded: callers pass
// ORCHARD_AGENT (AgentBinary) to the server they start.
func OrchardBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(ServerBinaryEnv); p != "" {
		return p
	}
	orchardBuild.once.Do(func() {
		orchardBuild.path, orchardBuild.err = buildOrchard()
	})
	if orchardBuild.err != "" {
		t.Fatalf("build orchard: %s", orchardBuild.err)
	}
	return orchardBuild.path
}

func buildOrchard() (string, string) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err.Error()
	}
	// As for the agent: a fixed place shared across runs, and a private
	// build name renamed into place, so concurrent test processes never
	// run half a file (a process already running keeps its inode).
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "orchard", "testenv")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err.Error()
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err.Error()
	}
	defer os.RemoveAll(tmp)
	built := filepath.Join(tmp, "orchard")
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "seccomp", "-o", built, "./cmd/orchard")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", err.Error() + ": " + string(b)
	}
	out := filepath.Join(dir, "orchard")
	if err := os.Rename(built, out); err != nil {
		return "", err.Error()
	}
	return out, ""
}
