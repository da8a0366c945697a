package browser

import (
	"testing"
	"time"
)

// Marks inside iframes: a padded iframe's content is placed inside the
// padding, and an iframe covered by the parent page's overlay has no
// clickable marks.
func TestMarksInsideIframes(t *testing.T) {
	s := openPage(t, "/framebox.html")
	deadline := time.Now().Add(5 * time.Second)
	for !js[bool](t, s, "[...document.querySelectorAll('iframe')].every(f => f.contentDocument && f.contentDocument.querySelector('button'))") {
		if time.Now().After(deadline) {
			t.Fatal("iframes did not load")
		}
		time.Sleep(20 * time.Millisecond)
	}
	obs := observe(t, s, ObserveOptions{Screenshot: "none", SOM: true})
	var padded *Element
	for i, e := range obs.Elements {
		switch e.Name {
		case "Padded":
			padded = &obs.Elements[i]
		case "Covered":
			t.Errorf("a button under an overlay is a mark: %+v", e)
		}
	}
	if padded == nil {
		t.Fatalf("no Padded mark in %+v", obs.Elements)
	}
	if padded.BBox != [4]float64{140, 140, 100, 20} {
		t.Errorf("Padded bbox %v, want [140 140 100 20] (inside the iframe's 40px padding)", padded.BBox)
	}
	mustDo(t, s, Action{Type: ActClick, Element: &padded.ID})
	if !js[bool](t, s, "!!window.padHit") {
		t.Error("click by mark on a button in a padded iframe missed")
	}
}
