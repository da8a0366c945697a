package browser

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"

	"github.com/orchard/orchard/faults"
)

// devToolsPortFile is where Chromium writes the port and browser path of
// its DevTools endpoint, in the profile directory.
const devToolsPortFile = "DevToolsActivePort"

// devToolsWait bounds the wait for DevToolsActivePort after the browser
// answered on its pipe; the endpoint opens during startup, so this is
// normally immediate.
const devToolsWait = 5 * time.Second

// devToolsCmd adds the debugging port to the browser's command line while
// the session itself stays on the pipe: chromedp would switch to a
// WebSocket connection if the port were one of its flags.
func devToolsCmd(cmd *exec.Cmd) {
	extra := []string{"--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1"}
	// The last argument is the start URL; switches go before it.
	if n := len(cmd.Args); n > 1 {
		args := append([]string{}, cmd.Args[:n-1]...)
		args = append(args, extra...)
		cmd.Args = append(args, cmd.Args[n-1])
	} else {
		cmd.Args = append(cmd.Args, extra...)
	}
	keepWithParent(cmd)
}

// readDevToolsURL waits for the profile's DevToolsActivePort and returns
// the browser-level WebSocket URL it names.
func readDevToolsURL(ctx context.Context, dir string) (string, error) {
	deadline := time.Now().Add(devToolsWait)
	for {
		b, err := os.ReadFile(filepath.Join(dir, devToolsPortFile))
		if err == nil {
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) == 2 {
				port, perr := strconv.Atoi(strings.TrimSpace(lines[0]))
				path := strings.TrimSpace(lines[1])
				if perr == nil && port > 0 && strings.HasPrefix(path, "/devtools/browser/") {
					return fmt.Sprintf("ws://127.0.0.1:%d%s", port, path), nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no DevTools endpoint: %s not written", devToolsPortFile)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// DevToolsURL is the browser-level DevTools WebSocket URL
// (ws://127.0.0.1:PORT/devtools/browser/ID) that other clients attach to,
// or "" when Options.DevTools is off.
func (s *Session) DevToolsURL() string { return s.devToolsURL }

// LiveFrame is a JPEG of the active tab's viewport for a live view. It
// records no observation frame, so viewers never age out the frames an
// agent's actions refer to; quality is 1–100 (0 means 60). A width below
// the viewport's scales the frame down to it in the browser, so a viewer on
// a slow link gets fewer bytes, not a resampled copy; 0 keeps the size.
func (s *Session) LiveFrame(ctx context.Context, quality, width int) ([]byte, error) {
	if quality <= 0 || quality > 100 {
		quality = 60
	}
	t, err := s.activeTab(ctx)
	if err != nil {
		return nil, err
	}
	if t.isCrashed() {
		return nil, faults.New(faults.CodeBrowserTabCrashed, faults.Unavailable, faults.Browser,
			"live view: the tab's renderer crashed")
	}
	if d := t.openDialog(); d != nil {
		return nil, faults.New(faults.CodeActionDialogOpen, faults.Conflict, faults.Policy,
			fmt.Sprintf("live view: a %s dialog blocks the page", d.Type))
	}
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	defer cancel()
	p := page.CaptureScreenshotParams{Format: page.CaptureScreenshotFormatJpeg, Quality: new(int64(quality)), OptimizeForSpeed: new(true)}
	if width > 0 {
		m, err := cdp.Call(cctx, t.target, page.GetLayoutMetrics, cdp.Empty{})
		if err != nil {
			return nil, s.classify(cctx, t, "live view", err)
		}
		// The clip is in document coordinates: the viewport as scrolled.
		if v := m.CSSVisualViewport; v != nil && float64(width) < v.ClientWidth {
			p.Clip = &page.Viewport{X: v.PageX, Y: v.PageY, Width: v.ClientWidth, Height: v.ClientHeight, Scale: float64(width) / v.ClientWidth}
		}
	}
	res, err := cdp.Call(cctx, t.target, page.CaptureScreenshot, p)
	if err != nil {
		return nil, s.classify(cctx, t, "live view", err)
	}
	return res.Data, nil
}
