package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/orchard/orchard/harness"
)

// NPMHarnesses are the harnesses npm installs, which HarnessStore provides.
var NPMHarnesses = []string{"claude", "codex", "opencode", "pi"}

// harnessInstallTimeout bounds a first install: four packages of a few
// hundred MB each from the npm registry on a slow link.
const harnessInstallTimeout = 15 * time.Minute

// HarnessStore returns the folder of a harness store holding
// NPMHarnesses at the versions harness/testdata/harnesses.lock pins,
// installed from the npm registry into the user's cache
// (~/.cache/orchard/harness-state) the first time: later runs, and other
// test packages, reuse it (the store's flock serialises them). Skips (or
// fails, see Require) without node and npm.
func HarnessStore(t testing.TB) string {
	t.Helper()
	_, errNode := exec.LookPath("node")
	_, errNPM := exec.LookPath("npm")
	Require(t, "npm", errNode == nil && errNPM == nil, "node and npm install the harnesses (apt-get install nodejs npm)")
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	s := &harness.Store{
		Dir:      filepath.Join(cache, "orchard", "harness-state", "harnesses"),
		LockFile: filepath.Join(root, "harness", "testdata", "harnesses.lock"),
		NPMCache: filepath.Join(cache, "orchard", "npm"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), harnessInstallTimeout)
	defer cancel()
	if err := s.Install(ctx, NPMHarnesses); err != nil {
		t.Fatalf("install harnesses: %v", err)
	}
	return s.Dir
}
