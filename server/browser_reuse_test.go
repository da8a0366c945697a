package server_test

import (
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/internal/testing/pixels"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// getShot GETs a JPEG screenshot; it returns its bytes and where its frame
// came from (X-Orchard-Capture).
func getShot(t *testing.T, srv *testserver.Server, id string) ([]byte, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/"+id+"/browser/screenshot?format=jpeg", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	img, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("screenshot: %d %v %.200s", res.StatusCode, err, img)
	}
	return img, res.Header.Get("X-Orchard-Capture")
}

// Through the REST API with the default settings: a screenshot of a page
// that drew nothing since the last is that capture again, a step whose
// click changed the page captures while its settle wait runs, the
// screenshot after it shows what the step saw, and while a DevTools client
// is attached through /browser/cdp every screenshot is a new capture.
func TestBrowserFramesThroughREST(t *testing.T) {
	srv, id := browserWithPage(t)
	first, frame := getShot(t, srv, id)
	if frame != "captured" {
		t.Errorf("first screenshot: %q", frame)
	}
	time.Sleep(300 * time.Millisecond)
	second, frame := getShot(t, srv, id)
	if frame != "reused" || !bytes.Equal(first, second) {
		t.Errorf("second screenshot of a still page: %q, same bytes %v", frame, bytes.Equal(first, second))
	}

	a := call(t, srv, "POST", "/sandboxes/"+id+"/browser/actions", map[string]any{
		"action":  map[string]any{"type": "click", "x": 200, "y": 140},
		"observe": map[string]any{"screenshot": "jpeg"},
	})
	if a.status != 200 || a.body["ok"] != true {
		t.Fatalf("step: %d %s", a.status, a.raw)
	}
	obs := a.body["observation"].(map[string]any)
	if f := obs["timing"].(map[string]any)["frame"]; f != "early" {
		t.Errorf("a step whose click changed the page: frame %v", f)
	}
	stepShot, err := base64.StdEncoding.DecodeString(obs["screenshot"].(map[string]any)["data"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if n := pixels.Differing(pixels.Decode(t, first), pixels.Decode(t, stepShot)); n == 0 {
		t.Error("the step's frame shows no change")
	}
	// The click's own frame may be drawn while the step's capture ran: the
	// screenshot after may be a new capture (the compositor drew two
	// frames), then the one after that is reused.
	time.Sleep(300 * time.Millisecond)
	after, _ := getShot(t, srv, id)
	if n := pixels.Differing(pixels.Decode(t, stepShot), pixels.Decode(t, after)); n != 0 {
		t.Errorf("the screenshot after the step differs from its frame in %d pixels", n)
	}
	time.Sleep(300 * time.Millisecond)
	if again, frame := getShot(t, srv, id); frame != "reused" || !bytes.Equal(after, again) {
		t.Errorf("the screenshot after that: %q, same bytes %v", frame, bytes.Equal(after, again))
	}

	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/browser/cdp"
	conn, _, err := websocket.DefaultDialer.Dial(wsURL, http.Header{"X-API-Key": {srv.APIKey}})
	if err != nil {
		t.Fatal(err)
	}
	cdpCall(t, conn, 1, "Browser.getVersion", nil) // the proxy is up
	if _, frame := getShot(t, srv, id); frame != "captured" {
		t.Errorf("with a DevTools client attached: %q", frame)
	}
	conn.Close()
}
