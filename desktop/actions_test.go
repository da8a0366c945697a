package desktop

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/orchard/orchard/faults"
)

func i64(v int64) *int64 { return &v }

// Each dialect's JSON decodes to the normalised action it means.
func TestParseActionDialects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      string
		want    Action
		dialect string
	}{
		// Orchard's own set.
		{"click", `{"type":"click","x":10,"y":20,"button":"right","clicks":2}`,
			Action{Type: ActClick, X: fp(10), Y: fp(20), Button: "right", Clicks: 2}, DialectOrchard},
		{"click default", `{"type":"click","x":1.5,"y":2}`,
			Action{Type: ActClick, X: fp(1.5), Y: fp(2), Clicks: 1}, DialectOrchard},
		{"double_click", `{"type":"double_click","x":1,"y":2}`,
			Action{Type: ActDoubleClick, X: fp(1), Y: fp(2), Clicks: 2}, DialectOrchard},
		{"triple_click", `{"type":"triple_click","x":1,"y":2,"modifiers":"shift"}`,
			Action{Type: ActTripleClick, X: fp(1), Y: fp(2), Clicks: 3, Modifiers: "shift"}, DialectOrchard},
		{"mouse_move", `{"type":"mouse_move","x":3,"y":4}`,
			Action{Type: ActMouseMove, X: fp(3), Y: fp(4)}, DialectOrchard},
		{"mouse_down", `{"type":"mouse_down"}`, Action{Type: ActMouseDown}, DialectOrchard},
		{"mouse_up at", `{"type":"mouse_up","x":5,"y":6,"button":"middle"}`,
			Action{Type: ActMouseUp, X: fp(5), Y: fp(6), Button: "middle"}, DialectOrchard},
		{"drag pairs", `{"type":"drag","path":[[1,2],[3,4]]}`,
			Action{Type: ActDrag, Path: []Point{{X: 1, Y: 2}, {X: 3, Y: 4}}}, DialectOrchard},
		{"scroll", `{"type":"scroll","x":5,"y":6,"dx":-1,"dy":3}`,
			Action{Type: ActScroll, X: fp(5), Y: fp(6), DX: -1, DY: 3}, DialectOrchard},
		{"type", `{"type":"type","text":"héllo"}`, Action{Type: ActType, Text: "héllo"}, DialectOrchard},
		{"key", `{"type":"key","keys":"ctrl+s"}`, Action{Type: ActKey, Keys: "ctrl+s"}, DialectOrchard},
		{"key hold", `{"type":"key","keys":"shift","hold_ms":500}`, Action{Type: ActKey, Keys: "shift", HoldMS: 500}, DialectOrchard},
		{"wait", `{"type":"wait","ms":250}`, Action{Type: ActWait, MS: ip(250)}, DialectOrchard},
		{"wait default", `{"type":"wait"}`, Action{Type: ActWait, MS: ip(1000)}, DialectOrchard},
		{"screenshot", `{"type":"screenshot","format":"jpeg","quality":70,"width":640}`,
			Action{Type: ActScreenshot, Format: "jpeg", Quality: 70, Width: 640}, DialectOrchard},
		{"cursor_position", `{"type":"cursor_position"}`, Action{Type: ActCursorPosition}, DialectOrchard},
		{"strict frame", `{"type":"click","x":1,"y":2,"frame":7,"strict":true}`,
			Action{Type: ActClick, X: fp(1), Y: fp(2), Clicks: 1, Frame: i64(7), Strict: true}, DialectOrchard},

		// Anthropic computer_20241022.
		{"a key", `{"action":"key","text":"ctrl+shift+t"}`, Action{Type: ActKey, Keys: "ctrl+shift+t"}, DialectAnthropic},
		{"a type", `{"action":"type","text":"Hello, world"}`, Action{Type: ActType, Text: "Hello, world"}, DialectAnthropic},
		{"a mouse_move", `{"action":"mouse_move","coordinate":[100,200]}`,
			Action{Type: ActMouseMove, X: fp(100), Y: fp(200)}, DialectAnthropic},
		{"a left_click", `{"action":"left_click"}`, Action{Type: ActClick, Clicks: 1}, DialectAnthropic},
		{"a left_click at", `{"action":"left_click","coordinate":[5,6]}`,
			Action{Type: ActClick, X: fp(5), Y: fp(6), Clicks: 1}, DialectAnthropic},
		{"a right_click", `{"action":"right_click","coordinate":[5,6]}`,
			Action{Type: ActClick, X: fp(5), Y: fp(6), Button: "right", Clicks: 1}, DialectAnthropic},
		{"a middle_click", `{"action":"middle_click"}`, Action{Type: ActClick, Button: "middle", Clicks: 1}, DialectAnthropic},
		{"a double_click", `{"action":"double_click","coordinate":[5,6]}`,
			Action{Type: ActDoubleClick, X: fp(5), Y: fp(6), Clicks: 2}, DialectAnthropic},
		{"a left_click_drag", `{"action":"left_click_drag","coordinate":[50,60]}`,
			Action{Type: ActDrag, Path: []Point{{X: 50, Y: 60}}}, DialectAnthropic},
		{"a screenshot", `{"action":"screenshot"}`, Action{Type: ActScreenshot}, DialectAnthropic},
		{"a cursor_position", `{"action":"cursor_position"}`, Action{Type: ActCursorPosition}, DialectAnthropic},

		// Anthropic computer_20250124 additions.
		{"a scroll down", `{"action":"scroll","coordinate":[10,20],"scroll_direction":"down","scroll_amount":3}`,
			Action{Type: ActScroll, X: fp(10), Y: fp(20), DY: 3}, DialectAnthropic},
		{"a scroll up", `{"action":"scroll","scroll_direction":"up","scroll_amount":2}`,
			Action{Type: ActScroll, DY: -2}, DialectAnthropic},
		{"a scroll left with shift", `{"action":"scroll","coordinate":[1,2],"scroll_direction":"left","scroll_amount":5,"text":"shift"}`,
			Action{Type: ActScroll, X: fp(1), Y: fp(2), DX: -5, Modifiers: "shift"}, DialectAnthropic},
		{"a scroll right", `{"action":"scroll","scroll_direction":"right","scroll_amount":1}`,
			Action{Type: ActScroll, DX: 1}, DialectAnthropic},
		{"a left_mouse_down", `{"action":"left_mouse_down"}`, Action{Type: ActMouseDown}, DialectAnthropic},
		{"a left_mouse_up", `{"action":"left_mouse_up"}`, Action{Type: ActMouseUp}, DialectAnthropic},
		{"a triple_click", `{"action":"triple_click","coordinate":[7,8]}`,
			Action{Type: ActTripleClick, X: fp(7), Y: fp(8), Clicks: 3}, DialectAnthropic},
		{"a hold_key", `{"action":"hold_key","text":"shift","duration":1.5}`,
			Action{Type: ActKey, Keys: "shift", HoldMS: 1500}, DialectAnthropic},
		{"a wait", `{"action":"wait","duration":2}`, Action{Type: ActWait, MS: ip(2000)}, DialectAnthropic},
		{"a click with modifiers", `{"action":"left_click","coordinate":[5,6],"text":"ctrl+shift"}`,
			Action{Type: ActClick, X: fp(5), Y: fp(6), Clicks: 1, Modifiers: "ctrl+shift"}, DialectAnthropic},
		{"a click with key", `{"action":"left_click","coordinate":[5,6],"key":"alt"}`,
			Action{Type: ActClick, X: fp(5), Y: fp(6), Clicks: 1, Modifiers: "alt"}, DialectAnthropic},
		{"a drag with start", `{"action":"left_click_drag","start_coordinate":[1,2],"coordinate":[30,40]}`,
			Action{Type: ActDrag, Path: []Point{{X: 1, Y: 2}, {X: 30, Y: 40}}}, DialectAnthropic},

		// OpenAI computer use.
		{"o click", `{"type":"click","x":10,"y":20,"button":"left"}`,
			Action{Type: ActClick, X: fp(10), Y: fp(20), Button: "left", Clicks: 1}, DialectOrchard},
		{"o click wheel", `{"type":"click","x":10,"y":20,"button":"wheel"}`,
			Action{Type: ActClick, X: fp(10), Y: fp(20), Button: "middle", Clicks: 1}, DialectOpenAI},
		{"o click back", `{"type":"click","x":10,"y":20,"button":"back"}`,
			Action{Type: ActClick, X: fp(10), Y: fp(20), Button: "back", Clicks: 1}, DialectOrchard},
		{"o click with keys", `{"type":"click","x":1,"y":2,"button":"left","keys":["SHIFT"]}`,
			Action{Type: ActClick, X: fp(1), Y: fp(2), Button: "left", Clicks: 1, Modifiers: "shift"}, DialectOpenAI},
		{"o scroll", `{"type":"scroll","x":300,"y":400,"scroll_x":0,"scroll_y":250}`,
			Action{Type: ActScroll, X: fp(300), Y: fp(400), DY: 3}, DialectOpenAI},
		{"o scroll small up", `{"type":"scroll","x":1,"y":1,"scroll_x":-30,"scroll_y":0}`,
			Action{Type: ActScroll, X: fp(1), Y: fp(1), DX: -1}, DialectOpenAI},
		{"o keypress", `{"type":"keypress","keys":["CTRL","S"]}`, Action{Type: ActKey, Keys: "ctrl+s"}, DialectOpenAI},
		{"o keypress enter", `{"type":"keypress","keys":["ENTER"]}`, Action{Type: ActKey, Keys: "Return"}, DialectOpenAI},
		{"o keypress arrows", `{"type":"keypress","keys":["SHIFT","ARROWLEFT"]}`, Action{Type: ActKey, Keys: "shift+Left"}, DialectOpenAI},
		{"o keypress space", `{"type":"keypress","keys":["SPACE"]}`, Action{Type: ActKey, Keys: "space"}, DialectOpenAI},
		{"o keypress plus", `{"type":"keypress","keys":["CTRL","+"]}`, Action{Type: ActKey, Keys: "ctrl++"}, DialectOpenAI},
		{"o wait", `{"type":"wait"}`, Action{Type: ActWait, MS: ip(1000)}, DialectOrchard},
		{"o move", `{"type":"move","x":3,"y":4}`, Action{Type: ActMouseMove, X: fp(3), Y: fp(4)}, DialectOpenAI},
		{"o drag", `{"type":"drag","path":[{"x":1,"y":2},{"x":3,"y":4},{"x":5,"y":6}]}`,
			Action{Type: ActDrag, Path: []Point{{X: 1, Y: 2}, {X: 3, Y: 4}, {X: 5, Y: 6}}}, DialectOrchard},
		{"o type", `{"type":"type","text":"hi"}`, Action{Type: ActType, Text: "hi"}, DialectOrchard},
		{"o screenshot", `{"type":"screenshot"}`, Action{Type: ActScreenshot}, DialectOrchard},
		{"o computer_call item", `{"type":"computer_call","call_id":"c1","action":{"type":"keypress","keys":["ALT","F4"]}}`,
			Action{Type: ActKey, Keys: "alt+F4"}, DialectOpenAI},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAction([]byte(tc.in))
			if err != nil {
				t.Fatalf("ParseAction(%s): %v", tc.in, err)
			}
			if got.Dialect != tc.dialect {
				t.Errorf("dialect = %q, want %q", got.Dialect, tc.dialect)
			}
			got.Dialect, tc.want.Dialect = "", ""
			if !reflect.DeepEqual(got, tc.want) {
				gj, _ := json.Marshal(got)
				wj, _ := json.Marshal(tc.want)
				t.Errorf("ParseAction(%s)\n got %s\nwant %s", tc.in, gj, wj)
			}
			// The normalised form reads back to itself.
			b, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			again, err := ParseAction(b)
			if err != nil {
				t.Fatalf("re-parse %s: %v", b, err)
			}
			again.Dialect = ""
			if !reflect.DeepEqual(again, got) {
				t.Errorf("round trip of %s changed it", b)
			}
		})
	}
}

