package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// A server stopped and its state directory removed leaves a sandbox that
// no server can reach. `orchard cleanup` lists it with its age and origin,
// removes nothing without --yes, and with --yes removes it and only it: a
// live server's sandbox runs on.
func TestCleanupRemovesOrphansOfAWipedStateDirectory(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	create := func(url, key string) string {
		t.Helper()
		c := client.New(url, key)
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host", BlockNetwork: client.Ptr(true), Memory: client.Ptr("128Mi")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitSandbox(ctx, sb.SandboxID, time.Minute); err != nil {
			t.Fatal(err)
		}
		return sb.SandboxID
	}
	keyOf := func(out string) string {
		_, rest, _ := strings.Cut(out, "shown once):\n  ")
		return strings.Fields(rest + " ")[0]
	}

	wipedDir, liveDir := testserver.StateDir(t), testserver.StateDir(t)
	url, out, stop := startServe(t, wipedDir)
	orphan := create(url, keyOf(out.String()))
	stop()
	// The directory goes as `rm -rf` of a temporary folder would take it,
	// the mounts in it first.
	for _, line := range strings.Split(strings.TrimSpace(mountsBelow(wipedDir)), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			_ = unix.Unmount(f[4], unix.MNT_DETACH)
		}
	}
	if err := os.RemoveAll(wipedDir); err != nil {
		t.Fatal(err)
	}
	liveURL, liveOut, _ := startServe(t, liveDir)
	liveKey := keyOf(liveOut.String())
	live := create(liveURL, liveKey)
	time.Sleep(time.Second)

	c := &cli{t: t}
	listed := c.mustRun("cleanup", "--min-age", "1s")
	var orphanLine string
	for _, line := range strings.Split(listed, "\n") {
		if strings.HasPrefix(line, orphan+" ") {
			orphanLine = line
		}
	}
	if !strings.Contains(orphanLine, wipedDir) || !strings.Contains(orphanLine, "orphan: its state directory is gone") ||
		!strings.Contains(listed, "run with --yes") {
		t.Fatalf("dry run did not list %s as an orphan of %s:\n%s", orphan, wipedDir, listed)
	}
	if !hasSandboxCgroup(orphan) {
		t.Fatal("the dry run removed the orphan")
	}

	var rows []struct {
		ID       string  `json:"id"`
		StateDir string  `json:"state_dir"`
		Owner    string  `json:"owner"`
		Orphan   string  `json:"orphan"`
		Age      float64 `json:"age_seconds"`
		Removed  bool    `json:"removed"`
	}
	if err := json.Unmarshal([]byte(c.mustRun("cleanup", "--yes", "--json", "--min-age", "1s")), &rows); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.ID] = true
		switch r.ID {
		case orphan:
			if !r.Removed || r.Age < 1 {
				t.Errorf("orphan row: %+v", r)
			}
		case live:
			if r.Removed || r.Orphan != "" || !strings.Contains(r.Owner, "live server") || !strings.HasPrefix(r.StateDir, liveDir+"/") {
				t.Errorf("live server's sandbox row: %+v", r)
			}
		}
	}
	if !seen[orphan] || !seen[live] {
		t.Errorf("rows %+v miss %s or %s", rows, orphan, live)
	}
	if hasSandboxCgroup(orphan) {
		t.Error("the orphan's cgroup is left")
	}
	j, err := client.New(liveURL, liveKey).Exec(ctx, live, api.ExecRequest{Command: client.Command("echo alive"), Wait: true})
	if err != nil || j.Stdout != "alive\n" {
		t.Errorf("the live server's sandbox: %+v, %v", j, err)
	}
	if _, _, err := c.run("", "cleanup", "--yes", "--dry-run"); err == nil {
		t.Error("--yes with --dry-run accepted")
	}
}

func hasSandboxCgroup(id string) bool {
	_, err := os.Stat("/sys/fs/cgroup/pids/orchard/" + id)
	if err != nil {
		_, err = os.Stat("/sys/fs/cgroup/orchard/" + id)
	}
	return err == nil
}

// mountsBelow lists the mounts below dir, as /proc/self/mountinfo lines.
func mountsBelow(dir string) string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
