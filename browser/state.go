package browser

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/storage"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"golang.org/x/sync/errgroup"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

//go:embed state_export.js
var stateExportJS string

//go:embed state_import.js
var stateImportJS string

//go:embed state_view.js
var stateViewJS string

// Bounds of a state's tabs on import. History beyond them is dropped:
// each entry costs a (stub) navigation, and an agent rarely goes back
// further than a few pages.
const (
	// maxStateTabs: more tabs than any agent keeps open.
	maxStateTabs = 64
	// maxHistoryBack is how many entries before the current one a tab
	// gets back; maxHistoryForward, after it.
	maxHistoryBack    = 9
	maxHistoryForward = 5
	// maxStateHistory bounds a tab's history in a state given to import.
	maxStateHistory = 1000
)

// stateEvalTimeout bounds the page script that reads or writes one tab's
// state: IndexedDB of many megabytes takes seconds to walk.
const stateEvalTimeout = 30 * time.Second

// ExportState returns the browser's state: its cookies, the storage of
// the origins its tabs show, and each tab's history, scroll, changed form
// fields and focus. A tab whose page cannot run scripts (a dialog is
// open, its renderer crashed) keeps only its history.
func (s *Session) ExportState(ctx context.Context) (api.BrowserState, error) {
	st := api.BrowserState{Version: api.BrowserStateVersion, Cookies: []api.StateCookie{}, Origins: []api.OriginState{}, Tabs: []api.TabState{}}
	if err := s.Err(); err != nil {
		return st, err
	}
	s.mu.Lock()
	tabs := slices.Clone(s.tabs)
	for i, t := range tabs {
		if t == s.active {
			st.ActiveTab = i
		}
	}
	s.mu.Unlock()

	cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	cs, err := cdp.Call(cctx, s.b, storage.GetCookies, storage.GetCookiesParams{})
	cancel()
	if err != nil {
		return st, s.classify(cctx, nil, "export state: get cookies", err)
	}
	for _, c := range cs.Cookies {
		st.Cookies = append(st.Cookies, cookieOf(c))
	}
	budget := api.MaxBrowserStateBytes
	seen := map[string]bool{}
	for i, t := range tabs {
		if err := t.waitReady(ctx); err != nil {
			return st, err
		}
		ts, err := s.exportTab(ctx, t, i, seen, budget, &st)
		if err != nil {
			return st, err
		}
		st.Tabs = append(st.Tabs, ts)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return st, faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Browser, "export state: encode")
	}
	if len(b) > api.MaxBrowserStateBytes {
		return st, errStateTooLarge(faults.Browser, len(b))
	}
	return st, nil
}

func errStateTooLarge(src faults.Source, n int) *faults.Error {
	what := "the browser's state"
	if src == faults.Client {
		what = "the state to import"
	}
	if n > 0 {
		return faults.Newf(faults.CodeBrowserStateTooLarge, faults.TooLarge, src, "%s is %d bytes as JSON, over the %d a snapshot carries", what, n, api.MaxBrowserStateBytes)
	}
	return faults.Newf(faults.CodeBrowserStateTooLarge, faults.TooLarge, src, "%s exceeds the %d bytes a snapshot carries", what, api.MaxBrowserStateBytes)
}

// tabPageState is what state_export.js returns.
type tabPageState struct {
	Origin   string              `json:"origin"`
	Scroll   api.ScrollPosition  `json:"scroll"`
	Scrolled []api.ElementScroll `json:"scrolled"`
	Fields   []api.FieldValue    `json:"fields"`
	Focus    *api.FocusState     `json:"focus"`
	Session  map[string]string   `json:"session"`
	Local    map[string]string   `json:"local"`
	IDB      []api.IDBDatabase   `json:"idb"`
	Skipped  []api.StateSkip     `json:"skipped"`
	TooLarge bool                `json:"too_large"`
}

