package testenv

import (
	"os"
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
	return buildCached("orchard", "./cmd/orchard", "CGO_ENABLED=1", "seccomp")
}
