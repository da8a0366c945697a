package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// act and screenshot against a browser sandbox; both refuse a shell
// sandbox with a clear message.
func TestCLIActAndScreenshot(t *testing.T) {
	testenv.RequireChromium(t)
	c := newCLI(t)
	web := strings.TrimSpace(c.mustRun("sandbox", "create", "--kind", "browser", "--wait"))
	shell := strings.TrimSpace(c.mustRun("sandbox", "create", "--wait"))

	out := c.mustRun("act", web, `{"type":"navigate","url":"about:blank#cli"}`, "--observe", `{"screenshot":"none"}`)
	var res struct {
		OK          bool `json:"ok"`
		Observation struct {
			URL string `json:"url"`
		} `json:"observation"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || !res.OK || res.Observation.URL != "about:blank#cli" {
		t.Fatalf("act: %v %s", err, out)
	}
	// A failed action prints its result and exits 1.
	out, _, err := c.run("", "act", web, `[{"type":"click","selector":"#nope"}]`)
	if exitCodeOf(err) != 1 || !strings.Contains(out, "action.no_such_element") {
		t.Fatalf("failed action: exit %d (%v), %s", exitCodeOf(err), err, out)
	}

	file := filepath.Join(t.TempDir(), "shot.png")
	_, errOut, err := c.run("", "screenshot", web, "-o", file, "--scale", "0.5")
	if err != nil {
		t.Fatalf("screenshot: %v %s", err, errOut)
	}
	data, _ := os.ReadFile(file)
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil || cfg.Width != 640 || !strings.Contains(errOut, "scale 0.5") || !strings.Contains(errOut, "frame ") {
		t.Fatalf("screenshot at 0.5: %v %dx%d, stderr %q", err, cfg.Width, cfg.Height, errOut)
	}

	for _, args := range [][]string{{"act", shell, `{"type":"reload"}`}, {"screenshot", shell}} {
		_, errOut, err := c.run("", args...)
		if err == nil || !strings.Contains(err.Error()+errOut, "shell sandbox") {
			t.Errorf("orchard %s on a shell sandbox: %v %q", args[0], err, errOut)
		}
	}
	if _, _, err := c.run("", "act", web, "not json"); err == nil {
		t.Error("act with ACTIONS that are not JSON succeeded")
	}
}
