package testenv

import (
	"errors"
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

// InitBinaryEnv names a prebuilt orchard-init binary for InitBinary.
const InitBinaryEnv = "ORCHARD_INIT"

// initBuild builds orchard-init at most once per test process.
var initBuild struct {
	once sync.Once
	path string
	err  string
}

// InitBinary returns the path of an orchard-init binary (the containers'
// init, see runtime/local.ReexecSealed) built from this source tree:
// $ORCHARD_INIT when set, otherwise ./cmd/orchard-init built once per test
// process into the user's cache directory, with the seccomp tag when the
// calling test binary has it (both sides must agree on the filter).
// Without a t (TestMain runs before any test), a failed build is an error.
func InitBinary(seccomp bool) (string, error) {
	if p := os.Getenv(InitBinaryEnv); p != "" {
		return p, nil
	}
	initBuild.once.Do(func() {
		name, tags := "orchard-init", []string(nil)
		if seccomp {
			name, tags = "orchard-init-seccomp", []string{"seccomp"}
		}
		initBuild.path, initBuild.err = buildCached(name, "./cmd/orchard-init", "CGO_ENABLED=1", tags...)
	})
	if initBuild.err != "" {
		return "", errors.New("build orchard-init: " + initBuild.err)
	}
	return initBuild.path, nil
}