// exportTab reads one tab: its history from the browser, the rest from
// its page. The first tab on an origin also reports the origin's storage
// into st.
func (s *Session) exportTab(ctx context.Context, t *tab, i int, seen map[string]bool, budget int, st *api.BrowserState) (api.TabState, error) {
	t.mu.Lock()
	ts := api.TabState{URL: t.url, Title: t.title, History: []api.HistoryEntry{}}
	t.mu.Unlock()
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout, errDialogOpen, errTabCrashed)
	h, err := cdp.Call(cctx, t.target, page.GetNavigationHistory, cdp.Empty{})
	cancel()
	if err != nil {
		return ts, s.classify(cctx, t, "export state: history", err)
	}
	for _, e := range h.Entries {
		ts.History = append(ts.History, api.HistoryEntry{URL: e.URL, Title: e.Title})
	}
	ts.CurrentIndex = int(h.CurrentIndex)
	if ts.CurrentIndex >= 0 && ts.CurrentIndex < len(ts.History) {
		cur := ts.History[ts.CurrentIndex]
		ts.URL = cur.URL
		if cur.Title != "" {
			ts.Title = cur.Title // the target's title lags behind the page's
		}
	}
	if t.openDialog() != nil || t.isCrashed() || !scriptable(ts.URL) {
		return ts, nil
	}
	origin := originOf(ts.URL)
	want := origin != "" && !seen[origin]
	var ps tabPageState
	expr := fmt.Sprintf("(%s)(%t,%d)", stateExportJS, want, budget)
	if err := t.evalInto(ctx, expr, true, stateEvalTimeout, &ps); err != nil {
		if _, ok := errors.AsType[*faults.Error](err); ok {
			return ts, err
		}
		return ts, faults.Wrap(err, faults.CodeBrowserProtocol, faults.Internal, faults.Browser, "export state: read tab "+fmt.Sprint(i))
	}
	if ps.TooLarge {
		return ts, errStateTooLarge(faults.Browser, 0)
	}
	ts.Scroll, ts.Scrolled, ts.Fields, ts.Focus = ps.Scroll, ps.Scrolled, ps.Fields, ps.Focus
	if len(ps.Session) > 0 && ps.Origin != "null" {
		ts.SessionStorage = map[string]map[string]string{ps.Origin: ps.Session}
	}
	for _, sk := range ps.Skipped {
		if sk.Kind == "form_field" {
			sk.Tab = new(i)
		}
		st.Skipped = append(st.Skipped, sk)
	}
	if want {
		seen[origin] = true
		if len(ps.Local) > 0 || len(ps.IDB) > 0 {
			st.Origins = append(st.Origins, api.OriginState{Origin: origin, LocalStorage: ps.Local, IndexedDB: ps.IDB})
		}
	}
	return ts, nil
}

// scriptable reports a URL whose page ExportState reads: one with an
// origin of its own.
func scriptable(u string) bool {
	return strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")
}

// originOf is u's origin (scheme://host[:port]), "" for a URL without one.
func originOf(u string) string {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return ""
	}
	return p.Scheme + "://" + p.Host
}

func cookieOf(c *network.Cookie) api.StateCookie {
	out := api.StateCookie{
		Name: c.Name, Value: c.Value, Domain: c.Domain, Path: c.Path,
		Session: c.Session, HTTPOnly: c.HTTPOnly, Secure: c.Secure,
		SameSite: string(c.SameSite), Priority: string(c.Priority),
		SourceScheme: string(c.SourceScheme), SourcePort: int(c.SourcePort),
	}
	if !c.Session {
		out.Expires = c.Expires
	}
	if c.PartitionKey != nil {
		out.PartitionKey = &api.CookiePartitionKey{TopLevelSite: c.PartitionKey.TopLevelSite, HasCrossSiteAncestor: c.PartitionKey.HasCrossSiteAncestor}
	}
	return out
}

