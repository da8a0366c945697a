package browser

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/sites"
)

// stateSite serves the bundled sites with a sign-in in front of
// /account: the session lives on the server, the browser holds only its
// id in an HttpOnly session cookie. The bundled sites have no sign-in of
// their own (they are static), so the test adds one.
type stateSite struct {
	*httptest.Server
	mu       sync.Mutex // guards sessions
	sessions map[string]string
	// loginGets counts GET /login: stub history entries must not reach it.
	loginGets atomic.Int64
}

func newStateSite(t testing.TB) *stateSite {
	ss := &stateSite{sessions: map[string]string{}}
	mux := http.NewServeMux()
	mux.Handle("/", sites.Handler())
	mux.HandleFunc("GET /login", func(w http.ResponseWriter, r *http.Request) {
		ss.loginGets.Add(1)
		fmt.Fprint(w, `<!doctype html><title>Sign in</title><form method="post" action="/login">
<input id="user" name="user"><input id="password" name="password" type="password"><button id="go">Sign in</button></form>`)
	})
	mux.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("user") != "alice" || r.FormValue("password") != "secret" {
			http.Error(w, "wrong password", http.StatusUnauthorized)
			return
		}
		b := make([]byte, 16)
		rand.Read(b)
		id := hex.EncodeToString(b)
		ss.mu.Lock()
		ss.sessions[id] = "alice"
		ss.mu.Unlock()
		http.SetCookie(w, &http.Cookie{Name: "sid", Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
		http.Redirect(w, r, "/account", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /account", func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie("sid")
		ss.mu.Lock()
		user := ""
		if err == nil {
			user = ss.sessions[c.Value]
		}
		ss.mu.Unlock()
		if user == "" {
			http.Redirect(w, r, "/login", http.StatusFound)
			return
		}
		fmt.Fprintf(w, `<!doctype html><title>Account</title><h1 id="who">Signed in as %s</h1>
<div id="box" style="height:100px;overflow:auto"><div style="height:1000px">inner</div></div>
<div style="height:5000px">long</div>`, user)
	})
	ss.Server = httptest.NewServer(mux)
	t.Cleanup(ss.Close)
	return ss
}

// freshSession launches a browser of the test's own with a new profile.
func freshSession(t testing.TB) *Session {
	t.Helper()
	path := testenv.RequireChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Launch(ctx, Options{ExecPath: path, DownloadDir: t.TempDir()})
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// awaitJS is js for an expression whose promise it awaits.
func awaitJS[T any](t testing.TB, s *Session, expr string) T {
	t.Helper()
	var v T
	tb, err := s.activeTab(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.evalInto(ctxT(t), expr, true, 10*time.Second, &v); err != nil {
		t.Fatalf("eval %s: %v", expr, err)
	}
	return v
}

// stateSetupJS fills the account page's storage: localStorage,
// sessionStorage, and IndexedDB with JSON records and a Blob.
const stateSetupJS = `(async function(){
localStorage.setItem('theme','dark'); localStorage.setItem('lang','en');
sessionStorage.setItem('draft','tab0');
var open = indexedDB.open('notes', 3);
open.onupgradeneeded = function(){ var db = open.result;
  var items = db.createObjectStore('items', {keyPath: 'id'}); items.createIndex('by_title', 'title', {unique: false});
  db.createObjectStore('loose', {autoIncrement: true}); };
var db = await new Promise(function(res, rej){ open.onsuccess = function(){ res(open.result) }; open.onerror = rej; });
await new Promise(function(res, rej){ var tx = db.transaction(['items','loose'], 'readwrite');
  tx.objectStore('items').put({id: 1, title: 'first', tags: ['a','b']});
  tx.objectStore('items').put({id: 2, title: 'second', n: 2.5, nested: {ok: true}});
  tx.objectStore('loose').put({kept: 'yes'}, 'k1');
  tx.objectStore('loose').put(new Blob(['binary']), 'blob1');
  tx.oncomplete = res; tx.onerror = rej; });
db.close(); return true })()`

// stateReadJS reads back what stateSetupJS wrote but the Blob, which
// the state cannot carry.
const stateReadJS = `(async function(){
var db = await new Promise(function(res, rej){ var o = indexedDB.open('notes'); o.onsuccess = function(){ res(o.result) }; o.onerror = rej; });
function all(name){ return new Promise(function(res){ var out = []; var c = db.transaction(name).objectStore(name).openCursor();
  c.onsuccess = function(){ var cur = c.result; if(!cur) return res(out); if(!(cur.value instanceof Blob)) out.push([cur.primaryKey, cur.value]); cur.continue(); }; }); }
var r = {version: db.version, items: await all('items'), loose: await all('loose'),
  index: Array.from(db.transaction('items').objectStore('items').indexNames),
  local: {theme: localStorage.getItem('theme'), lang: localStorage.getItem('lang')}, session: sessionStorage.getItem('draft')};
db.close(); return JSON.stringify(r) })()`

// prepareSource signs in on tab 0 and leaves it scrolled with storage
// filled; tab 1 shows the shop's checkout with a name typed, not
// submitted, and the caret in it. Tab 0 is active.
func prepareSource(t testing.TB, s *Session, site *stateSite) {
	t.Helper()
	mustDo(t, s,
		Action{Type: ActNavigate, URL: site.URL + "/login"},
		Action{Type: ActType, Selector: "#user", Text: "alice"},
		Action{Type: ActType, Selector: "#password", Text: "secret"},
		Action{Type: ActClick, Selector: "#go"},
	)
	if got := js[string](t, s, `document.getElementById('who') ? document.getElementById('who').textContent : location.href`); got != "Signed in as alice" {
		t.Fatalf("sign-in: got %q", got)
	}
	awaitJS[bool](t, s, stateSetupJS)
	js[bool](t, s, `document.getElementById('box').scrollTop = 230; window.scrollTo(0, 1234); true`)
	mustDo(t, s,
		Action{Type: ActNewTab, URL: site.URL + "/shop/index.html"},
		Action{Type: ActNavigate, URL: site.URL + "/shop/checkout.html"},
		Action{Type: ActType, Selector: "#name", Text: "Ada Lovelace"},
		Action{Type: ActClick, Selector: "#ship-express"},
	)
	js[bool](t, s, `sessionStorage.setItem('draft','tab1'); var n = document.getElementById('name'); n.focus(); n.setSelectionRange(3, 5); true`)
	mustDo(t, s, Action{Type: ActSwitchTab, Index: iptr(0)})
}

func TestStateRoundTrip(t *testing.T) {
	site := newStateSite(t)
	src := freshSession(t)
	prepareSource(t, src, site)
	ctx := ctxT(t)

	st, err := src.ExportState(ctx)
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	wire, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("state: %d bytes: %s", len(wire), wire)
	var got api.BrowserState
	if err := json.Unmarshal(wire, &got); err != nil {
		t.Fatal(err)
	}
	var blob bool
	for _, sk := range got.Skipped {
		if sk.Kind == "indexeddb_record" && sk.Store == "loose" && string(sk.Key) == `"blob1"` && strings.Contains(sk.Reason, "Blob") {
			blob = true
		}
	}
	if !blob {
		t.Errorf("skipped = %+v, want the Blob record of store loose", got.Skipped)
	}
	if !slices.ContainsFunc(got.Cookies, func(c api.StateCookie) bool { return c.Name == "sid" && c.HTTPOnly && c.Session }) {
		t.Errorf("cookies = %+v, want the HttpOnly session cookie sid", got.Cookies)
	}

	dst := freshSession(t)
	// Tabs the destination had before are replaced.
	mustDo(t, dst,
		Action{Type: ActNavigate, URL: site.URL + "/wiki/index.html"},
		Action{Type: ActNewTab, URL: site.URL + "/recipes/index.html"},
		Action{Type: ActNewTab, URL: site.URL + "/travel/index.html"},
	)
	js[string](t, dst, `document.cookie = "before=1; path=/"`)
	for _, tc := range []struct {
		name     string
		mutate   func(*api.BrowserState)
		code     string
		category faults.Category
	}{
		{"version", func(s *api.BrowserState) { s.Version = 99 }, faults.CodeValidation, faults.InvalidRequest},
		{"active tab", func(s *api.BrowserState) { s.ActiveTab = 7 }, faults.CodeValidation, faults.InvalidRequest},
		{"current index", func(s *api.BrowserState) { s.Tabs[0].CurrentIndex = 40 }, faults.CodeValidation, faults.InvalidRequest},
		{"javascript url", func(s *api.BrowserState) { s.Tabs[1].URL = "javascript:alert(1)" }, faults.CodeValidation, faults.InvalidRequest},
		{"origin", func(s *api.BrowserState) { s.Origins = append(s.Origins, api.OriginState{Origin: "not an origin"}) }, faults.CodeValidation, faults.InvalidRequest},
		{"field kind", func(s *api.BrowserState) {
			s.Tabs[1].Fields = append(s.Tabs[1].Fields, api.FieldValue{Selector: "#x", Kind: "bogus"})
		}, faults.CodeValidation, faults.InvalidRequest},
		{"cookie", func(s *api.BrowserState) {
			s.Cookies = append(s.Cookies, api.StateCookie{Name: "bad;name", Value: "v", Domain: "127.0.0.1", Path: "/"})
		}, faults.CodeValidation, faults.InvalidRequest},
		{"too large", func(s *api.BrowserState) {
			s.Origins = append(s.Origins, api.OriginState{Origin: "http://big.test", LocalStorage: map[string]string{"k": strings.Repeat("x", api.MaxBrowserStateBytes)}})
		}, faults.CodeBrowserStateTooLarge, faults.TooLarge},
	} {
		t.Run("invalid/"+tc.name, func(t *testing.T) {
			var bad api.BrowserState
			if err := json.Unmarshal(wire, &bad); err != nil {
				t.Fatal(err)
			}
			tc.mutate(&bad)
			err := dst.ImportState(ctx, bad)
			f := faults.Of(err)
			if err == nil || f.Code != tc.code || f.Category != tc.category {
				t.Fatalf("import: got %v (%s, %s), want %s, %s", err, f.Code, f.Category, tc.code, tc.category)
			}
			if n := len(dst.Tabs()); n != 3 {
				t.Fatalf("a refused import changed the tabs: %d open", n)
			}
			if c := js[string](t, dst, "document.cookie"); c != "before=1" {
				t.Fatalf("a refused import changed the cookies: %q", c)
			}
		})
	}

	gets := site.loginGets.Load()
	if err := dst.ImportState(ctx, got); err != nil {
		t.Fatalf("import: %v", err)
	}
	if n := site.loginGets.Load() - gets; n != 0 {
		t.Errorf("import asked the site for /login %d times; history entries before the current page must not load", n)
	}

	want, have := src.Tabs(), dst.Tabs()
	if len(have) != len(want) {
		t.Fatalf("tabs: got %+v, want %+v", have, want)
	}
	for i := range want {
		if have[i].URL != want[i].URL || have[i].Active != want[i].Active {
			t.Errorf("tab %d: got %+v, want %+v", i, have[i], want[i])
		}
	}

	// Tab 0: signed in (the server found its session), scrolled, storage.
	if got := js[string](t, dst, `document.getElementById('who') ? document.getElementById('who').textContent : location.href`); got != "Signed in as alice" {
		t.Errorf("after import: %q, want still signed in", got)
	}
	if c := js[string](t, dst, "document.cookie"); c != "" {
		t.Errorf("cookies the state does not have survived the import: %q", c)
	}
	if got := js[[]float64](t, dst, `[scrollY, document.getElementById('box').scrollTop]`); !slices.Equal(got, []float64{1234, 230}) {
		t.Errorf("scroll (window, box) = %v, want [1234 230]", got)
	}
	mustDo(t, src, Action{Type: ActSwitchTab, Index: iptr(0)})
	wantStore := awaitJS[string](t, src, stateReadJS)
	if gotStore := awaitJS[string](t, dst, stateReadJS); gotStore != wantStore {
		t.Errorf("storage:\n got %s\nwant %s", gotStore, wantStore)
	}
	if !strings.Contains(wantStore, `"session":"tab0"`) || !strings.Contains(wantStore, `[1,{"id":1`) {
		t.Fatalf("the source's storage is not what the test wrote: %s", wantStore)
	}

	// Tab 1: the typed name, the radio button, focus and caret, and its
	// own sessionStorage.
	mustDo(t, dst, Action{Type: ActSwitchTab, Index: iptr(1)})
	type form struct {
		Name    string `json:"name"`
		Express bool   `json:"express"`
		Focus   string `json:"focus"`
		Start   int    `json:"start"`
		End     int    `json:"end"`
		Session string `json:"session"`
	}
	readForm := `(function(){var n=document.getElementById('name');return {name:n.value, express:document.getElementById('ship-express').checked,
focus:document.activeElement&&document.activeElement.id, start:n.selectionStart, end:n.selectionEnd, session:sessionStorage.getItem('draft')}})()`
	wantForm := form{Name: "Ada Lovelace", Express: true, Focus: "name", Start: 3, End: 5, Session: "tab1"}
	if got := js[form](t, dst, readForm); got != wantForm {
		t.Errorf("form: got %+v, want %+v", got, wantForm)
	}

	// History: back goes to the real previous page of each tab.
	mustDo(t, dst, Action{Type: ActBack})
	if got := js[string](t, dst, `location.pathname + ' ' + !!document.querySelector('h1')`); got != "/shop/ true" {
		t.Errorf("tab 1 back: got %q, want the shop's front page", got)
	}
	mustDo(t, dst, Action{Type: ActSwitchTab, Index: iptr(0)}, Action{Type: ActBack})
	if got := js[string](t, dst, `location.pathname + ' ' + !!document.getElementById('user')`); got != "/login true" {
		t.Errorf("tab 0 back: got %q, want the sign-in page", got)
	}
}

// TestStateImportIntoBlank imports a state with no storage and one tab on
// a page into a session: its tabs are replaced by the state's one.
func TestStateImportIntoBlank(t *testing.T) {
	s := freshSession(t)
	mustDo(t, s, Action{Type: ActNewTab, URL: site.URL + "/"})
	st := api.BrowserState{Version: api.BrowserStateVersion, Tabs: []api.TabState{{URL: "about:blank"}}}
	if err := s.ImportState(ctxT(t), st); err != nil {
		t.Fatal(err)
	}
	tabs := s.Tabs()
	if len(tabs) != 1 || tabs[0].URL != "about:blank" || !tabs[0].Active {
		t.Fatalf("tabs = %+v, want one blank active tab", tabs)
	}
}

// BenchmarkStateExportImport measures ExportState on a signed-in browser
// with two tabs and storage, and ImportState of its state into another
// browser that shows one blank tab, as a fork's fresh browser does (it is
// reset to that, untimed, before each import).
func BenchmarkStateExportImport(b *testing.B) {
	site := newStateSite(b)
	src, dst := freshSession(b), freshSession(b)
	prepareSource(b, src, site)
	ctx := ctxT(b)
	blank := api.BrowserState{Version: api.BrowserStateVersion, Tabs: []api.TabState{{URL: "about:blank"}}}
	var exp, imp []time.Duration
	for b.Loop() {
		b.StopTimer()
		if err := dst.ImportState(ctx, blank); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		st, err := src.ExportState(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := dst.ImportState(ctx, st); err != nil {
			b.Fatal(err)
		}
		exp, imp = append(exp, t1.Sub(t0)), append(imp, time.Since(t1))
	}
	if got := dst.Tabs(); len(got) != 2 || got[0].URL != site.URL+"/account" {
		b.Fatalf("tabs after the last import: %+v", got)
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(p50(exp), "export-ms/p50")
	b.ReportMetric(p50(imp), "import-ms/p50")
}
