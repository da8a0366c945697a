package browser

import (
	"strings"
	"testing"
)

// An element scrolled out of a nested scroll container, though inside the
// viewport's box, is scrolled into view before it is clicked, and scroll
// {selector} brings it into view, even where the container scrolls
// smoothly.
func TestClickInsideScrollContainer(t *testing.T) {
	s := openPage(t, "/scrollbox.html")
	mustDo(t, s, Action{Type: ActClick, Selector: "#i12"}) // at y 480..520: in the viewport, hidden by #box
	if got := js[[]string](t, s, "window.clicks"); strings.Join(got, ",") != "i12" {
		t.Fatalf("clicks %v, want [i12]", got)
	}
	js[any](t, s, "document.getElementById('box').scrollTop = 0")
	mustDo(t, s, Action{Type: ActScroll, Selector: "#i9"})
	if top := js[float64](t, s, "document.getElementById('box').scrollTop"); top == 0 {
		t.Errorf("scroll {selector} did not scroll the container")
	}
}