// cookieParam is the parameter that sets c again. A host-only cookie
// (its domain without a leading dot) is set by URL: set by domain it
// would become a domain cookie, sent to subdomains too.
func cookieParam(c api.StateCookie) *network.CookieParam {
	p := &network.CookieParam{
		Name: c.Name, Value: c.Value, Path: c.Path, Secure: c.Secure, HTTPOnly: c.HTTPOnly,
		SameSite: network.CookieSameSite(c.SameSite), Priority: network.CookiePriority(c.Priority),
		SourceScheme: network.CookieSourceScheme(c.SourceScheme), SourcePort: int64(c.SourcePort),
	}
	if strings.HasPrefix(c.Domain, ".") {
		p.Domain = c.Domain
	} else {
		scheme := "http"
		if c.Secure || c.SourceScheme == string(network.CookieSourceSchemeSecure) {
			scheme = "https"
		}
		path := c.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		p.URL = scheme + "://" + c.Domain + path
	}
	if !c.Session && c.Expires > 0 {
		p.Expires = cdp.TimeSinceEpoch(c.Expires)
	}
	if c.PartitionKey != nil {
		p.PartitionKey = &network.CookiePartitionKey{TopLevelSite: c.PartitionKey.TopLevelSite, HasCrossSiteAncestor: c.PartitionKey.HasCrossSiteAncestor}
	}
	return p
}

// validateState checks a state given to import before anything changes.
func validateState(st api.BrowserState) error {
	bad := func(msg string, loc ...any) error {
		return faults.Validation(faults.FieldError{Type: "value_error", Loc: append([]any{"body"}, loc...), Msg: msg})
	}
	if st.Version != api.BrowserStateVersion {
		return bad(fmt.Sprintf("version must be %d", api.BrowserStateVersion), "version")
	}
	if len(st.Tabs) > maxStateTabs {
		return bad(fmt.Sprintf("at most %d tabs", maxStateTabs), "tabs")
	}
	if st.ActiveTab < 0 || (len(st.Tabs) > 0 && st.ActiveTab >= len(st.Tabs)) || (len(st.Tabs) == 0 && st.ActiveTab != 0) {
		return bad("active_tab must be the index of a tab", "active_tab")
	}
	for i, c := range st.Cookies {
		if c.Domain == "" || strings.Trim(c.Domain, ".") == "" {
			return bad("a cookie needs a domain", "cookies", i, "domain")
		}
		if strings.ContainsAny(c.Domain, "/:@ ") {
			return bad("a cookie's domain is a host name", "cookies", i, "domain")
		}
	}
	for i, o := range st.Origins {
		if originOf(o.Origin) != o.Origin {
			return bad("origin must be scheme://host[:port] with scheme http or https", "origins", i, "origin")
		}
		for j, d := range o.IndexedDB {
			for k, s := range d.Stores {
				if s.Name == "" {
					return bad("an object store needs a name", "origins", i, "indexed_db", j, "stores", k, "name")
				}
			}
		}
	}
	for i, t := range st.Tabs {
		if len(t.History) > maxStateHistory {
			return bad(fmt.Sprintf("at most %d history entries", maxStateHistory), "tabs", i, "history")
		}
		if len(t.History) > 0 && (t.CurrentIndex < 0 || t.CurrentIndex >= len(t.History)) {
			return bad("current_index must be the index of a history entry", "tabs", i, "current_index")
		}
		urls := []string{t.URL}
		for _, e := range t.History {
			urls = append(urls, e.URL)
		}
		for _, u := range urls {
			if u == "" {
				continue
			}
			p, err := url.Parse(u)
			if err != nil {
				return bad("invalid URL", "tabs", i, "url")
			}
			switch p.Scheme {
			case "http", "https", "about", "data", "file": // file: the sandbox's own files, which it can open anyway
			default:
				return bad(fmt.Sprintf("a tab's URL may not have scheme %q", p.Scheme), "tabs", i, "url")
			}
		}
		for j, f := range t.Fields {
			switch f.Kind {
			case "text", "checkbox", "radio", "select", "contenteditable":
			default:
				return bad("kind must be text, checkbox, radio, select or contenteditable", "tabs", i, "fields", j, "kind")
			}
			if f.Selector == "" {
				return bad("a field needs a selector", "tabs", i, "fields", j, "selector")
			}
		}
		for origin := range t.SessionStorage {
			if originOf(origin) != origin {
				return bad("session_storage is keyed by origin (scheme://host[:port])", "tabs", i, "session_storage")
			}
		}
	}
	return nil
}

