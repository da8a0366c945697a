package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// pendingSite serves the pages of the settle tests: a button #b whose
// click handler is the case's script, and #out for what it writes.
func pendingSite(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/fast":
			fmt.Fprint(w, "fetched")
			return
		case "/other":
			fmt.Fprint(w, `<title>Other</title><p id="out">other page</p>`)
			return
		case "/frame":
			fmt.Fprint(w, `<p>framed</p>`)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<title>Case</title><script>%s</script><button id="b" onclick="%s">go</button><p id="out">before</p><a id="link" href="/other">other</a>%s`,
			r.URL.Query().Get("page"), strings.ReplaceAll(r.URL.Query().Get("click"), `"`, "&quot;"), r.URL.Query().Get("body"))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func lastSettle(t *testing.T, s *Session) string {
	t.Helper()
	tb, err := s.activeTab(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.lastSettle
}

// After a click the wait ends as soon as nothing the page scheduled is
// left, within the idle window when nothing is, and keeps to its windows
// where it cannot see (a frame of another origin) or where work is always
// pending (a page that polls).
func TestSettleFollowsPendingWork(t *testing.T) {
	srv := pendingSite(t)
	// Another origin for the same server: its frames cannot be looked into.
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	otherOrigin := "http://localhost:" + port
	out := "document.getElementById('out').textContent=%s"
	cases := []struct {
		name, page, click, body string
		want                    string // #out afterwards, or the title when it starts with "title:"
		how                     string // why the wait ended; "" for any, "windows" for idle or quiet
	}{
		{name: "synchronous change", click: fmt.Sprintf(out, "'now'"), want: "now", how: "nothing pending"},
		{name: "click with no effect", click: "", want: "before", how: "nothing pending"},
		{name: "timer", click: "setTimeout(function(){" + fmt.Sprintf(out, "'late'") + "},60)", want: "late", how: "nothing pending"},
		{name: "chained timers", click: "setTimeout(function(){setTimeout(function(){" + fmt.Sprintf(out, "'chained'") + "},30)},30)", want: "chained", how: "nothing pending"},
		{name: "animation frames", click: "requestAnimationFrame(function(){requestAnimationFrame(function(){" + fmt.Sprintf(out, "'drawn'") + "})})", want: "drawn", how: "nothing pending"},
		{name: "cleared timer", click: "clearTimeout(setTimeout(function(){" + fmt.Sprintf(out, "'never'") + "},50))", want: "before", how: "nothing pending"},
		{name: "fetch then change", click: "fetch('/fast').then(function(r){return r.text()}).then(function(x){" + fmt.Sprintf(out, "x") + "})", want: "fetched", how: "windows"},
		{name: "timer then fetch", click: "setTimeout(function(){fetch('/fast').then(function(r){return r.text()}).then(function(x){" + fmt.Sprintf(out, "x") + "})},30)", want: "fetched", how: "windows"},
		{name: "navigation from a timer", click: "setTimeout(function(){location.href='/other'},20)", want: "title:Other"},
		{name: "same-document navigation", click: "history.pushState({},'','#moved');" + fmt.Sprintf(out, "location.hash"), want: "#moved", how: "nothing pending"},
		{name: "page that polls", page: "(function poll(){setTimeout(poll,40)})()", click: fmt.Sprintf(out, "'now'"), want: "now", how: "idle"},
		{name: "cross-origin frame", body: `<iframe src="` + otherOrigin + `/frame"></iframe>`, click: fmt.Sprintf(out, "'now'"), want: "now", how: "idle"},
		{name: "blank frame", body: `<iframe></iframe>`, click: fmt.Sprintf(out, "'now'"), want: "now", how: "nothing pending"},
		{name: "frame written by script", body: `<iframe id="w"></iframe><script>var d=document.getElementById('w').contentDocument;d.open();d.write('<p>written</p>');d.close()</script>`, click: fmt.Sprintf(out, "'now'"), want: "now", how: "nothing pending"},
		{name: "same-origin frame", body: `<iframe src="/frame"></iframe>`, click: fmt.Sprintf(out, "'now'"), want: "now", how: "nothing pending"},
	}
	s := openPage(t, "/basic.html")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := srv.URL + "/?page=" + urlQuery(c.page) + "&click=" + urlQuery(c.click) + "&body=" + urlQuery(c.body)
			mustDo(t, s, Action{Type: ActNavigate, URL: u})
			mustDo(t, s, Action{Type: ActClick, Selector: "#b"})
			if title, ok := strings.CutPrefix(c.want, "title:"); ok {
				if got := js[string](t, s, "document.title"); got != title {
					t.Errorf("title %q after the click, want %q", got, title)
				}
			} else if got := js[string](t, s, "document.getElementById('out').textContent"); got != c.want {
				t.Errorf("#out %q after the click, want %q", got, c.want)
			}
			switch got := lastSettle(t, s); c.how {
			case "":
			case "windows": // a request was seen: the rest of the wait keeps to them
				if got != `"idle"` && got != `"quiet"` {
					t.Errorf("the wait ended with %s, want the idle or quiet window", got)
				}
			default:
				if got != `"`+c.how+`"` {
					t.Errorf("the wait ended with %s, want %q", got, c.how)
				}
			}
		})
	}
}

