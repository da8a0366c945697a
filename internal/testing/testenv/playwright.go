package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// PlaywrightDir is where the Playwright client of the DevTools proxy test
// lives, relative to the module root; scripts/dev.sh test fetches its
// pinned playwright-core into node_modules there.
const PlaywrightDir = "server/testdata/playwright"

// RequirePlaywright returns Node's path and the directory holding the
// Playwright client, or skips (or fails, see Require) when either is
// missing. The dependency's name is "playwright".
func RequirePlaywright(t testing.TB) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	Require(t, "playwright", err == nil, "no node in PATH (apt-get install nodejs)")
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(root, PlaywrightDir)
	_, err = os.Stat(filepath.Join(dir, "node_modules", "playwright-core", "package.json"))
	Require(t, "playwright", err == nil, "playwright-core is not in "+dir+"/node_modules (scripts/dev.sh test fetches it)")
	return node, dir
}