// ImportState puts the browser in st: it replaces the cookies, the
// storage of st's origins and every open tab with st's. Tabs get their
// history back without asking the sites for the pages before and after
// the current one (stubNavigate); the current page loads from its site
// with the cookies and storage in place, then gets its scroll, form
// values and focus.
func (s *Session) ImportState(ctx context.Context, st api.BrowserState) error {
	if err := s.Err(); err != nil {
		return err
	}
	b, err := json.Marshal(st)
	if err != nil {
		return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "import state: encode")
	}
	if len(b) > api.MaxBrowserStateBytes {
		return errStateTooLarge(faults.Client, len(b))
	}
	if err := validateState(st); err != nil {
		return err
	}

	// Cookies first: the seeding and the pages below load with them.
	if err := s.replaceCookies(ctx, st.Cookies); err != nil {
		return err
	}

	plans := make([]tabPlan, len(st.Tabs))
	for i, ts := range st.Tabs {
		plans[i] = planTab(ts)
	}
	seed := newSeeder(st.Origins, plans)
	reuse, old := s.blankTabs(ctx, len(st.Tabs))

	// The storage, each tab and the closing of the old tabs go on at once:
	// most of their time is spent waiting for the browser (a new tab takes
	// tens of milliseconds to open, a page to load and settle), and only
	// the current pages must wait for the storage.
	n := max(len(st.Tabs), 1)
	tabs := make([]*tab, n)
	copy(tabs, reuse)
	var opened sync.WaitGroup
	opened.Add(n)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.seedOrigins(gctx, seed) })
	for i := range n {
		g.Go(func() error {
			if tabs[i] == nil {
				t, err := s.detachedTab(gctx)
				if err != nil {
					opened.Done()
					return err
				}
				tabs[i] = t
			}
			opened.Done()
			if i >= len(st.Tabs) {
				return nil
			}
			if err := s.restoreTab(gctx, tabs[i], st.Tabs[i], plans[i], seed); err != nil {
				return fmt.Errorf("import state: tab %d: %w", i, err)
			}
			return nil
		})
	}
	g.Go(func() error {
		// A browser keeps running without tabs only in headless mode:
		// close the old ones once the new ones are open.
		opened.Wait()
		if gctx.Err() != nil {
			return nil
		}
		return s.closeTabs(gctx, old)
	})
	if err := g.Wait(); err != nil {
		for _, t := range tabs[len(reuse):] {
			if t != nil {
				t.cancel()
			}
		}
		// The browser must keep a tab: the agent gets a blank one.
		if len(s.Tabs()) == 0 && s.Err() == nil {
			if _, oerr := s.openTab(context.WithoutCancel(ctx)); oerr != nil {
				s.log.Warn("import state: open a tab after a failed import", "error", oerr)
			}
		}
		return err
	}
	active := tabs[min(st.ActiveTab, n-1)]
	s.mu.Lock()
	// Tabs that pages opened meanwhile stay, after the state's.
	rest := slices.DeleteFunc(slices.Clone(s.tabs), func(t *tab) bool { return slices.Contains(tabs, t) })
	s.tabs = append(tabs, rest...)
	s.active, s.front = active, nil
	s.mu.Unlock()
	return s.toFront(ctx, active)
}

