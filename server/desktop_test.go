package server_test

import (
	"bytes"
	"image"
	_ "image/jpeg"
	_ "image/png"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/orchard/orchard/internal/testenv"
	"github.com/orchard/orchard/internal/testserver"
)

func requireXvfb(t *testing.T) {
	t.Helper()
	for _, name := range []string{"Xvfb", "xterm", "xdpyinfo"} {
		_, err := exec.LookPath(name)
		testenv.Require(t, "xvfb", err == nil, name+" not in PATH (apt-get install xvfb openbox xterm x11-utils)")
	}
}

// A desktop sandbox through the REST API: the X session starts with the
// sandbox, execs see its DISPLAY, actions in our own, Anthropic's and
// OpenAI's forms move the real pointer, and screenshots come back scaled
// with their frame and scale.
func TestDesktopSandbox(t *testing.T) {
	requireXvfb(t)
	srv := testserver.Start(t, testserver.Options{})
	r := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "block_network": true, "kind": "desktop",
		"desktop": map[string]any{"width": 800, "height": 600, "apps": []string{"xterm"}}})
	want(t, r, 200)
	id := r.body["sandbox_id"].(string)
	if w := call(t, srv, "GET", "/sandboxes/"+id+"/wait?timeout=60", nil); w.body["status"] != "ready" {
		t.Fatalf("desktop sandbox: %s", w.raw)
	}
	j := execWait(t, srv, id, map[string]any{"command": "xdpyinfo | grep dimensions"})
	if !strings.Contains(j.Stdout, "800x600 pixels") {
		t.Fatalf("exec does not see the desktop: %+v", j)
	}

	cursor := func(body map[string]any) (float64, float64) {
		t.Helper()
		a := call(t, srv, "POST", "/sandboxes/"+id+"/desktop/actions", body)
		want(t, a, 200)
		if a.body["ok"] != true {
			t.Fatalf("actions: %s", a.raw)
		}
		res := a.body["results"].([]any)
		c := res[len(res)-1].(map[string]any)["cursor"].(map[string]any)
		return c["x"].(float64), c["y"].(float64)
	}
	cases := []struct {
		name string
		body map[string]any
		x, y float64
	}{
		{"ours", map[string]any{"actions": []map[string]any{{"type": "mouse_move", "x": 100, "y": 120}, {"type": "cursor_position"}}}, 100, 120},
		{"anthropic", map[string]any{"actions": []map[string]any{{"action": "mouse_move", "coordinate": []int{300, 200}}, {"action": "cursor_position"}}}, 300, 200},
		{"openai", map[string]any{"actions": []map[string]any{{"type": "move", "x": 50, "y": 60}, {"type": "cursor_position"}}}, 50, 60},
	}
	for _, c := range cases {
		if x, y := cursor(c.body); x != c.x || y != c.y {
			t.Errorf("%s: cursor at %v,%v, want %v,%v", c.name, x, y, c.x, c.y)
		}
	}

	// A screenshot scaled to 400 wide: its frame's scale is 0.5, and a
	// click at (100, 100) in its pixels lands at (200, 200) on the screen.
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/"+id+"/desktop/screenshot?format=png&width=400", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	png, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "image/png" || res.Header.Get("X-Orchard-Scale") != "0.5" {
		t.Fatalf("screenshot: %d %v", res.StatusCode, res.Header)
	}
	img, _, err := image.Decode(bytes.NewReader(png))
	if err != nil || img.Bounds().Dx() != 400 || img.Bounds().Dy() != 300 {
		t.Fatalf("screenshot image: %v %v", err, img)
	}
	if x, y := cursor(map[string]any{"actions": []map[string]any{{"type": "mouse_move", "x": 100, "y": 100}, {"type": "cursor_position"}}}); x != 100 || y != 100 {
		t.Errorf("cursor in the scaled frame's pixels: %v,%v, want 100,100", x, y)
	}
	// A full-size screenshot makes screen pixels the frame's: the pointer
	// is at (200, 200) there.
	if x, y := cursor(map[string]any{"actions": []map[string]any{{"type": "screenshot"}, {"type": "cursor_position"}}}); x != 200 || y != 200 {
		t.Errorf("cursor on the screen: %v,%v, want 200,200", x, y)
	}

	// Bad input is a classified 4xx; browser paths refuse a desktop sandbox.
	if a := call(t, srv, "POST", "/sandboxes/"+id+"/desktop/actions", map[string]any{"actions": []map[string]any{{"type": "teleport"}}}); a.status != 400 || !strings.Contains(string(a.raw), "action.invalid") {
		t.Errorf("bad action: %d %s", a.status, a.raw)
	}
	if a := call(t, srv, "GET", "/sandboxes/"+id+"/browser/tabs", nil); a.status != 400 {
		t.Errorf("browser path on a desktop: %d %s", a.status, a.raw)
	}
	if a := call(t, srv, "POST", "/sandboxes", map[string]any{"image": "host", "desktop": map[string]any{"width": 10}}); a.status != 422 {
		t.Errorf("desktop settings on a shell: %d %s", a.status, a.raw)
	}
}
