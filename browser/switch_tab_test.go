package browser

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A tab whose renderer crashed in the background can be switched to and
// revived by navigating it.
func TestSwitchToCrashedTabAndRevive(t *testing.T) {
	s := openPage(t, "/basic.html")
	crashed, _ := s.activeTab(ctxT(t))
	mustDo(t, s, Action{Type: ActNewTab, URL: site.URL + "/form.html"})
	crash(t, crashed)
	deadline := time.Now().Add(10 * time.Second)
	for !crashed.isCrashed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	idx := -1
	for i, tb := range s.Tabs() {
		if strings.HasSuffix(tb.URL, "/basic.html") {
			idx = i
		}
	}
	mustDo(t, s, Action{Type: ActSwitchTab, Index: &idx})
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/basic.html"}, Action{Type: ActClick, Selector: "#b1"})
	if got := js[[]string](t, s, "window.clicks"); len(got) != 1 {
		t.Errorf("after revival clicks %v", got)
	}
}

// A tab whose page shows a dialog can be switched to, and the dialog
// answered, in one request.
func TestSwitchToTabWithDialog(t *testing.T) {
	s := openPage(t, "/dialogs.html")
	mustDo(t, s, Action{Type: ActNewTab, URL: site.URL + "/basic.html"})
	idx := -1
	for i, tb := range s.Tabs() {
		if strings.HasSuffix(tb.URL, "/dialogs.html") {
			idx = i
		}
	}
	// The page of the background tab opens an alert.
	s.mu.Lock()
	dtab := s.tabs[idx]
	s.mu.Unlock()
	if _, err := dtab.eval(context.Background(), "setTimeout(function(){alert('from behind')}, 0)", false, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for dtab.openDialog() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	mustDo(t, s, Action{Type: ActSwitchTab, Index: &idx}, Action{Type: ActDialog})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("switch and answer took %v", d)
	}
	if obs := observe(t, s, ObserveOptions{}); obs.Dialog != nil || obs.Screenshot == nil || obs.Title != "Dialogs" {
		t.Errorf("after answering: title %q dialog %+v", obs.Title, obs.Dialog)
	}
}
