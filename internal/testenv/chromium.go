package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// RequireChromium returns the path of a Chromium binary ($ORCHARD_CHROMIUM,
// else chromium or chromium-browser in PATH), or skips (or fails, see
// Require) when there is none. The dependency's name is "chromium".
func RequireChromium(t testing.TB) string {
	t.Helper()
	p, ok := ChromiumPath()
	Require(t, "chromium", ok, "no chromium or chromium-browser in PATH (apt-get install chromium)")
	return p
}

// ChromiumPath finds Chromium as RequireChromium does, for a TestMain that
// has no testing.TB yet.
func ChromiumPath() (string, bool) {
	if p := os.Getenv("ORCHARD_CHROMIUM"); p != "" {
		return p, true
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, true
		}
	}
	return "", false
}
