package recordings

import (
	"bytes"
	"context"
	"encoding/json"
	"image/color"
	"strings"
	"testing"
)

// A step that sent several actions (a JSON list) still gets its marker:
// the first action with a point.
func TestHTMLMarkerOfActionList(t *testing.T) {
	t.Parallel()
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(Manifest{ID: "list", Question: "q"})
	if err != nil {
		t.Fatal(err)
	}
	shot := testImage(t, 200, 100, color.RGBA{255, 0, 0, 255}, "png")
	for _, st := range []Step{{N: 0}, {N: 1, Action: json.RawMessage(`[{"type":"click","x":50,"y":25},{"type":"type","text":"hi"}]`)}} {
		if err := w.Append(st, shot, "png"); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	r, err := s.Open("list")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := r.Export(context.Background(), FormatHTML, &b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `left:25.000%;top:25.000%`) || !strings.Contains(b.String(), "step 1: click (50, 25)") {
		t.Errorf("no marker for a list of actions")
	}
}
