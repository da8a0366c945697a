package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/dataset"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/recordings"
	"github.com/orchard/orchard/server"
)

// orchard dataset build, through the server and from a local recordings
// folder: the same recordings make the same files, env_error is left out,
// and the mind2web layout writes a folder per task.
func TestCLIDatasetBuild(t *testing.T) {
	recDir := t.TempDir()
	st, err := recordings.NewStore(recDir)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range []string{"success", "failure", "env_error", "success"} {
		w, err := st.Create(recordings.Manifest{ID: fmt.Sprintf("r%d", i), TaskID: fmt.Sprintf("t%d", i), Suite: "s", Kind: "browser",
			Question: "q", CreatedAt: time.Now().UTC().Add(time.Duration(i-10) * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Append(recordings.Step{N: 0}, []byte("jpeg"), "jpg"); err != nil {
			t.Fatal(err)
		}
		if err := w.Finish(func(m *recordings.Manifest) { m.Outcome = o }); err != nil {
			t.Fatal(err)
		}
	}
	srv := testserver.Start(t, testserver.Options{Server: server.Config{RecordingsDir: recDir}})
	c := &cli{t: t, env: map[string]string{"ORCHARD_URL": srv.URL, "ORCHARD_API_KEY": srv.APIKey}, srv: srv}

	remote, local := filepath.Join(t.TempDir(), "remote"), filepath.Join(t.TempDir(), "local")
	out := c.mustRun("dataset", "build", "--out", remote, "--suite", "s", "--test-percent", "50")
	if !strings.Contains(out, "3 episodes (gui layout), left out: 1 env_error") {
		t.Errorf("output %q", out)
	}
	c.mustRun("dataset", "build", "--recordings", recDir, "--out", local, "--suite", "s", "--test-percent", "50")
	list := func(dir string) string {
		var names []string
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			rel, _ := filepath.Rel(dir, p)
			names = append(names, rel)
			return err
		})
		return strings.Join(names, " ")
	}
	if a, b := list(remote), list(local); a != b || !strings.Contains(a, "README.md") {
		t.Errorf("remote build %s, local build %s", a, b)
	}
	var man dataset.Manifest
	b, _ := os.ReadFile(filepath.Join(remote, "manifest.json"))
	if err := json.Unmarshal(b, &man); err != nil || man.Included != 3 {
		t.Errorf("manifest %s: %v", b, err)
	}

	m2w := filepath.Join(t.TempDir(), "m2w")
	c.mustRun("dataset", "build", "--layout", "mind2web", "--out", m2w, "--outcome", "success", "--since", "11h")
	for _, f := range []string{"t0/result.json", "t0/trajectory/0_screenshot.jpg", "t3/result.json"} {
		if _, err := os.Stat(filepath.Join(m2w, f)); err != nil {
			t.Error(err)
		}
	}
	if _, _, err := c.run("", "dataset", "build", "--out", m2w); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("build into a non-empty folder: %v", err)
	}
	if _, _, err := c.run("", "dataset", "build", "--out", t.TempDir(), "--task", "nope"); err == nil || !strings.Contains(err.Error(), "no recording matches") {
		t.Errorf("empty selection: %v", err)
	}
}
