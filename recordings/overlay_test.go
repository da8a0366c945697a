package recordings

import (
	"encoding/json"
	"reflect"
	"testing"
)

// Each action type becomes the overlay the replay draws: points stay in
// screenshot pixels, an element's box comes from the observation the
// policy chose from, a selector's from the action's result.
func TestOverlayOf(t *testing.T) {
	t.Parallel()
	prev := Step{Result: json.RawMessage(`{"observation":{"elements":[{"id":3,"bbox":[10,20,30,40]}]}}`)}
	for _, tt := range []struct {
		name, action, result string
		want                 *overlay
	}{
		{"click", `{"type":"click","x":5,"y":6}`, ``, &overlay{Kind: "click"}},
		{"element", `{"type":"click","element":3}`, ``, &overlay{Kind: "click", Box: &[4]float64{10, 20, 30, 40}}},
		{"selector", `{"type":"click","selector":"#go"}`, `{"results":[{"bbox":[1,2,3,4]}]}`, &overlay{Kind: "click", Box: &[4]float64{1, 2, 3, 4}}},
		{"type", `{"type":"type","text":"hi"}`, ``, &overlay{Kind: "type", Text: `type "hi"`}},
		{"key", `{"type":"key","keys":"Enter"}`, ``, &overlay{Kind: "key", Text: "key Enter"}},
		{"scroll at a point", `{"type":"scroll","x":10,"y":10,"dy":50}`, ``, &overlay{Kind: "scroll", Arrow: &[4]float64{10, 10, 10, 60}}},
		{"scroll from the centre", `{"type":"scroll","dx":-20}`, ``, &overlay{Kind: "scroll", Arrow: &[4]float64{200, 100, 180, 100}}},
		{"drag", `{"type":"drag","path":[[1,2],[3,4]]}`, ``, &overlay{Kind: "drag", Path: "1,2 3,4"}},
		{"list", `[{"type":"click","x":1,"y":1},{"type":"type","text":"a"},{"type":"key","keys":"Enter"}]`, ``, &overlay{Kind: "click", Text: `type "a" · key Enter`}},
		{"nothing to draw", `{"type":"back"}`, ``, nil},
		{"shell", `{"type":"exec","command":"ls"}`, ``, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			next := Step{Action: json.RawMessage(tt.action)}
			if tt.result != "" {
				next.Result = json.RawMessage(tt.result)
			}
			got := overlayOf(prev, next, 400, 200)
			if tt.want != nil {
				tt.want.W, tt.want.H, tt.want.StrokeW = 400, 200, 1
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("overlay %+v, want %+v", got, tt.want)
			}
		})
	}
}

// Shell steps read as a transcript; other actions are not shell steps.
func TestShellOf(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, action, result string
		screenshot           bool
		want                 *shellStep
	}{
		{"exec", `{"type":"exec","command":"make"}`, `{"stdout":"ok","stderr":"w","exit_code":2,"duration_ms":5,"stderr_truncated":true}`, false,
			&shellStep{Prompt: "$ make", Stdout: "ok", Stderr: "w", Exit: "2", ExitBad: true, MS: 5, Trunc: true}},
		{"write_file", `{"type":"write_file","path":"a.txt","content":"hi"}`, `{"exit_code":0}`, false, &shellStep{Prompt: "write_file a.txt", Body: "hi", Exit: "0"}},
		{"apply_patch", `{"type":"apply_patch","patch":"--- a"}`, ``, false, &shellStep{Prompt: "apply_patch", Body: "--- a"}},
		{"answer", `{"type":"answer","text":"42"}`, ``, false, &shellStep{Prompt: "answer: 42"}},
		{"a browser's answer", `{"type":"answer","text":"42"}`, ``, true, nil},
		{"click", `{"type":"click","x":1,"y":1}`, ``, false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := Step{Action: json.RawMessage(tt.action)}
			if tt.result != "" {
				st.Result = json.RawMessage(tt.result)
			}
			if tt.screenshot {
				st.Screenshot = "images/000001.png"
			}
			if got := shellOf(st); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%+v, want %+v", got, tt.want)
			}
		})
	}
}
