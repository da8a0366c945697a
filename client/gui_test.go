package client_test

import (
	"bytes"
	"encoding/json"
	"image"
	_ "image/jpeg"
	_ "image/png"
	"net/url"
	"os/exec"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

const guiPage = `<!doctype html><title>Shop</title><body style="margin:0">
<button id="go" style="position:absolute;left:40px;top:40px;width:120px;height:40px" onclick="document.title='clicked'">Go</button>`

// guiSandbox creates a sandbox of kind with settings and waits for it.
func guiSandbox(t *testing.T, srv *testserver.Server, c *client.Client, kind, settings string) string {
	t.Helper()
	ctx := testContext(t)
	req := api.CreateSandboxRequest{Image: "host", Kind: kind}
	switch kind {
	case api.KindBrowser:
		req.Browser = new(api.BrowserOptions)
		if err := json.Unmarshal([]byte(settings), req.Browser); err != nil {
			t.Fatal(err)
		}
	case api.KindDesktop:
		req.Desktop = new(api.DesktopOptions)
		if err := json.Unmarshal([]byte(settings), req.Desktop); err != nil {
			t.Fatal(err)
		}
	}
	created, err := c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if sb, err := c.WaitSandbox(ctx, created.SandboxID, time.Minute); err != nil || sb.Status != api.StatusReady {
		t.Fatalf("wait %s sandbox: %+v %v", kind, sb, err)
	}
	return created.SandboxID
}

func decodeImage(t *testing.T, img client.Image) image.Config {
	t.Helper()
	cfg, _, err := image.DecodeConfig(bytes.NewReader(img.Data))
	if err != nil {
		t.Fatalf("%s image: %v", img.ContentType, err)
	}
	return cfg
}

// Browser and desktop sandboxes through the Go client: actions, a
// set-of-marks click on the frame it came from, screenshots with their
// frame and scale, the desktop pointer, and a classified error.
func TestBrowserAndDesktop(t *testing.T) {
	testenv.RequireChromium(t)
	srv := testserver.Start(t, testserver.Options{})
	c := client.New(srv.URL, srv.APIKey)
	ctx := testContext(t)

	id := guiSandbox(t, srv, c, api.KindBrowser, `{"viewport":{"width":800,"height":600}}`)
	if _, err := c.Upload(ctx, id, "/workspace/page.html", []byte(guiPage)); err != nil {
		t.Fatal(err)
	}
	res, err := c.BrowserActions(ctx, id, api.BrowserActionsRequest{
		Actions: []api.BrowserAction{{Type: "navigate", URL: "file:///workspace/page.html"}},
		Observe: &api.Observe{Screenshot: "none", SOM: true}})
	if err != nil || !res.OK || res.Observation == nil || len(res.Observation.Elements) != 1 {
		t.Fatalf("navigate: %v %+v", err, res)
	}
	obs := res.Observation
	res, err = c.BrowserActions(ctx, id, api.BrowserActionsRequest{Frame: &obs.Frame, Strict: true,
		Actions: []api.BrowserAction{{Type: "click", Element: &obs.Elements[0].ID}},
		Observe: &api.Observe{Screenshot: "none"}})
	if err != nil || !res.OK || res.Observation.Title != "clicked" {
		t.Fatalf("set-of-marks click: %v %+v", err, res)
	}
	o, err := c.BrowserObservation(ctx, id, url.Values{"screenshot": {"none"}, "text": {"true"}})
	if err != nil || o.Text == "" || o.Title != "clicked" {
		t.Fatalf("observation: %v %+v", err, o)
	}
	shot, err := c.BrowserScreenshot(ctx, id, url.Values{"format": {"png"}, "scale": {"0.5"}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg := decodeImage(t, shot); cfg.Width != 400 || cfg.Height != 300 || shot.Scale != 0.5 || shot.Frame <= obs.Frame || shot.ContentType != "image/png" {
		t.Errorf("screenshot at scale 0.5: %dx%d, %+v", cfg.Width, cfg.Height, client.Image{ContentType: shot.ContentType, Frame: shot.Frame, Scale: shot.Scale})
	}
	_, err = c.BrowserActions(ctx, "nosuchsandbox", api.BrowserActionsRequest{Action: &api.BrowserAction{Type: "reload"}})
	if f := faults.Of(err); f == nil || f.Code != faults.CodeSandboxNotFound {
		t.Errorf("actions on no sandbox: %v", err)
	}

	if _, err := exec.LookPath("Xvfb"); err != nil {
		testenv.Require(t, "xvfb", false, "Xvfb not in PATH (apt-get install xvfb openbox xterm x11-utils)")
	}
	desk := guiSandbox(t, srv, c, api.KindDesktop, `{"width":800,"height":600}`)
	if _, err := c.DesktopActions(ctx, desk, map[string]any{"actions": []map[string]any{{"action": "mouse_move", "coordinate": []int{120, 90}}}}); err != nil {
		t.Fatal(err)
	}
	cur, err := c.DesktopCursor(ctx, desk)
	if err != nil || cur.ScreenX != 120 || cur.ScreenY != 90 {
		t.Errorf("cursor: %+v %v", cur, err)
	}
	screen, err := c.DesktopScreenshot(ctx, desk, url.Values{"format": {"jpeg"}, "width": {"400"}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg := decodeImage(t, screen); cfg.Width != 400 || screen.Scale != 0.5 || screen.Frame < 1 {
		t.Errorf("desktop screenshot: %dx%d scale %v frame %d", cfg.Width, cfg.Height, screen.Scale, screen.Frame)
	}
	if cur, err := c.DesktopCursor(ctx, desk); err != nil || cur.X != 60 || cur.Y != 45 || cur.Frame != screen.Frame {
		t.Errorf("cursor in the half-size frame: %+v %v", cur, err)
	}
}
