package desktop

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/orchard/orchard/faults"
)

// FuzzParseRequest: any body is a request or an action.invalid fault, and
// the normalised form is stable: a parsed request, written out and parsed
// again, is the same request (the dialects all land on one vocabulary).
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		"{\"type\":\"click\",\"x\":10,\"y\":20,\"button\":\"right\",\"clicks\":2}",
		"{\"type\":\"click\",\"x\":1.5,\"y\":2}",
		"{\"type\":\"double_click\",\"x\":1,\"y\":2}",
		"{\"type\":\"triple_click\",\"x\":1,\"y\":2,\"modifiers\":\"shift\"}",
		"{\"type\":\"mouse_move\",\"x\":3,\"y\":4}",
		"{\"type\":\"mouse_down\"}",
		"{\"type\":\"mouse_up\",\"x\":5,\"y\":6,\"button\":\"middle\"}",
		"{\"type\":\"drag\",\"path\":[[1,2],[3,4]]}",
		"{\"type\":\"scroll\",\"x\":5,\"y\":6,\"dx\":-1,\"dy\":3}",
		"{\"type\":\"type\",\"text\":\"héllo\"}",
		"{\"type\":\"key\",\"keys\":\"ctrl+s\"}",
		"{\"type\":\"key\",\"keys\":\"shift\",\"hold_ms\":500}",
		"{\"type\":\"wait\",\"ms\":250}",
		"{\"type\":\"wait\"}",
		"{\"type\":\"screenshot\",\"format\":\"jpeg\",\"quality\":70,\"width\":640}",
		"{\"type\":\"cursor_position\"}",
		"{\"type\":\"click\",\"x\":1,\"y\":2,\"frame\":7,\"strict\":true}",
		"{\"action\":\"key\",\"text\":\"ctrl+shift+t\"}",
		"{\"action\":\"type\",\"text\":\"Hello, world\"}",
		"{\"action\":\"mouse_move\",\"coordinate\":[100,200]}",
		"{\"action\":\"left_click\"}",
		"{\"action\":\"left_click\",\"coordinate\":[5,6]}",
		"{\"action\":\"right_click\",\"coordinate\":[5,6]}",
		"{\"action\":\"middle_click\"}",
		"{\"action\":\"double_click\",\"coordinate\":[5,6]}",
		"{\"action\":\"left_click_drag\",\"coordinate\":[50,60]}",
		"{\"action\":\"screenshot\"}",
		"{\"action\":\"cursor_position\"}",
		"{\"action\":\"scroll\",\"coordinate\":[10,20],\"scroll_direction\":\"down\",\"scroll_amount\":3}",
		"{\"action\":\"scroll\",\"scroll_direction\":\"up\",\"scroll_amount\":2}",
		"{\"action\":\"scroll\",\"coordinate\":[1,2],\"scroll_direction\":\"left\",\"scroll_amount\":5,\"text\":\"shift\"}",
		"{\"action\":\"scroll\",\"scroll_direction\":\"right\",\"scroll_amount\":1}",
		"{\"action\":\"left_mouse_down\"}",
		"{\"action\":\"left_mouse_up\"}",
		"{\"action\":\"triple_click\",\"coordinate\":[7,8]}",
		"{\"action\":\"hold_key\",\"text\":\"shift\",\"duration\":1.5}",
		"{\"action\":\"wait\",\"duration\":2}",
		"{\"action\":\"left_click\",\"coordinate\":[5,6],\"text\":\"ctrl+shift\"}",
		"{\"action\":\"left_click\",\"coordinate\":[5,6],\"key\":\"alt\"}",
		"{\"action\":\"left_click_drag\",\"start_coordinate\":[1,2],\"coordinate\":[30,40]}",
		`[{"type":"click","x":1,"y":2},{"action":"key","text":"ctrl+s"}]`,
		`{"actions":[{"type":"drag","path":[{"x":1,"y":2},{"x":3,"y":4}]}],"frame":3,"strict":true,"observe":{"screenshot":"jpeg"}}`,
		`{"action":{"action":"left_click_drag","start_coordinate":[1,2],"coordinate":[3,4]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			if fe, ok := errors.AsType[*faults.Error](err); !ok || fe.Code != faults.CodeActionInvalid {
				t.Fatalf("%q: error %v (%T), want an action.invalid fault", b, err, err)
			}
			return
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("%q: marshal the parsed request: %v", b, err)
		}
		again, err := ParseRequest(out)
		if err != nil {
			t.Fatalf("%q parsed, but its normalised form %s does not: %v", b, out, err)
		}
		for i := range r.Actions {
			r.Actions[i].Dialect = ""
		}
		for i := range again.Actions {
			again.Actions[i].Dialect = ""
		}
		if !reflect.DeepEqual(r, again) {
			t.Fatalf("%q: parsed as %+v, its normalised form %s as %+v", b, r, out, again)
		}
	})
}