// replaceCookies replaces the browser's cookies with cs. A cookie the
// browser refuses leaves the cookies as they were.
func (s *Session) replaceCookies(ctx context.Context, cs []api.StateCookie) error {
	cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer cancel()
	before, err := cdp.Call(cctx, s.b, storage.GetCookies, storage.GetCookiesParams{})
	if err != nil {
		return s.classify(cctx, nil, "import state: get cookies", err)
	}
	set := func(cs []*network.CookieParam) error {
		if _, err := cdp.Call(cctx, s.b, storage.ClearCookies, storage.ClearCookiesParams{}); err != nil {
			return err
		}
		if len(cs) == 0 {
			return nil
		}
		_, err := cdp.Call(cctx, s.b, storage.SetCookies, storage.SetCookiesParams{Cookies: cs})
		return err
	}
	params := make([]*network.CookieParam, 0, len(cs))
	for _, c := range cs {
		params = append(params, cookieParam(c))
	}
	err = set(params)
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*cdproto.Error](err); !ok {
		return s.classify(cctx, nil, "import state: set cookies", err)
	}
	// The browser answered: it refused a cookie's fields.
	old := make([]*network.CookieParam, 0, len(before.Cookies))
	for _, c := range before.Cookies {
		old = append(old, cookieParam(cookieOf(c)))
	}
	if rerr := set(old); rerr != nil {
		s.log.Warn("import state: put the cookies back", "error", rerr)
	}
	return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "cookies"},
		Msg: "the browser refused a cookie: " + err.Error()})
}

// blankTabs splits the session's tabs into up to n blank ones, which a
// state's tabs may take over (opening a tab costs tens of milliseconds;
// a fresh browser has one blank tab), and the others, to be closed. A
// blank tab shows about:blank and has no history of its own.
func (s *Session) blankTabs(ctx context.Context, n int) (blank, others []*tab) {
	s.mu.Lock()
	all := slices.Clone(s.tabs)
	s.mu.Unlock()
	for _, t := range all {
		if len(blank) < n && s.isBlank(ctx, t) {
			blank = append(blank, t)
		} else {
			others = append(others, t)
		}
	}
	return blank, others
}

func (s *Session) isBlank(ctx context.Context, t *tab) bool {
	select {
	case <-t.ready:
		if t.readyErr != nil {
			return false
		}
	default:
		return false
	}
	if t.openDialog() != nil || t.isCrashed() {
		return false
	}
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	defer cancel()
	h, err := cdp.Call(cctx, t.target, page.GetNavigationHistory, cdp.Empty{})
	return err == nil && len(h.Entries) <= 1 && (len(h.Entries) == 0 || h.Entries[0].URL == "about:blank")
}

// detachedTab opens a blank tab that is not (yet) one of the session's:
// actions and observations do not see it, and the session forgets
// nothing when it closes. Its cancel closes it.
func (s *Session) detachedTab(ctx context.Context) (*tab, error) {
	t := newTab(s, "")
	t.ctx, t.cancel = chromedp.NewContext(s.rootCtx, chromedp.WithListener(t.onEvent))
	err := s.attach(t)
	t.markReady(err)
	if err != nil {
		t.cancel()
		return nil, s.classify(ctx, nil, "import state: open a tab", err)
	}
	return t, nil
}

// closeTabs closes tabs, all at once, and waits until the session forgot
// them.
func (s *Session) closeTabs(ctx context.Context, tabs []*tab) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, t := range tabs {
		g.Go(func() error { return s.closeOne(gctx, t) })
	}
	return g.Wait()
}

