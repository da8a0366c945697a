package browser

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	_ "image/jpeg"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
)

func TestNavigateAndObserve(t *testing.T) {
	s := openPage(t, "/basic.html")
	obs := observe(t, s, ObserveOptions{Screenshot: "jpeg", Width: 640})
	if obs.URL != site.URL+"/basic.html" || obs.Title != "Basic" {
		t.Errorf("url %q title %q", obs.URL, obs.Title)
	}
	if obs.Viewport.Width != 1280 || obs.Viewport.Height != 720 {
		t.Errorf("viewport %+v, want 1280x720", obs.Viewport)
	}
	if obs.Screenshot == nil || obs.Screenshot.Width != 640 || obs.Screenshot.Height != 360 || obs.Scale != 0.5 {
		t.Fatalf("screenshot %dx%d scale %v, want 640x360 at 0.5", obs.Screenshot.Width, obs.Screenshot.Height, obs.Scale)
	}
	img, format, err := image.Decode(bytes.NewReader(obs.Screenshot.Data))
	if err != nil || format != "jpeg" || img.Bounds().Dx() != 640 {
		t.Fatalf("decode: %v %s %v", err, format, img.Bounds())
	}
	if n := len(obs.Tabs); n < 2 || !obs.Tabs[n-1].Active || obs.Tabs[n-1].URL != obs.URL {
		t.Errorf("tabs %+v: want the test's tab last and active", obs.Tabs)
	}
	full := observe(t, s, ObserveOptions{Screenshot: "png"})
	if full.Frame <= obs.Frame {
		t.Errorf("frame ids %d then %d: want increasing", obs.Frame, full.Frame)
	}
	if full.Scale != 1 || full.Screenshot.Width != 1280 || full.Screenshot.Height != 720 || full.Screenshot.Format != "png" {
		t.Errorf("undownscaled: scale %v %dx%d %s", full.Scale, full.Screenshot.Width, full.Screenshot.Height, full.Screenshot.Format)
	}
}

// A downscaled screenshot of a scrolled page shows what the viewport shows.
func TestScreenshotOfScrolledViewport(t *testing.T) {
	s := openPage(t, "/long.html")
	js[any](t, s, "window.scrollTo(0, 900)")
	obs := observe(t, s, ObserveOptions{Screenshot: "png", Width: 640})
	img, _, err := image.Decode(bytes.NewReader(obs.Screenshot.Data))
	if err != nil {
		t.Fatal(err)
	}
	// Viewport y 0..100 is the red block's end (900..1000), the rest blue.
	if c := rgb(img.At(10, 20)); c != (color.RGBA{255, 0, 0, 255}) {
		t.Errorf("top pixel %v, want red", c)
	}
	if c := rgb(img.At(10, 200)); c != (color.RGBA{0, 0, 255, 255}) {
		t.Errorf("pixel at y=200 %v, want blue", c)
	}
	if obs.Viewport.ScrollY != 900 {
		t.Errorf("scroll_y %v, want 900", obs.Viewport.ScrollY)
	}
}

func rgb(c color.Color) color.RGBA {
	r, g, b, _ := c.RGBA()
	q := func(v uint32) uint8 { // JPEG and PNG both: snap to 0 or 255
		if v>>8 > 127 {
			return 255
		}
		return 0
	}
	return color.RGBA{q(r), q(g), q(b), 255}
}

func TestClickCoordinatesInDownscaledScreenshot(t *testing.T) {
	s := openPage(t, "/basic.html")
	obs := observe(t, s, ObserveOptions{Screenshot: "jpeg", Width: 640})
	// #b2 is at CSS (600,300) 100×40: its centre is (650,320), which is
	// (325,160) in the half-size screenshot.
	mustDo(t, s, Action{Type: ActClick, X: fptr(650 * obs.Scale), Y: fptr(320 * obs.Scale)})
	if got := js[[]string](t, s, "window.clicks"); len(got) != 1 || got[0] != "b2" {
		t.Fatalf("clicks %v, want [b2]", got)
	}
	// At another scale the same CSS point maps the same way.
	obs = observe(t, s, ObserveOptions{Screenshot: "jpeg", Width: 1000})
	mustDo(t, s, Action{Type: ActClick, X: fptr(1050 * obs.Scale), Y: fptr(620 * obs.Scale), Frame: &obs.Frame})
	if got := js[[]string](t, s, "window.clicks"); len(got) != 2 || got[1] != "b3" {
		t.Fatalf("clicks %v, want [b2 b3]", got)
	}
}

