package browser

import (
	"os"
	"path/filepath"
	"testing"
)

// An action whose own effect opens a dialog (a change, focus or mousedown
// handler) did what was asked: it succeeds, like a click that opens one,
// and the observation shows the dialog.
func TestActionsThatOpenADialogSucceed(t *testing.T) {
	s := openPage(t, "/dialog-effects.html")
	f := filepath.Join(t.TempDir(), "cv.pdf")
	os.WriteFile(f, []byte("%PDF-1.4"), 0o644)
	for _, a := range []Action{
		{Type: ActSelectOption, Selector: "#color", Value: "Green"},
		{Type: ActType, Selector: "#name", Text: "x"},
		{Type: ActUploadFile, Selector: "#file", File: f},
		{Type: ActDrag, Points: [][2]float64{{50, 150}, {200, 250}}},
	} {
		res, err := s.Do(ctxT(t), []Action{a})
		if err != nil {
			t.Fatalf("%s: %v", a.Type, err)
		}
		if !res[0].OK {
			t.Errorf("%s that opened a dialog failed: %s: %s", a.Type, res[0].Error.Code, res[0].Error.Message)
		}
		if obs := observe(t, s, ObserveOptions{Screenshot: "none"}); obs.Dialog == nil || obs.Dialog.Type != "alert" {
			t.Fatalf("%s: dialog %+v, want the alert", a.Type, obs.Dialog)
		}
		mustDo(t, s, Action{Type: ActDialog})
	}
	if v := js[string](t, s, "document.getElementById('color').value"); v != "g" {
		t.Errorf("select value %q, want g", v)
	}
}
