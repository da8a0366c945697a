package api_test

import (
	"encoding/json"
	"testing"

	"github.com/orchard/orchard/api"
)

// A step's observation reads back as the kind its daemon wrote, and writes
// the same JSON again.
func TestStepObservationRoundTrip(t *testing.T) {
	cases := []struct {
		name, in string
		desktop  bool
		shell    bool
	}{
		{"browser", `{"frame":3,"scale":0.5,"url":"http://x.test/","title":"X","tabs":[{"index":0,"url":"http://x.test/","title":"X","active":true}],` +
			`"viewport":{"width":800,"height":600,"scroll_x":0,"scroll_y":12.5,"page_width":800,"page_height":1200},` +
			`"screenshot":{"format":"jpeg","data":"AQI=","width":400,"height":300},"elements":[{"id":1,"role":"link","name":"a","bbox":[1,2,3,4]}],` +
			`"downloads":[],"timing":{"total_ms":1.5,"page_ms":1,"screenshot_ms":0.5}}`, false, false},
		{"browser without screenshot", `{"frame":1,"scale":1,"url":"","title":"","tabs":null,"viewport":{"width":0,"height":0,"scroll_x":0,"scroll_y":0,"page_width":0,"page_height":0},"downloads":null,"timing":{"total_ms":0,"page_ms":0,"screenshot_ms":0}}`, false, false},
		{"desktop", `{"screenshot":{"frame":7,"scale":0.5,"width":640,"height":400,"screen_width":1280,"screen_height":800,"format":"png","data":"AQI="},"cursor":{"x":10,"y":20.5}}`, true, false},
		{"desktop without screenshot", `{"cursor":{"x":0,"y":0}}`, true, false},
		{"shell", `{"stdout":"ok\n","stderr":"","exit_code":1,"duration_ms":12.5,"stdout_truncated":true,"stderr_truncated":false}`, false, true},
		{"none", `null`, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var o api.StepObservation
			if err := json.Unmarshal([]byte(tc.in), &o); err != nil {
				t.Fatal(err)
			}
			if (o.Desktop != nil) != tc.desktop || (o.Shell != nil) != tc.shell || (o.Browser != nil) != (!tc.desktop && !tc.shell && tc.in != "null") {
				t.Fatalf("read %s as %+v", tc.in, o)
			}
			out, err := json.Marshal(o)
			if err != nil || string(out) != tc.in {
				t.Fatalf("wrote %s, %v; want %s", out, err, tc.in)
			}
		})
	}
}

// A browser action's "path" is drag's points or upload_file's file.
func TestBrowserActionPath(t *testing.T) {
	for _, in := range []string{
		`{"type":"drag","path":[[1,2],[3.5,4]]}`,
		`{"type":"upload_file","selector":"#f","path":"/workspace/a.txt"}`,
		`{"type":"click","x":1,"y":2}`,
	} {
		var a api.BrowserAction
		if err := json.Unmarshal([]byte(in), &a); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		out, err := json.Marshal(a)
		if err != nil || string(out) != in {
			t.Errorf("%s: wrote %s, %v", in, out, err)
		}
	}
	var a api.BrowserAction
	if err := json.Unmarshal([]byte(`{"type":"drag","path":[[1,2,3]]}`), &a); err == nil {
		t.Error("a three-number point was read")
	}
}

// A frame maps its pixels to the screen's and back.
func TestFrameMapping(t *testing.T) {
	f := api.Frame{Scale: 0.5, Width: 640, Height: 400, ScreenWidth: 1280, ScreenHeight: 800}
	p := f.ToScreen(100, 150)
	if p.X != 200 || p.Y != 300 {
		t.Errorf("ToScreen(100, 150) = %v", p)
	}
	if x, y := f.FromScreen(p); x != 100 || y != 150 {
		t.Errorf("FromScreen(%v) = %v, %v", p, x, y)
	}
}
