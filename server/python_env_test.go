package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// The Python package as a user gets it: `pip install ./sdk/python` into a
// fresh venv with no package index, then, from a folder outside the
// source tree, the README's env loop and the OrchardEnv suite (browser and
// desktop loops, the batch helper, no sandbox left after SIGTERM or
// Ctrl-C) against a real server.
func TestPythonPackageEnv(t *testing.T) {
	testenv.RequireChromium(t)
	py, err := exec.LookPath("python3")
	testenv.Require(t, "python3", err == nil, "python3 not in PATH (apt-get install python3)")
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	venv := filepath.Join(work, "venv")
	if out, err := exec.Command(py, "-m", "venv", venv).CombinedOutput(); err != nil {
		testenv.Require(t, "python3-venv", false, "python3 -m venv: "+strings.TrimSpace(string(out))+" (apt-get install python3-venv)")
	}
	vpy := filepath.Join(venv, "bin", "python")
	install := exec.Command(vpy, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "--quiet", filepath.Join(root, "sdk", "python"))
	install.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_CONFIG_FILE=/dev/null")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./sdk/python: %v\n%s", err, out)
	}

	srv := testserver.Start(t, testserver.Options{})
	env := append(os.Environ(), "ORCHARD_URL="+srv.URL, "ORCHARD_API_KEY="+srv.APIKey, "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH=", "ORCHARD_TEST_INSTALLED=1")
	if _, err := exec.LookPath("Xvfb"); err == nil {
		env = append(env, "ORCHARD_TEST_DESKTOP=1")
	}
	outside := filepath.Join(work, "elsewhere")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}

	readme, err := os.ReadFile(filepath.Join(root, "sdk", "python", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- env-loop -->\n```python\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("sdk/python/README.md has no env-loop example")
	}
	loop := exec.Command(vpy, "-c", string(m[1]))
	loop.Dir, loop.Env = outside, env
	out, err := loop.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "success 1.0 False" {
		t.Fatalf("the README's env loop: %v\n%s", err, out)
	}

	test, err := os.ReadFile(filepath.Join(root, "sdk", "python", "tests", "test_env.py"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "test_env.py"), test, 0o644); err != nil {
		t.Fatal(err)
	}
	suite := exec.Command(vpy, "-m", "unittest", "-v", "test_env")
	suite.Dir, suite.Env = outside, env
	out, err = suite.CombinedOutput()
	if err != nil {
		t.Fatalf("test_env against the installed package: %v\n%s", err, out)
	}
	if s := string(out); strings.Contains(s, "skipped 'ORCHARD_URL") || !strings.Contains(s, "OK") {
		t.Fatalf("test_env did not run against the server:\n%s", s)
	}
	t.Logf("%s", out)
}
