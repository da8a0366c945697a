package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// Orchard's Python client (sdk/python) against a real server on loopback:
// its unittest suite drives shell, browser and desktop sandboxes, an
// episode, its forks and its recording, and checks the classified errors.
func TestPythonClient(t *testing.T) {
	testenv.RequireChromium(t)
	var env []string
	if _, err := exec.LookPath("Xvfb"); err == nil {
		env = append(env, "ORCHARD_TEST_DESKTOP=1")
	}
	runPythonTests(t, testserver.Start(t, testserver.Options{}), "tests.test_live", env...)
}

// runPythonTests runs a unittest target of sdk/python against srv and
// fails unless every test in it ran (none skipped for want of a server)
// and passed.
func runPythonTests(t *testing.T, srv *testserver.Server, target string, env ...string) {
	t.Helper()
	py, err := exec.LookPath("python3")
	testenv.Require(t, "python3", err == nil, "python3 not in PATH (apt-get install python3)")
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "unittest", "-v", target)
	cmd.Dir = filepath.Join(root, "sdk", "python")
	cmd.Env = append(os.Environ(), "ORCHARD_URL="+srv.URL, "ORCHARD_API_KEY="+srv.APIKey, "PYTHONDONTWRITEBYTECODE=1")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest %s: %v\n%s", target, err, out)
	}
	if s := string(out); strings.Contains(s, "skipped 'ORCHARD_URL") || !strings.Contains(s, "OK") {
		t.Fatalf("%s did not run against the server:\n%s", target, s)
	}
	t.Logf("%s", out)
}
