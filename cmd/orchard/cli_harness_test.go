package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
)

// ORCHARD_HARNESSES and DEFAULT_HARNESSES are comma-separated lists; the
// flags win over them.
func TestHarnessEnv(t *testing.T) {
	env := map[string]string{"ORCHARD_HARNESSES": "codex,claude", "DEFAULT_HARNESSES": "all"}
	getenv := func(k string) string { return env[k] }
	cfg := defaultConfig(getenv)
	if err := loadEnv(&cfg, getenv, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Harnesses, []string{"codex", "claude"}) || !slices.Equal(cfg.Manager.DefaultHarnesses, []string{"all"}) {
		t.Errorf("harnesses %q, default %q", cfg.Harnesses, cfg.Manager.DefaultHarnesses)
	}
	cfg = defaultConfig(getenv)
	if err := loadEnv(&cfg, getenv, func(f string) bool { return f == "default-harnesses" }); err != nil {
		t.Fatal(err)
	}
	if cfg.Manager.DefaultHarnesses != nil {
		t.Errorf("--default-harnesses given, DEFAULT_HARNESSES still read: %q", cfg.Manager.DefaultHarnesses)
	}
}

// `orchard harness` lists an empty store, refuses unknown names (no path
// is built from them) and removing what is not installed.
func TestHarnessCLI(t *testing.T) {
	dir := t.TempDir()
	getenv := func(string) string { return "" }
	runCLI := func(args ...string) (string, error) {
		var out bytes.Buffer
		root := harnessCmd(getenv)
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(args, "--state-dir", dir))
		err := root.ExecuteContext(context.Background())
		return out.String(), err
	}
	if out, err := runCLI("list"); err != nil || !strings.HasPrefix(out, "NAME") || strings.Count(out, "\n") != 1 {
		t.Errorf("list of an empty store: %q, %v", out, err)
	}
	if _, err := runCLI("install", "../../etc"); err == nil || !strings.Contains(err.Error(), `"../../etc"`) {
		t.Errorf("install ../../etc: %v, want an unknown harness", err)
	}
	if _, err := runCLI("rm", "codex"); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Errorf("rm codex from an empty store: %v", err)
	}
}