func TestClickBySOMElementAndSelector(t *testing.T) {
	s := openPage(t, "/basic.html")
	obs := observe(t, s, ObserveOptions{Screenshot: "none", SOM: true, Width: 640})
	var one *Element
	for i, e := range obs.Elements {
		if e.Name == "One" {
			one = &obs.Elements[i]
		}
	}
	if one == nil {
		t.Fatalf("no element named One in %+v", obs.Elements)
	}
	if one.Role != "button" || one.BBox != [4]float64{50, 50, 50, 20} {
		t.Errorf("element One: %+v, want button at [50 50 50 20] (half scale)", *one)
	}
	mustDo(t, s, Action{Type: ActClick, Element: &one.ID})
	mustDo(t, s, Action{Type: ActClick, Selector: "#b3"})
	mustDo(t, s, Action{Type: ActDoubleClick, Selector: "#b3"})
	mustDo(t, s, Action{Type: ActHover, Selector: "#hov"})
	if got := js[[]string](t, s, "window.clicks"); strings.Join(got, ",") != "b1,b3,b3,b3" {
		t.Errorf("clicks %v, want [b1 b3 b3 b3]", got)
	}
	if js[int](t, s, "window.dbl") != 1 || !js[bool](t, s, "!!window.hovered") {
		t.Errorf("dblclick %v hovered %v", js[int](t, s, "window.dbl"), js[bool](t, s, "!!window.hovered"))
	}
	// Clicking a link navigates and settles on the new page.
	mustDo(t, s, Action{Type: ActClick, Selector: "#next"})
	if got := observe(t, s, ObserveOptions{Screenshot: "none"}).Title; got != "Form" {
		t.Errorf("after link click title %q, want Form", got)
	}
}

func TestTypeAndKeys(t *testing.T) {
	s := openPage(t, "/form.html")
	mustDo(t, s, Action{Type: ActType, Selector: "#name", Text: "Hello"})
	mustDo(t, s, Action{Type: ActType, Text: " world"}) // the focused input
	if v := js[string](t, s, "document.getElementById('name').value"); v != "Hello world" {
		t.Fatalf("value %q, want Hello world", v)
	}
	mustDo(t, s, Action{Type: ActType, Selector: "#name", Text: "Ada", Clear: true})
	if v := js[string](t, s, "document.getElementById('name').value"); v != "Ada" {
		t.Fatalf("after clear value %q, want Ada", v)
	}
	mustDo(t, s, Action{Type: ActKey, Keys: "Control+a"}, Action{Type: ActKey, Keys: "Backspace"})
	if v := js[string](t, s, "document.getElementById('name').value"); v != "" {
		t.Fatalf("after Control+a Backspace value %q, want empty", v)
	}
	mustDo(t, s, Action{Type: ActType, Selector: "#notes", Text: "line1\nline2"})
	if v := js[string](t, s, "document.getElementById('notes').value"); v != "line1\nline2" {
		t.Errorf("textarea %q", v)
	}
	mustDo(t, s, Action{Type: ActKey, Keys: "Shift+Tab"})
	if id := js[string](t, s, "document.activeElement.id"); id != "name" {
		t.Errorf("after Shift+Tab focus on %q, want name", id)
	}
	mustDo(t, s, Action{Type: ActType, Selector: "#name", Text: "x\n"})
	if !js[bool](t, s, "!!window.submitted") {
		t.Error("Enter in the input did not submit the form")
	}
	if c := failCode(t, s, Action{Type: ActType, Selector: "#submit", Text: "x"}); c.Code != faults.CodeActionNotEditable {
		t.Errorf("typing into a button: %s", c.Code)
	}
	if c := failCode(t, s, Action{Type: ActKey, Keys: "Control+Nope"}); c.Code != faults.CodeActionInvalid {
		t.Errorf("bad key: %s", c.Code)
	}
}