func (s *Session) closeOne(ctx context.Context, t *tab) error {
	if err := t.waitReady(ctx); err != nil {
		return nil // never attached: nothing to close
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	_, err := cdp.Call(cctx, s.b, target.CloseTarget, target.CloseTargetParams{TargetID: t.id})
	cancel()
	if err != nil {
		select {
		case <-t.gone:
			return nil // closed meanwhile
		default:
		}
		return s.classify(cctx, nil, "import state: close tab", err)
	}
	select {
	case <-t.gone:
	case <-time.After(s.opts.CallTimeout):
		s.forget(t)
	case <-ctx.Done():
		return faults.Of(context.Cause(ctx))
	}
	return nil
}

// seeder writes the origins' localStorage and IndexedDB before any
// page of theirs loads. An origin whose stub document a tab shows on its
// way to its current page (a history entry before it) is written from
// that document; the others from a scratch tab (seedOrigins), which
// costs a tab.
type seeder struct {
	jobs map[string]*seedJob
}

type seedJob struct {
	o api.OriginState
	// covered: a tab's history passes through the origin before its
	// current page; that tab claims the job.
	covered bool
	claimed atomic.Bool
	done    chan struct{}
}

func newSeeder(origins []api.OriginState, plans []tabPlan) *seeder {
	sd := &seeder{jobs: map[string]*seedJob{}}
	for _, o := range origins {
		if len(o.LocalStorage) > 0 || len(o.IndexedDB) > 0 {
			sd.jobs[o.Origin] = &seedJob{o: o, done: make(chan struct{})}
		}
	}
	for _, p := range plans {
		for _, u := range p.back {
			if j := sd.jobs[originOf(u)]; j != nil {
				j.covered = true
			}
		}
	}
	return sd
}

// claim returns the job of u's origin if the caller is the first to ask.
func (sd *seeder) claim(u string) *seedJob {
	j := sd.jobs[originOf(u)]
	if j == nil || !j.claimed.CompareAndSwap(false, true) {
		return nil
	}
	return j
}

// wait blocks until every origin is written.
func (sd *seeder) wait(ctx context.Context) error {
	for _, j := range sd.jobs {
		select {
		case <-j.done:
		case <-ctx.Done():
			return faults.Of(context.Cause(ctx))
		}
	}
	return nil
}

// seedOrigins writes the origins no tab passes through from a scratch
// tab that shows a stub document of each. The scratch tab is never listed
// among the session's tabs.
func (s *Session) seedOrigins(ctx context.Context, sd *seeder) error {
	var todo []*seedJob
	for _, j := range sd.jobs {
		if !j.covered && j.claimed.CompareAndSwap(false, true) {
			todo = append(todo, j)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	t, err := s.detachedTab(ctx)
	if err != nil {
		return err
	}
	defer t.cancel() // closes the scratch tab
	stop, err := s.stubDocuments(ctx, t)
	if err != nil {
		return err
	}
	defer stop()
	for _, j := range todo {
		if err := s.stubNavigate(ctx, t, j.o.Origin+"/"); err != nil {
			return err
		}
		if err := s.seedIn(ctx, t, j); err != nil {
			return err
		}
	}
	return nil
}

// seedIn writes j's origin's storage from the document t shows (one of
// the origin) and marks the job done.
func (s *Session) seedIn(ctx context.Context, t *tab, j *seedJob) error {
	o := j.o
	local := o.LocalStorage
	if local == nil {
		local = map[string]string{}
	}
	dbs := o.IndexedDB
	if dbs == nil {
		dbs = []api.IDBDatabase{}
	}
	lj, err := json.Marshal(local)
	if err != nil {
		return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "import state: local_storage")
	}
	dj, err := json.Marshal(dbs)
	if err != nil {
		return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "import state: indexed_db")
	}
	expr := fmt.Sprintf("(%s)(%s,%s)", stateImportJS, lj, dj)
	if _, err := t.eval(ctx, expr, true, stateEvalTimeout); err != nil {
		if _, ok := errors.AsType[*faults.Error](err); ok {
			return err
		}
		// The page refused the data: a record whose key does not fit
		// its store, an index on a bad key path.
		return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client,
			"import state: storage of "+o.Origin+": "+err.Error())
	}
	close(j.done)
	return nil
}

// stubPage is the document a stub navigation shows. It is never kept:
// no-store keeps it out of the caches, and should the back-forward cache
// still hold it, it reloads from the site when shown.
const stubPage = `<!doctype html><meta charset="utf-8"><script>addEventListener('pageshow',function(e){if(e.persisted)location.reload()})</script>`

