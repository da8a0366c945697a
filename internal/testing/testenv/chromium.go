package testenv

import (
	"os"
	"testing"

	"github.com/orchard/orchard/internal/chromium"
)

// RequireChromium returns the path of the Chromium binary a headless
// browser session runs by default ($ORCHARD_CHROMIUM, else what
// chromium.Find picks: the headless shell when installed, else chromium),
// or skips (or fails, see Require) when there is none. The dependency's
// name is "chromium".
func RequireChromium(t testing.TB) string {
	t.Helper()
	p, ok := ChromiumPath()
	Require(t, "chromium", ok, "no chromium in PATH (apt-get install chromium chromium-headless-shell)")
	return p
}

// ChromiumPath finds Chromium as RequireChromium does, for a TestMain that
// has no testing.TB yet.
func ChromiumPath() (string, bool) {
	if p := os.Getenv("ORCHARD_CHROMIUM"); p != "" {
		return p, true
	}
	p, err := chromium.Find(chromium.Auto, true)
	return p, err == nil
}

// HeadedChromiumPath finds the whole browser, for tests that show it on an
// X display (the headless shell has no window).
func HeadedChromiumPath() (string, bool) {
	p, err := chromium.Find(chromium.Browser, false)
	return p, err == nil
}
