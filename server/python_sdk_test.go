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
// episode and its recording, and checks the classified errors.
func TestPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	testenv.Require(t, "python3", err == nil, "python3 not in PATH (apt-get install python3)")
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "sdk", "python")
	cmd := exec.Command(py, "-m", "unittest", "-v", "tests.test_live")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ORCHARD_URL="+srv.URL, "ORCHARD_API_KEY="+srv.APIKey, "PYTHONDONTWRITEBYTECODE=1")
	if _, err := exec.LookPath("Xvfb"); err == nil {
		cmd.Env = append(cmd.Env, "ORCHARD_TEST_DESKTOP=1")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s", err, out)
	}
	// Every test ran: none skipped for want of a server.
	if s := string(out); strings.Contains(s, "skipped 'ORCHARD_URL") || !strings.Contains(s, "OK") {
		t.Fatalf("the suite did not run against the server:\n%s", s)
	}
	t.Logf("%s", out)
}
