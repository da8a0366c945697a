package browser

import (
	"bytes"
	"context"
	"image/jpeg"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/internal/testing/testenv"
)

func TestDevToolsEndpointAndLiveView(t *testing.T) {
	path := testenv.RequireChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := Launch(ctx, Options{ExecPath: path, DownloadDir: t.TempDir(), DevTools: true, Viewport: Viewport{Width: 640, Height: 480}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	u := s.DevToolsURL()
	if !strings.HasPrefix(u, "ws://127.0.0.1:") || !strings.Contains(u, "/devtools/browser/") {
		t.Fatalf("DevToolsURL %q", u)
	}
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/basic.html"})

	// A second client on the endpoint sees the session's tab.
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.WriteJSON(map[string]any{"id": 1, "method": "Target.getTargets"}); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var res struct {
		ID     int `json:"id"`
		Result struct {
			TargetInfos []struct {
				Type string `json:"type"`
				URL  string `json:"url"`
			} `json:"targetInfos"`
		} `json:"result"`
	}
	for res.ID != 1 {
		if err := conn.ReadJSON(&res); err != nil {
			t.Fatal(err)
		}
	}
	found := false
	for _, ti := range res.Result.TargetInfos {
		found = found || ti.Type == "page" && strings.HasSuffix(ti.URL, "/basic.html")
	}
	if !found {
		t.Fatalf("targets %+v lack the session's page", res.Result.TargetInfos)
	}

	// The live view, scaled down in the browser to a width with the aspect
	// kept; a width at or past the viewport's keeps the size.
	before := s.frameSeq.Load()
	for width, want := range map[int][2]int{0: {640, 480}, 320: {320, 240}, 640: {640, 480}, 2000: {640, 480}} {
		lv, err := s.Watch(50, width)
		if err != nil {
			t.Fatal(err)
		}
		img, _, err := lv.Next(ctx, 0, 10*time.Second)
		lv.Close()
		if err != nil {
			t.Fatal(err)
		}
		if cfg, err := jpeg.DecodeConfig(bytes.NewReader(img)); err != nil || cfg.Width != want[0] || cfg.Height != want[1] {
			t.Fatalf("live frame at width %d: %v %dx%d, want %dx%d", width, err, cfg.Width, cfg.Height, want[0], want[1])
		}
	}
	// Live frames leave the observation frames alone.
	if n := s.frameSeq.Load(); n != before {
		t.Fatalf("a live frame recorded observation frame %d", n)
	}
}

func TestNoDevToolsByDefault(t *testing.T) {
	if u := browserSession(t).DevToolsURL(); u != "" {
		t.Fatalf("DevToolsURL %q without Options.DevTools", u)
	}
}
