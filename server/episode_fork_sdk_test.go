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

// The Python client's episode forks (fork_episode, episode_tree,
// value_of_step) against a real server: only that test of its live
// suite, which TestPythonClient runs whole.
func TestEpisodeForkPythonSDK(t *testing.T) {
	py, err := exec.LookPath("python3")
	testenv.Require(t, "python3", err == nil, "python3 not in PATH (apt-get install python3)")
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	root, err := testenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "unittest", "-v", "tests.test_live.Live.test_episode_fork")
	cmd.Dir = filepath.Join(root, "sdk", "python")
	cmd.Env = append(os.Environ(), "ORCHARD_URL="+srv.URL, "ORCHARD_API_KEY="+srv.APIKey, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s", err, out)
	}
	if s := string(out); strings.Contains(s, "skipped") || !strings.Contains(s, "OK") {
		t.Fatalf("the test did not run against the server:\n%s", s)
	}
	t.Logf("%s", out)
}