func TestScroll(t *testing.T) {
	s := openPage(t, "/long.html")
	obs := observe(t, s, ObserveOptions{Width: 640})
	mustDo(t, s, Action{Type: ActScroll, DY: 500}) // screenshot pixels: 1000 CSS px
	if y := js[float64](t, s, "scrollY"); y != 1000 {
		t.Errorf("scrollY %v, want 1000 (500 screenshot px at scale %v)", y, obs.Scale)
	}
	mustDo(t, s, Action{Type: ActScroll, Selector: "#far"})
	if y := js[float64](t, s, "scrollY"); y < 2500 {
		t.Errorf("scrollY %v after scrolling #far into view", y)
	}
	mustDo(t, s, Action{Type: ActClick, Selector: "#far"})
	if !js[bool](t, s, "!!window.farClicked") {
		t.Error("click on a scrolled-to element missed")
	}
}

func TestDrag(t *testing.T) {
	s := openPage(t, "/drag.html")
	mustDo(t, s, Action{Type: ActDrag, Points: [][2]float64{{140, 140}, {440, 340}}})
	if l, tp := js[string](t, s, "box.style.left"), js[string](t, s, "box.style.top"); l != "400px" || tp != "300px" {
		t.Errorf("box at %s,%s, want 400px,300px", l, tp)
	}
	mustDo(t, s, Action{Type: ActDrag, Points: [][2]float64{{440, 340}, {500, 340}, {500, 400}}})
	if l, tp := js[string](t, s, "box.style.left"), js[string](t, s, "box.style.top"); l != "460px" || tp != "360px" {
		t.Errorf("box at %s,%s after a three-point path, want 460px,360px", l, tp)
	}
}

func TestSelectAndUpload(t *testing.T) {
	s := openPage(t, "/form.html")
	mustDo(t, s, Action{Type: ActSelectOption, Selector: "#color", Value: "g"})
	mustDo(t, s, Action{Type: ActSelectOption, Selector: "#color", Value: "Blue"})
	if v := js[string](t, s, "document.getElementById('color').value"); v != "b" {
		t.Errorf("select value %q, want b", v)
	}
	if c := failCode(t, s, Action{Type: ActSelectOption, Selector: "#color", Value: "Purple"}); c.Code != faults.CodeActionNoSuchOpt {
		t.Errorf("missing option: %s", c.Code)
	}
	f := filepath.Join(t.TempDir(), "cv.pdf")
	os.WriteFile(f, []byte("%PDF-1.4"), 0o644)
	mustDo(t, s, Action{Type: ActUploadFile, Selector: "#file", File: f})
	if n := js[string](t, s, "document.getElementById('file').files[0].name"); n != "cv.pdf" {
		t.Errorf("uploaded %q", n)
	}
	if got := js[[]string](t, s, "window.changes"); strings.Join(got, ",") != "color=g,color=b,file=cv.pdf" {
		t.Errorf("change events %v", got)
	}
	if c := failCode(t, s, Action{Type: ActUploadFile, Selector: "#file", File: "/nonexistent/x"}); c.Code != faults.CodeFileNotFound {
		t.Errorf("missing upload file: %s", c.Code)
	}
}