// stubDocuments makes t's requests answer with stubPage (documents) or an
// empty 404 (anything else) without reaching any site, until stop.
func (s *Session) stubDocuments(ctx context.Context, t *tab) (stop func(), err error) {
	lctx, lcancel := context.WithCancel(t.ctx)
	paused := make(chan *fetch.EventRequestPaused, 64)
	chromedp.Listen(lctx, func(ev any) {
		if ev, ok := ev.(*fetch.EventRequestPaused); ok {
			select {
			case paused <- ev:
			default: // cannot happen with one navigation at a time; the request times out
			}
		}
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-lctx.Done():
				return
			case ev := <-paused:
				p := fetch.FulfillRequestParams{RequestID: ev.RequestID, ResponseCode: 404,
					ResponseHeaders: []*fetch.HeaderEntry{{Name: "Cache-Control", Value: "no-store"}}}
				if ev.ResourceType == network.ResourceTypeDocument {
					p.ResponseCode = 200
					p.ResponseHeaders = append(p.ResponseHeaders, &fetch.HeaderEntry{Name: "Content-Type", Value: "text/html; charset=utf-8"})
					p.Body = []byte(stubPage)
				}
				cctx, cancel := context.WithTimeout(lctx, s.opts.CallTimeout)
				if _, err := cdp.Call(cctx, t.target, fetch.FulfillRequest, p); err != nil && lctx.Err() == nil {
					s.log.Debug("import state: stub request", "error", err)
				}
				cancel()
			}
		}
	}()
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	defer cancel()
	if _, err := cdp.Call(cctx, t.target, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*"}}}); err != nil {
		lcancel()
		<-done
		return nil, s.classify(cctx, t, "import state: intercept requests", err)
	}
	return func() {
		dctx, dcancel := t.callCtx(context.Background(), s.opts.CallTimeout)
		if _, err := cdp.Call(dctx, t.target, fetch.Disable, cdp.Empty{}); err != nil {
			s.log.Debug("import state: stop intercepting", "error", err)
		}
		dcancel()
		lcancel()
		<-done
	}, nil
}

// stubNavigate adds u to t's history with a stub document (stubDocuments
// must be on) and waits for its load.
func (s *Session) stubNavigate(ctx context.Context, t *tab, u string) error {
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	defer cancel()
	res, err := cdp.Call(cctx, t.target, page.Navigate, page.NavigateParams{URL: u})
	if err != nil {
		return s.classify(cctx, t, "import state: history", err)
	}
	if res.ErrorText != "" {
		return faults.Newf(faults.CodeNavigationFailed, faults.ActionFailed, faults.Browser, "import state: history entry %s: %s", u, res.ErrorText)
	}
	if res.LoaderID == "" {
		return nil // same document
	}
	if !t.waitUntil(cctx, s.opts.CallTimeout, func() bool { return t.loaded == res.LoaderID }) {
		if ctx.Err() != nil {
			return faults.Of(context.Cause(ctx))
		}
		return faults.Newf(faults.CodeBrowserTimeout, faults.Timeout, faults.Browser, "import state: history entry %s did not load", u)
	}
	return nil
}

// tabPlan is how a tab gets its history back: the entries before and
// after the current one that it gets as stub documents (bounded), and
// the current page.
type tabPlan struct {
	back, fwd []string
	current   string
}

func planTab(ts api.TabState) tabPlan {
	hist, cur := ts.History, ts.CurrentIndex
	if len(hist) == 0 {
		hist, cur = []api.HistoryEntry{{URL: ts.URL}}, 0
	}
	var p tabPlan
	lo, hi := max(0, cur-maxHistoryBack), min(len(hist), cur+1+maxHistoryForward)
	for i := lo; i < hi; i++ {
		switch {
		case i == cur || !scriptable(hist[i].URL):
		case i < cur:
			p.back = append(p.back, hist[i].URL)
		default:
			p.fwd = append(p.fwd, hist[i].URL)
		}
	}
	p.current = hist[cur].URL
	return p
}