// Malformed actions are action.invalid faults, source policy, category
// invalid_request.
func TestParseActionInvalid(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{}`,
		`[]`,
		`{"type":"fly"}`,
		`{"action":"zoom","region":[0,0,10,10]}`,
		`{"action":42}`,
		`{"type":"click","x":1}`,
		`{"type":"click","x":1,"y":2,"button":"fourth"}`,
		`{"type":"click","x":1,"y":2,"clicks":11}`,
		`{"type":"click","x":1,"y":2,"modifiers":"ctrl+a"}`,
		`{"type":"mouse_move"}`,
		`{"type":"drag","path":[]}`,
		`{"type":"drag","path":[[1]]}`,
		`{"type":"drag","path":[{"x":1}]}`,
		`{"type":"type"}`,
		`{"type":"type","text":"bell\u0007"}`,
		`{"type":"type","text":"` + strings.Repeat("a", maxTextRunes+1) + `"}`,
		`{"type":"key","keys":"ctrl+nosuchkey"}`,
		`{"type":"key"}`,
		`{"type":"key","keys":"a","hold_ms":100001}`,
		`{"type":"wait","ms":-1}`,
		`{"type":"wait","ms":100001}`,
		`{"type":"scroll","dy":1.5}`,
		`{"type":"scroll","dy":1,"scroll_y":100}`,
		`{"type":"screenshot","format":"gif"}`,
		`{"type":"screenshot","quality":101}`,
		`{"type":"keypress","keys":"ctrl+s"}`,
		`{"type":"keypress","keys":[]}`,
		`{"type":"keypress","keys":["HYPERDRIVE"]}`,
		`{"action":"key"}`,
		`{"action":"type","text":""}`,
		`{"action":"mouse_move"}`,
		`{"action":"left_click_drag"}`,
		`{"action":"scroll","scroll_direction":"sideways","scroll_amount":1}`,
		`{"action":"scroll","scroll_direction":"down"}`,
		`{"action":"scroll","scroll_direction":"down","scroll_amount":-1}`,
		`{"action":"hold_key","text":"a"}`,
		`{"action":"wait","duration":101}`,
		`{"action":"left_click","text":"hello"}`,
		`{"type":"click","x":"1","y":2}`,
		`not json`,
	} {
		_, err := ParseAction([]byte(in))
		if err == nil {
			t.Errorf("ParseAction(%.60s): want an error", in)
			continue
		}
		fe := faults.Of(err)
		if fe.Code != faults.CodeActionInvalid || fe.Source != faults.Policy || fe.Category != faults.InvalidRequest {
			t.Errorf("ParseAction(%.60s) = %s/%s/%s (%v), want action.invalid/policy/invalid_request",
				in, fe.Code, fe.Source, fe.Category, err)
		}
	}
}

func TestParseRequestForms(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in     string
		types  []string
		frame  *int64
		strict bool
		obs    bool
	}{
		{`{"actions":[{"type":"click","x":1,"y":2},{"action":"type","text":"x"}],"frame":3,"strict":true,"observe":{"screenshot":"jpeg"}}`,
			[]string{ActClick, ActType}, i64(3), true, true},
		{`{"action":{"type":"keypress","keys":["ENTER"]}}`, []string{ActKey}, nil, false, false},
		{`{"action":"left_click","coordinate":[1,2]}`, []string{ActClick}, nil, false, false},
		{`{"type":"move","x":1,"y":2}`, []string{ActMouseMove}, nil, false, false},
		{`[{"type":"wait","ms":1},{"action":"screenshot"}]`, []string{ActWait, ActScreenshot}, nil, false, false},
	} {
		r, err := ParseRequest([]byte(tc.in))
		if err != nil {
			t.Errorf("ParseRequest(%s): %v", tc.in, err)
			continue
		}
		var types []string
		for _, a := range r.Actions {
			types = append(types, a.Type)
		}
		if !reflect.DeepEqual(types, tc.types) || !reflect.DeepEqual(r.Frame, tc.frame) || r.Strict != tc.strict || (r.Observe != nil) != tc.obs {
			t.Errorf("ParseRequest(%s) = %v frame %v strict %v observe %v", tc.in, types, r.Frame, r.Strict, r.Observe)
		}
	}
	for _, bad := range []string{``, `{}`, `{"actions":[]}`, `{"actions":[{"type":"fly"}]}`, `[1]`} {
		_, err := ParseRequest([]byte(bad))
		if fe := faults.Of(err); err == nil || fe.Code != faults.CodeActionInvalid {
			t.Errorf("ParseRequest(%s) = %v, want action.invalid", bad, err)
		}
	}
}

func TestPixelsToSteps(t *testing.T) {
	t.Parallel()
	for px, want := range map[float64]int{0: 0, 1: 1, -1: -1, 149: 1, 150: 2, 300: 3, -640: -6, 1e9: maxScrollSteps} {
		if got := pixelsToSteps(&px); got != want {
			t.Errorf("pixelsToSteps(%v) = %d, want %d", px, got, want)
		}
	}
}