func TestPopupOpensTabWithoutStealingFocus(t *testing.T) {
	s := openPage(t, "/popup.html")
	before := len(s.Tabs())
	mustDo(t, s, Action{Type: ActClick, Selector: "#blank"})
	tabs := waitTabs(t, s, before+1, "/basic.html")
	if !tabs[before-1].Active || tabs[before].Active {
		t.Fatalf("tabs %+v: the opener must stay active", tabs)
	}
	if obs := observe(t, s, ObserveOptions{Screenshot: "none"}); obs.Title != "Popup" {
		t.Errorf("active page %q, want Popup", obs.Title)
	}
	mustDo(t, s, Action{Type: ActSwitchTab, Index: iptr(before)})
	// The new tab may still be loading its page (a loaded machine):
	// its title comes with it.
	obs := observe(t, s, ObserveOptions{Width: 640})
	for deadline := time.Now().Add(10 * time.Second); obs.Title == "" && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		obs = observe(t, s, ObserveOptions{Width: 640})
	}
	if obs.Title != "Basic" || obs.Screenshot == nil || obs.Screenshot.Width != 640 {
		t.Fatalf("after switch: %q %v", obs.Title, obs.Screenshot != nil)
	}
	mustDo(t, s, Action{Type: ActClick, Selector: "#b1"}) // the adopted tab takes actions
	if got := js[[]string](t, s, "window.clicks"); len(got) != 1 {
		t.Errorf("clicks in the new tab: %v", got)
	}
	mustDo(t, s, Action{Type: ActCloseTab})
	tabs = s.Tabs()
	if len(tabs) != before || !tabs[before-1].Active {
		t.Fatalf("after close_tab: %+v", tabs)
	}
	if c := failCode(t, s, Action{Type: ActSwitchTab, Index: iptr(99)}); c.Code != faults.CodeActionNoSuchTab {
		t.Errorf("switch to a missing tab: %s", c.Code)
	}
	// window.open from a script, then close it by index.
	mustDo(t, s, Action{Type: ActClick, Selector: "#open"})
	waitTabs(t, s, before+1, "/form.html")
	mustDo(t, s, Action{Type: ActCloseTab, Index: iptr(before)})
	if n := len(s.Tabs()); n != before {
		t.Errorf("%d tabs after closing the popup, want %d", n, before)
	}
}