func urlQuery(s string) string {
	r := strings.NewReplacer("%", "%25", "&", "%26", "+", "%2B", "#", "%23", " ", "%20", "=", "%3D", "?", "%3F", ";", "%3B")
	return r.Replace(s)
}

// The tracker's wrappers behave as the functions they wrap: the same
// results, errors, arguments and receivers as in a browser without it.
func TestPendingTrackerTransparent(t *testing.T) {
	path := testenv.RequireChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plain, err := Launch(ctx, Options{ExecPath: path, DownloadDir: t.TempDir(), PlainSettle: true})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	defer plain.Close()
	tracked := openPage(t, "/basic.html")
	mustDo(t, plain, Action{Type: ActNavigate, URL: site.URL + "/basic.html"})

	const battery = `(async () => {
  const r = {};
  const later = (ms) => new Promise((res) => setTimeout(res, ms));
  r.names = [setTimeout.name, clearTimeout.name, requestAnimationFrame.name, cancelAnimationFrame.name];
  r.lengths = [setTimeout.length, clearTimeout.length, requestAnimationFrame.length, cancelAnimationFrame.length];
  r.names.push(setInterval.name);
  r.lengths.push(setInterval.length);
  r.interval = await new Promise((res) => { const id = setInterval(function (a) { clearInterval(id); res([a, this === window, typeof id]); }, 1, "y"); });
  r.intervalString = await new Promise((res) => { window.__ires = res; const id = setInterval("clearInterval(window.__iid); window.__ires('interval from a string')", 1); window.__iid = id; });
  r.keys = Object.keys(window).length;
  r.descriptor = JSON.stringify(Object.getOwnPropertyDescriptor(window, "setTimeout"), (k, v) => typeof v === "function" ? "fn" : v);
  r.args = await new Promise((res) => setTimeout(function (a, b) { res([a, b, this === window]); }, 1, "x", 2));
  r.fromString = await new Promise((res) => { window.__res = res; setTimeout("window.__res('from a string')", 1); });
  let ran = false;
  clearTimeout(setTimeout(() => { ran = true; }, 1));
  clearTimeout();
  clearTimeout("nonsense");
  await later(30);
  r.clearedRan = ran;
  r.idType = typeof setTimeout(() => {}, 0);
  r.idsGrow = setTimeout(() => {}, 0) < setTimeout(() => {}, 0);
  r.rafArg = await new Promise((res) => requestAnimationFrame((ts) => res(typeof ts)));
  let drawn = false;
  cancelAnimationFrame(requestAnimationFrame(() => { drawn = true; }));
  await later(60);
  r.cancelledDrawn = drawn;
  const err = (f) => { try { f(); return "no error"; } catch (e) { return e.constructor.name + ": " + e.message; } };
  r.badReceiver = err(() => setTimeout.call({}, () => {}));
  r.badCallback = err(() => requestAnimationFrame(5));
  r.unboundOK = err(() => { const st = setTimeout; st(() => {}, 0); });
  r.thrown = await new Promise((res) => {
    window.onerror = (m) => { res(String(m)); window.onerror = null; return true; };
    setTimeout(() => { throw new Error("boom"); }, 0);
  });
  r.negative = await new Promise((res) => setTimeout(() => res("ran"), -5));
  r.infinite = await new Promise((res) => setTimeout(() => res("ran"), Infinity));
  r.huge = await new Promise((res) => setTimeout(() => res("ran"), 2 ** 32 + 1));
  let calls = 0;
  await new Promise((res) => setTimeout(res, { valueOf() { calls++; return 1; } }));
  r.valueOfCalls = calls;
  r.returned = await new Promise((res) => setTimeout(() => res(typeof setTimeout(() => 7)), 0));
  return r;
})()`
	run := func(s *Session) map[string]any {
		t.Helper()
		tb, err := s.activeTab(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := tb.eval(ctxT(t), battery, true, 20*time.Second)
		if err != nil {
			t.Fatalf("battery: %v", err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("decode %s: %v", raw, err)
		}
		return m
	}
	want, got := run(plain), run(tracked)
	if fmt.Sprint(want["args"]) != "[x 2 true]" || want["badReceiver"] == "no error" || want["clearedRan"] != false {
		t.Fatalf("the plain browser's own results are not what the battery expects: %v", want)
	}
	if !js[bool](t, tracked, "!!window[Symbol.for('orchard.pending')]") {
		t.Fatal("the tracker is not installed in the tracked session")
	}
	for k, w := range want {
		if !reflect.DeepEqual(got[k], w) {
			t.Errorf("%s: with the tracker %v, without %v", k, got[k], w)
		}
	}
}
