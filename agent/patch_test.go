package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orchard/orchard/api"
)

const helloPatch = `diff --git a/hello.txt b/hello.txt
--- a/hello.txt
+++ b/hello.txt
@@ -1 +1 @@
-hello
+goodbye
`

func TestPatch(t *testing.T) {
	t.Parallel()
	if _, err := lookPath("git", os.Environ(), "/"); err != nil {
		t.Skip("git is not installed")
	}
	dir := t.TempDir()
	a := startAgent(t, func(c *Config) { c.Cwd = dir })
	ctx := context.Background()
	file := filepath.Join(dir, "hello.txt")
	if err := os.WriteFile(file, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("applies", func(t *testing.T) {
		res, err := a.Patch(ctx, api.AgentPatchRequest{Patch: helloPatch})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("patch = %+v", res)
		}
		if b, _ := os.ReadFile(file); string(b) != "goodbye\n" {
			t.Fatalf("file = %q", b)
		}
	})
	t.Run("fails without change", func(t *testing.T) {
		// The same patch again no longer matches.
		res, err := a.Patch(ctx, api.AgentPatchRequest{Patch: helloPatch})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "hello.txt") {
			t.Fatalf("patch = %+v", res)
		}
		if b, _ := os.ReadFile(file); string(b) != "goodbye\n" {
			t.Fatalf("file = %q", b)
		}
	})
	t.Run("explicit dir", func(t *testing.T) {
		other := t.TempDir()
		if err := os.WriteFile(filepath.Join(other, "hello.txt"), []byte("hello\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res, err := a.Patch(ctx, api.AgentPatchRequest{Patch: helloPatch, Dir: other})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("patch = %+v, %v", res, err)
		}
	})
	t.Run("missing dir", func(t *testing.T) {
		res, err := a.Patch(ctx, api.AgentPatchRequest{Patch: helloPatch, Dir: "/no/such/dir"})
		if err != nil || res.ExitCode != 1 {
			t.Fatalf("patch = %+v, %v", res, err)
		}
	})
}

func TestPatchWithoutGit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := startAgent(t, func(c *Config) {
		c.Cwd = dir
		c.Env = []string{"PATH=" + t.TempDir()}
	})
	res, err := a.Patch(context.Background(), api.AgentPatchRequest{Patch: helloPatch})
	if err != nil {
		t.Fatal(err)
	}
	want := api.AgentPatchResult{ExitCode: 127, Stderr: "git: command not found (apply_patch needs git in the sandbox image)"}
	if res != want {
		t.Fatalf("patch = %+v, want %+v", res, want)
	}
}