// waitTabs waits until n tabs are open and the last one shows a URL
// ending in suffix.
func waitTabs(t testing.TB, s *Session, n int, suffix string) []Tab {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tabs := s.Tabs()
		if len(tabs) == n && strings.HasSuffix(tabs[n-1].URL, suffix) {
			return tabs
		}
		if time.Now().After(deadline) {
			t.Fatalf("tabs %+v: want %d, the last at %s", tabs, n, suffix)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDialogs(t *testing.T) {
	s := openPage(t, "/dialogs.html")
	start := time.Now()
	mustDo(t, s, Action{Type: ActClick, Selector: "#alert"})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("click that opened an alert took %v", d)
	}
	obs := observe(t, s, ObserveOptions{Screenshot: "jpeg", SOM: true})
	if obs.Dialog == nil || obs.Dialog.Type != "alert" || obs.Dialog.Message != "hello there" {
		t.Fatalf("dialog %+v", obs.Dialog)
	}
	if obs.Title != "Dialogs" {
		t.Errorf("title while a dialog is open: %q", obs.Title)
	}
	if c := failCode(t, s, Action{Type: ActClick, Selector: "#confirm"}); c.Code != faults.CodeActionDialogOpen {
		t.Errorf("click while a dialog is open: %s", c.Code)
	}
	mustDo(t, s, Action{Type: ActDialog})
	if !js[bool](t, s, "!!window.afterAlert") {
		t.Error("the page did not continue after the alert")
	}
	if obs := observe(t, s, ObserveOptions{}); obs.Dialog != nil || obs.Screenshot == nil {
		t.Errorf("after answering: dialog %+v screenshot %v", obs.Dialog, obs.Screenshot != nil)
	}

	mustDo(t, s, Action{Type: ActClick, Selector: "#confirm"}, Action{Type: ActDialog, Accept: new(false)})
	if js[bool](t, s, "window.confirmed") {
		t.Error("confirm dismissed but returned true")
	}
	mustDo(t, s, Action{Type: ActClick, Selector: "#prompt"}, Action{Type: ActDialog, Text: "Ada"})
	if v := js[string](t, s, "window.prompted"); v != "Ada" {
		t.Errorf("prompt answered %q, want Ada", v)
	}
	if c := failCode(t, s, Action{Type: ActDialog}); c.Code != faults.CodeActionNoDialog {
		t.Errorf("dialog with none open: %s", c.Code)
	}
}

func TestDownload(t *testing.T) {
	s := openPage(t, "/download.html")
	mustDo(t, s, Action{Type: ActClick, Selector: "#dl"})
	deadline := time.Now().Add(10 * time.Second)
	for {
		var d *Download
		for _, x := range s.Downloads() {
			if x.Name == "report.txt" || strings.HasPrefix(x.Name, "report (") {
				d = &x
			}
		}
		if d != nil && d.State == DownloadCompleted {
			b, err := os.ReadFile(d.Path)
			if err != nil || len(b) != 12000 || d.Size != 12000 || filepath.Dir(d.Path) != shared.dl {
				t.Fatalf("download %+v: read %d bytes, %v", *d, len(b), err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("downloads %+v", s.Downloads())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Navigating straight to a file downloads it and is no error.
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/file/direct.bin"})
	if obs := observe(t, s, ObserveOptions{Screenshot: "none"}); len(obs.Downloads) < 2 {
		t.Errorf("downloads in the observation: %+v", obs.Downloads)
	}
}

func TestNavigationFailuresAreClassified(t *testing.T) {
	s := openPage(t, "/basic.html")
	cases := []struct {
		url, code string
		source    faults.Source
		retryable bool
	}{
		{"http://nonexistent.invalid/", faults.CodeSiteDNS, faults.Site, true},
		{site.URL + "/status/503", "site.http_503", faults.Site, true},
		{site.URL + "/status/404", "site.http_404", faults.Site, false},
		{fmt.Sprintf("http://127.0.0.1:%d/", freePort(t)), faults.CodeSiteConnectionRefused, faults.Site, true},
	}
	for _, c := range cases {
		e := failCode(t, s, Action{Type: ActNavigate, URL: c.url})
		if e.Code != c.code || e.Source != c.source || e.Retryable != c.retryable {
			t.Errorf("%s: %+v, want %s from %s retryable=%v", c.url, *e, c.code, c.source, c.retryable)
		}
	}
	// An HTTP error page is displayed, and the tab still works.
	failCode(t, s, Action{Type: ActNavigate, URL: site.URL + "/status/404"})
	if obs := observe(t, s, ObserveOptions{Screenshot: "none", Text: true}); !strings.Contains(obs.Text, "status 404") {
		t.Errorf("error page text %q", obs.Text)
	}
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/basic.html"})
	// A link to an error page reports the site's failure on the click.
	js[any](t, s, fmt.Sprintf("document.getElementById('next').href=%q", site.URL+"/status/502"))
	if e := failCode(t, s, Action{Type: ActClick, Selector: "#next"}); e.Code != "site.http_502" {
		t.Errorf("click to a 502: %+v", *e)
	}
}

func TestMissingSelectorKeepsBrowserUsable(t *testing.T) {
	s := openPage(t, "/basic.html")
	e := failCode(t, s, Action{Type: ActClick, Selector: "#nope"})
	if e.Code != faults.CodeActionNoSuchElement || e.Source != faults.Policy || e.Retryable {
		t.Errorf("missing selector: %+v", *e)
	}
	// A list stops at the failure.
	res, err := s.Do(ctxT(t), []Action{{Type: ActClick, Selector: "#b1"}, {Type: ActClick, Selector: "#nope"}, {Type: ActClick, Selector: "#b2"}})
	if err != nil || len(res) != 2 || !res[0].OK || res[1].OK {
		t.Fatalf("list: %+v %v", res, err)
	}
	if got := js[[]string](t, s, "window.clicks"); strings.Join(got, ",") != "b1" {
		t.Errorf("clicks %v: the action after the failure must not run", got)
	}
	if e := failCode(t, s, Action{Type: ActClick, Element: iptr(4242)}); e.Code != faults.CodeActionStaleElement && e.Code != faults.CodeActionNoSuchElement {
		t.Errorf("unknown element id: %s", e.Code)
	}
	if e := failCode(t, s, Action{Type: ActClick, Selector: "#b1", X: fptr(1), Y: fptr(1)}); e.Code != faults.CodeActionInvalid {
		t.Errorf("two targets: %s", e.Code)
	}
	mustDo(t, s, Action{Type: ActClick, Selector: "#b2"})
}

func TestStrictStaleFrame(t *testing.T) {
	s := openPage(t, "/basic.html")
	old := observe(t, s, ObserveOptions{Width: 640}).Frame
	cur := observe(t, s, ObserveOptions{Width: 640}).Frame
	e := failCode(t, s, Action{Type: ActClick, X: fptr(325), Y: fptr(160), Frame: &old, Strict: true})
	if e.Code != faults.CodeActionStaleFrame || e.Source != faults.Policy {
		t.Errorf("stale frame: %+v", *e)
	}
	if got := js[[]string](t, s, "window.clicks"); len(got) != 0 {
		t.Fatalf("a refused action clicked: %v", got)
	}
	// Not strict: the old frame's scale still maps the point.
	mustDo(t, s, Action{Type: ActClick, X: fptr(325), Y: fptr(160), Frame: &old})
	mustDo(t, s, Action{Type: ActClick, X: fptr(325), Y: fptr(160), Frame: &cur, Strict: true})
	if got := js[[]string](t, s, "window.clicks"); strings.Join(got, ",") != "b2,b2" {
		t.Errorf("clicks %v", got)
	}
	// A new page makes the latest frame stale too, and its element ids.
	obs := observe(t, s, ObserveOptions{SOM: true})
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/form.html"})
	if e := failCode(t, s, Action{Type: ActClick, X: fptr(1), Y: fptr(1), Frame: &obs.Frame, Strict: true}); e.Code != faults.CodeActionStaleFrame {
		t.Errorf("frame of the previous page: %s", e.Code)
	}
	if e := failCode(t, s, Action{Type: ActClick, Element: &obs.Elements[0].ID}); e.Code != faults.CodeActionStaleElement {
		t.Errorf("element id of the previous page: %s", e.Code)
	}
	req := Request{Actions: []Action{{Type: ActClick, X: fptr(1), Y: fptr(1)}}, Frame: &obs.Frame, Strict: true}
	if l := req.List(); *l[0].Frame != obs.Frame || !l[0].Strict {
		t.Errorf("request-level frame not applied: %+v", l[0])
	}
}

func TestAXTreeShadowAndFrames(t *testing.T) {
	s := openPage(t, "/form.html")
	mustDo(t, s, Action{Type: ActType, Selector: "#name", Text: "Ada"})
	obs := observe(t, s, ObserveOptions{Screenshot: "none", AXTree: true, SOM: true})
	for _, want := range []string{`textbox "Name" value="Ada" focused`, `combobox value="Red"`, `checkbox "I agree"`, `button "Send"`} {
		if !strings.Contains(obs.AXTree, want) {
			t.Errorf("axtree lacks %s:\n%s", want, obs.AXTree)
		}
	}
	// Every SOM element appears in the tree with its id.
	for _, e := range obs.Elements {
		if !strings.Contains(obs.AXTree, fmt.Sprintf("[%d] %s", e.ID, e.Role)) {
			t.Errorf("element %+v not in the tree", e)
		}
	}
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/shadow.html"})
	obs = observe(t, s, ObserveOptions{Screenshot: "none", SOM: true, AXTree: true})
	ids := map[string]int{}
	for _, e := range obs.Elements {
		ids[e.Name] = e.ID
	}
	if ids["In shadow"] == 0 || ids["In frame"] == 0 {
		t.Fatalf("shadow DOM and iframe buttons missing: %+v\n%s", obs.Elements, obs.AXTree)
	}
	mustDo(t, s, Action{Type: ActClick, Element: iptr(ids["In shadow"])}, Action{Type: ActClick, Element: iptr(ids["In frame"])})
	if !js[bool](t, s, "!!window.shadowClicked && !!window.frameClicked") {
		t.Error("clicks by id into shadow DOM and an iframe missed")
	}
}

func TestMarksDrawn(t *testing.T) {
	s := openPage(t, "/basic.html")
	plain := observe(t, s, ObserveOptions{Screenshot: "png", Width: 640, SOM: true})
	marked := observe(t, s, ObserveOptions{Screenshot: "png", Width: 640, Marks: true})
	if len(marked.Elements) == 0 || len(marked.Elements) != len(plain.Elements) {
		t.Fatalf("elements %d vs %d", len(marked.Elements), len(plain.Elements))
	}
	a, _, err1 := image.Decode(bytes.NewReader(plain.Screenshot.Data))
	b, _, err2 := image.Decode(bytes.NewReader(marked.Screenshot.Data))
	if err1 != nil || err2 != nil || a.Bounds() != b.Bounds() {
		t.Fatalf("decode: %v %v", err1, err2)
	}
	e := marked.Elements[0]
	x, y := int(e.BBox[0]), int(e.BBox[1]+e.BBox[3]/2) // on the left edge of the box
	if a.At(x, y) == b.At(x, y) {
		t.Errorf("no outline at (%d,%d) for element %+v", x, y, e)
	}
}

func TestTabCrashIsClassifiedAndRecovered(t *testing.T) {
	s := openPage(t, "/basic.html")
	tb, _ := s.activeTab(ctxT(t))
	crash(t, tb)
	deadline := time.Now().Add(10 * time.Second)
	for !tb.isCrashed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if e := failCode(t, s, Action{Type: ActClick, Selector: "#b1"}); e.Code != faults.CodeBrowserTabCrashed || !e.Retryable {
		t.Errorf("action on a crashed tab: %+v", *e)
	}
	if _, err := s.Observe(ctxT(t), ObserveOptions{}); !faults.Is(err, faults.CodeBrowserTabCrashed) {
		t.Errorf("observe on a crashed tab: %v", err)
	}
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/basic.html"}, Action{Type: ActClick, Selector: "#b1"})
	if got := js[[]string](t, s, "window.clicks"); len(got) != 1 {
		t.Errorf("after revival clicks %v", got)
	}
}

func TestHistory(t *testing.T) {
	s := openPage(t, "/basic.html")
	mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/form.html"}, Action{Type: ActBack})
	if u := observe(t, s, ObserveOptions{Screenshot: "none"}).URL; !strings.HasSuffix(u, "/basic.html") {
		t.Errorf("after back %s", u)
	}
	mustDo(t, s, Action{Type: ActForward}, Action{Type: ActReload})
	if u := observe(t, s, ObserveOptions{Screenshot: "none"}).URL; !strings.HasSuffix(u, "/form.html") {
		t.Errorf("after forward %s", u)
	}
	mustDo(t, s, Action{Type: ActWait, Until: "networkidle", MS: 2000}, Action{Type: ActWait, MS: 10}, Action{Type: ActAnswer, Text: "42"})
	if a, ok := s.Answer(); !ok || a != "42" {
		t.Errorf("answer %q %v", a, ok)
	}
	if e := failCode(t, s, Action{Type: ActForward}); e.Code != faults.CodeNavigationNoHistory {
		t.Errorf("forward at the end: %s", e.Code)
	}
}

// The settle wait lets a click's delayed fetch land before Do returns.
func TestSettleWaitsForFollowUpWork(t *testing.T) {
	s := openPage(t, "/slowfetch.html")
	mustDo(t, s, Action{Type: ActClick, Selector: "#go"})
	if got := js[string](t, s, "document.getElementById('out').textContent"); got != "done" {
		t.Errorf("after the click settled: %q, want done", got)
	}
}

func TestActionJSON(t *testing.T) {
	var r Request
	body := `{"actions":[{"type":"drag","path":[[1,2],[3,4]]},{"type":"upload_file","selector":"#f","path":"/tmp/x"},{"type":"click","element":3,"button":"right"}],"observe":{"screenshot":"jpeg","width":640,"som":true},"frame":7,"strict":true}`
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	l := r.List()
	if len(l) != 3 || l[0].Points[1] != [2]float64{3, 4} || l[1].File != "/tmp/x" || *l[2].Element != 3 || *l[2].Frame != 7 || !l[2].Strict {
		t.Fatalf("decoded %+v", l)
	}
	if r.Observe.Width != 640 || !r.Observe.SOM {
		t.Errorf("observe %+v", *r.Observe)
	}
	b, _ := json.Marshal(l[0])
	if !strings.Contains(string(b), `"path":[[1,2],[3,4]]`) {
		t.Errorf("marshal drag: %s", b)
	}
	b, _ = json.Marshal(l[1])
	if !strings.Contains(string(b), `"path":"/tmp/x"`) {
		t.Errorf("marshal upload: %s", b)
	}
	obs, _ := json.Marshal(Observation{Screenshot: &Screenshot{Format: "png", Data: []byte{1, 2}}, Elements: []Element{{ID: 1, Role: "button", BBox: [4]float64{1, 2, 3, 4}}}})
	for _, want := range []string{`"data":"AQI="`, `"bbox":[1,2,3,4]`, `"downloads":null`, `"frame":0`, `"scale":0`} {
		if !strings.Contains(string(obs), want) {
			t.Errorf("observation JSON lacks %s: %s", want, obs)
		}
	}
}

// Observations run while actions run on the same tab.
func TestConcurrentObserveDuringActions(t *testing.T) {
	s := openPage(t, "/basic.html")
	done := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < 5 && err == nil; i++ {
			_, err = s.Observe(ctxT(t), ObserveOptions{Screenshot: "jpeg", SOM: true, Width: 640})
		}
		done <- err
	}()
	for i := 0; i < 5; i++ {
		mustDo(t, s, Action{Type: ActClick, Selector: "#b1"})
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := js[[]string](t, s, "window.clicks"); len(got) != 5 {
		t.Errorf("clicks %v, want 5", got)
	}
}

// A link whose text wraps: its box's centre falls between the two line
// fragments, on the container; the click must land on the link's text.
func TestClickWrappedLink(t *testing.T) {
	s := openPage(t, "/wrap.html")
	if hit := js[string](t, s, `(function(){var r=document.getElementById('wrap').getBoundingClientRect();
var e=document.elementFromPoint(r.left+r.width/2, r.top+r.height/2); return e ? e.id : ''})()`); hit == "wrap" {
		t.Fatalf("the test page does not put the link's box centre off its text (hit %q)", hit)
	}
	mustDo(t, s, Action{Type: ActClick, Selector: "#wrap"})
	if got := js[string](t, s, "location.hash"); got != "#wrapped" {
		t.Errorf("after clicking the wrapped link: hash %q, missed %v", got, js[int](t, s, "window.missed || 0"))
	}
}

// A click moves the pointer first: the page sees mousemove at the point,
// then mousedown, mouseup and click there — in that order, although the
// move is not waited for.
func TestClickMovesFirst(t *testing.T) {
	s := openPage(t, "/events.html")
	// Old-headless Chromium (chromium-headless-shell) sends the page a
	// synthetic mousemove at the cursor's start, (0,0), once it is laid out.
	js[[]string](t, s, "window.events.splice(0)")
	for _, p := range [][2]float64{{100, 100}, {300, 250}, {50, 300}} {
		mustDo(t, s, Action{Type: ActClick, X: fptr(p[0]), Y: fptr(p[1])})
		at := fmt.Sprintf("@%g,%g", p[0], p[1])
		got := js[[]string](t, s, "window.events.splice(0)")
		want := []string{"mousemove" + at, "mousedown" + at, "mouseup" + at, "click" + at}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("click at %v: events %v, want %v", p, got, want)
		}
	}
}
