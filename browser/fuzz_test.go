package browser

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/orchard/orchard/faults"
)

// FuzzActions: a decoded action request either validates or is refused as
// action.invalid, and every action survives being written out and read
// back (drag points and upload paths share the "path" field).
func FuzzActions(f *testing.F) {
	for _, s := range []string{
		`{"actions":[{"type":"click","x":10,"y":20,"button":"right","clicks":2},{"type":"type","text":"héllo","selector":"#q","clear":true}]}`,
		`{"action":{"type":"drag","path":[[1,2],[3,4],[5,6]]},"frame":3,"strict":true}`,
		`{"action":{"type":"upload_file","selector":"input[type=file]","path":"/workspace/a.txt"}}`,
		`{"actions":[{"type":"scroll","dx":0,"dy":300},{"type":"wait","until":"networkidle"},{"type":"key","keys":"Control+a Delete"}]}`,
		`{"actions":[{"type":"switch_tab","index":1},{"type":"dialog","accept":false,"text":"no"},{"type":"answer","text":"42"}],"observe":{"screenshot":"png","width":640,"som":true}}`,
		`{"action":{"type":"click","element":3}}`,
		`{"action":{"type":"hover","x":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		if json.Unmarshal(b, &r) != nil {
			return
		}
		for _, a := range r.List() {
			if err := validate(a); err != nil {
				if fe, ok := errors.AsType[*faults.Error](err); !ok || fe.Code != faults.CodeActionInvalid {
					t.Fatalf("%q: %v (%T), want an action.invalid fault", b, err, err)
				}
			}
			out, err := json.Marshal(a)
			if err != nil {
				t.Fatalf("%q: marshal %+v: %v", b, a, err)
			}
			var back Action
			if err := json.Unmarshal(out, &back); err != nil {
				t.Fatalf("%q: %s does not read back: %v", b, out, err)
			}
			if !reflect.DeepEqual(a, back) {
				t.Fatalf("%q: %+v written as %s reads back as %+v", b, a, out, back)
			}
		}
	})
}
