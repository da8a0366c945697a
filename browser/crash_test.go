package browser

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// crash makes the renderer of tb crash.
func crash(t testing.TB, tb *tab) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cdp.Call(ctx, tb.target, page.Crash, cdp.Empty{}) // never answers: the renderer is gone
}

// A second browser with the other options, killed at the end.
func TestOwnBrowserOptionsAndCrash(t *testing.T) {
	path := testenv.RequireChromium(t)
	becomeSubreaper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := Launch(ctx, Options{ExecPath: path, DownloadDir: t.TempDir(), AutoAcceptDialogs: true, FocusNewTabs: true,
		Viewport: Viewport{Width: 800, Height: 600}, Timezone: "Asia/Tokyo", Locale: "de-DE", UserAgent: "orchard-test/1",
		CallTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dataDir := s.dataDir

	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/dialogs.html"})
	mustDo(t, s, Action{Type: ActClick, Selector: "#confirm"})
	if !js[bool](t, s, "window.confirmed === true") {
		t.Error("confirm not auto-accepted")
	}
	if obs := observe(t, s, ObserveOptions{}); obs.Dialog != nil || obs.Screenshot.Width != 800 || obs.Screenshot.Height != 600 {
		t.Errorf("dialog %+v, screenshot %dx%d", obs.Dialog, obs.Screenshot.Width, obs.Screenshot.Height)
	}
	if got := js[string](t, s, "Intl.DateTimeFormat().resolvedOptions().timeZone + ' ' + navigator.language + ' ' + navigator.userAgent"); got != "Asia/Tokyo de-DE orchard-test/1" {
		t.Errorf("emulation: %q", got)
	}
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/popup.html"}, Action{Type: ActClick, Selector: "#blank"})
	tabs := waitTabs(t, s, 2, "/basic.html")
	if !tabs[1].Active {
		t.Errorf("FocusNewTabs: %+v", tabs)
	}
	if obs := observe(t, s, ObserveOptions{}); obs.Title != "Basic" || obs.Screenshot.Width != 800 {
		t.Errorf("focused popup: %q %d", obs.Title, obs.Screenshot.Width)
	}

	// Closing the first tab (the one the browser started with) leaves the
	// session working; closing the only tab leaves a blank one.
	mustDo(t, s, Action{Type: ActCloseTab, Index: iptr(0)})
	if tabs := s.Tabs(); len(tabs) != 1 || !tabs[0].Active || !strings.HasSuffix(tabs[0].URL, "/basic.html") {
		t.Fatalf("after closing tab 0: %+v", tabs)
	}
	mustDo(t, s, Action{Type: ActCloseTab})
	if tabs := s.Tabs(); len(tabs) != 1 || !tabs[0].Active || tabs[0].URL != "about:blank" {
		t.Fatalf("after closing the only tab: %+v", tabs)
	}

	// A renderer that never returns is a timeout, not a hang.
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/hang.html"})
	start := time.Now()
	if e := failCode(t, s, Action{Type: ActClick, Selector: "#spin"}); e.Code != faults.CodeBrowserTimeout || e.Source != faults.Browser || !e.Retryable {
		t.Errorf("click on a hung page: %+v", *e)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("hung click returned after %v", d)
	}

	// Kill the browser process: the next calls fail fast, classified.
	if err := syscall.Kill(s.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	res, err := s.Do(ctxT(t), []Action{{Type: ActClick, Selector: "#b1"}})
	if !faults.Is(err, faults.CodeBrowserCrashed) || len(res) != 1 || res[0].Error == nil || res[0].Error.Code != faults.CodeBrowserCrashed {
		t.Fatalf("after kill: %+v %v", res, err)
	}
	fe := faults.Of(err)
	if fe.Category != faults.Unavailable || fe.Source != faults.Browser || !fe.Retryable {
		t.Errorf("crash class %+v", fe.Info())
	}
	if _, err := s.Observe(ctxT(t), ObserveOptions{}); !faults.Is(err, faults.CodeBrowserCrashed) {
		t.Errorf("observe after kill: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("crash noticed after %v", d)
	}
	t.Logf("crash: %s (noticed in %v)", fe.Message, time.Since(start))
	start = time.Now()
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("close after crash took %v", d)
	}
	if left := s.processTree(); len(left) > 0 {
		t.Errorf("processes left: %v", left)
	}
	if z := zombieChildren(); len(z) > 0 {
		t.Errorf("zombie children left: %v", z)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("profile dir left: %v", err)
	}
	if err := s.Err(); !faults.Is(err, faults.CodeBrowserClosed) {
		t.Errorf("Err after close: %v", err)
	}
}