// restoreTab gives a blank tab ts's history, page and view. Its current
// page loads once sd wrote every origin's storage; the tab writes those
// its stub entries show first.
func (s *Session) restoreTab(ctx context.Context, t *tab, ts api.TabState, p tabPlan, sd *seeder) error {
	t.act.Lock()
	defer t.act.Unlock()
	back, fwd, current := p.back, p.fwd, p.current
	if current == "" || current == "about:blank" {
		return nil
	}

	if len(ts.SessionStorage) > 0 {
		m, err := json.Marshal(ts.SessionStorage)
		if err != nil {
			return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "session_storage")
		}
		src := fmt.Sprintf(`(function(M){var d=M[location.origin];if(!d)return;try{for(var k in d)sessionStorage.setItem(k,d[k])}catch(e){}})(%s)`, m)
		cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
		res, err := cdp.Call(cctx, t.target, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: src})
		cancel()
		if err != nil {
			return s.classify(cctx, t, "restore session storage", err)
		}
		defer func() {
			rctx, rcancel := t.callCtx(context.Background(), s.opts.CallTimeout)
			defer rcancel()
			if _, err := cdp.Call(rctx, t.target, page.RemoveScriptToEvaluateOnNewDocument, page.RemoveScriptToEvaluateOnNewDocumentParams{Identifier: res.Identifier}); err != nil {
				s.log.Debug("import state: remove session storage script", "error", err)
			}
		}()
	}

	if err := s.stubHistory(ctx, t, back, sd); err != nil {
		return err
	}
	if err := sd.wait(ctx); err != nil {
		return err
	}
	if err := s.navigate(ctx, t, current); err != nil {
		// A site that fails now shows its error page, as it would to the
		// agent; the rest of the state still applies.
		if src := faults.Of(err).Source; src != faults.Site && src != faults.Network {
			return err
		}
		s.log.Info("import state: current page failed to load", "url", current, "error", err)
	}
	if len(fwd) > 0 {
		if err := s.stubHistory(ctx, t, fwd, nil); err != nil {
			return err
		}
		if err := s.history(ctx, t, -len(fwd)); err != nil {
			if src := faults.Of(err).Source; src != faults.Site && src != faults.Network {
				return err
			}
		}
	}
	if !scriptable(current) || t.openDialog() != nil {
		return nil
	}
	view, err := json.Marshal(struct {
		Scroll   api.ScrollPosition  `json:"scroll"`
		Scrolled []api.ElementScroll `json:"scrolled"`
		Fields   []api.FieldValue    `json:"fields"`
		Focus    *api.FocusState     `json:"focus"`
	}{ts.Scroll, ts.Scrolled, ts.Fields, ts.Focus})
	if err != nil {
		return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "import state: view")
	}
	var missing []string
	if err := t.evalInto(ctx, fmt.Sprintf("(%s)(%s)", stateViewJS, view), false, s.opts.CallTimeout, &missing); err != nil {
		if _, ok := errors.AsType[*faults.Error](err); ok {
			return err
		}
		return faults.Wrap(err, faults.CodeBrowserProtocol, faults.Internal, faults.Browser, "import state: restore the page's view")
	}
	if len(missing) > 0 {
		s.log.Info("import state: elements not found on the page", "url", current, "selectors", missing)
	}
	return nil
}

// stubHistory adds urls to t's history as stub documents, writing the
// storage of the origins it is the first to show when sd is given.
func (s *Session) stubHistory(ctx context.Context, t *tab, urls []string, sd *seeder) error {
	if len(urls) == 0 {
		return nil
	}
	stop, err := s.stubDocuments(ctx, t)
	if err != nil {
		return err
	}
	defer stop()
	for _, u := range urls {
		if err := s.stubNavigate(ctx, t, u); err != nil {
			return err
		}
		if sd == nil {
			continue
		}
		if j := sd.claim(u); j != nil {
			if err := s.seedIn(ctx, t, j); err != nil {
				return err
			}
		}
	}
	return nil
}
