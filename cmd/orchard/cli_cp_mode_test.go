package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cp keeps the permission bits of an uploaded file, as cp, docker cp and
// kubectl cp do: a script copied in runs.
func TestCLICopyKeepsMode(t *testing.T) {
	c := newCLI(t)
	id := strings.TrimSpace(c.mustRun("sandbox", "create", "--wait"))
	t.Cleanup(func() { c.run("", "sandbox", "rm", id) })
	src := filepath.Join(t.TempDir(), "run me.sh")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c.mustRun("cp", src, id+":/workspace/")
	out, errOut, err := c.run("", "exec", id, "--", `"/workspace/run me.sh"`)
	if code := exitCodeOf(err); code != 0 || out != "ran\n" {
		t.Fatalf("uploaded script: exit %d, stdout %q, stderr %q; want it to run", code, out, errOut)
	}
}
