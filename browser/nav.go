package browser

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/target"

	"github.com/orchard/orchard/faults"
)

// normalizeURL adds https:// to a bare host ("example.com/a"), which
// agents often write.
func normalizeURL(u string) string {
	u = strings.TrimSpace(u)
	if strings.Contains(u, "://") {
		return u
	}
	for _, p := range []string{"about:", "data:", "file:", "javascript:", "chrome:", "blob:"} {
		if strings.HasPrefix(strings.ToLower(u), p) {
			return u
		}
	}
	return "https://" + u
}

func errNavTimeout(u string, d time.Duration) *faults.Error {
	return faults.Newf(faults.CodeNavigationTimeout, faults.Timeout, faults.Site, "load %s: no load event within %s", u, d)
}

// navigate loads u in t and waits for its load event. Net errors and
// main-document HTTP errors are classified; an HTTP error page stays
// displayed and the tab usable.
func (s *Session) navigate(ctx context.Context, t *tab, raw string) error {
	u := normalizeURL(raw)
	t.mu.Lock()
	navs, crashes := t.navs, t.crashes
	t.mu.Unlock()
	downloads := len(s.Downloads())

	cctx, cancel := t.callCtx(ctx, s.opts.NavigationTimeout, errTabCrashed)
	// Page.navigate answers once the response starts, which a slow site
	// delays for long; a browser that stopped answering must not wait that
	// long to be found out.
	watch := time.AfterFunc(s.opts.CallTimeout, func() {
		if s.hung() {
			s.markHung(errors.New("no answer to a navigation"))
		}
	})
	res, err := cdp.Call(cctx, t.target, page.Navigate, page.NavigateParams{URL: u})
	watch.Stop()
	cause := context.Cause(cctx)
	cancel()
	if err != nil {
		if errors.Is(cause, errDialogOpen) && ctx.Err() == nil {
			return nil // a beforeunload dialog holds the navigation; the observation shows it
		}
		if errors.Is(cause, errCallTimeout) && ctx.Err() == nil && s.crashError() == nil {
			if s.hung() {
				return s.markHung(err)
			}
			s.stopLoading(t)
			return errNavTimeout(u, s.opts.NavigationTimeout) // the site, not the browser
		}
		return s.classify(cctx, t, "navigate", err)
	}
	if res.ErrorText != "" {
		if strings.Contains(res.ErrorText, "ERR_HTTP_RESPONSE_CODE_FAILURE") {
			t.mu.Lock()
			nav, changed := t.lastNav, t.navs != navs
			t.mu.Unlock()
			if changed && nav.status >= 400 {
				return httpError(nav.status, nav.statusText, u)
			}
		}
		if strings.Contains(res.ErrorText, "ERR_ABORTED") {
			// A navigation that turned into a download is aborted as a page
			// load but did what was asked.
			t.settle(ctx, s.opts.SettleTimeout)
			if len(s.Downloads()) > downloads {
				return nil
			}
		}
		return netError(res.ErrorText, u)
	}
	if res.LoaderID == "" {
		t.settle(ctx, s.opts.SettleTimeout) // same-document navigation
		return nil
	}
	loaded := t.waitUntil(ctx, s.opts.NavigationTimeout, func() bool {
		return t.loaded == res.LoaderID || t.dialog != nil || t.crashes != crashes ||
			t.navs != navs && t.lastNav.failure() != nil && t.lastNav.loader != res.LoaderID
	})
	if ctx.Err() != nil {
		return faults.Of(context.Cause(ctx))
	}
	t.mu.Lock()
	nav, changed, crashed := t.lastNav, t.navs != navs, t.crashes != crashes
	t.mu.Unlock()
	if crashed {
		return faults.New(faults.CodeBrowserTabCrashed, faults.Unavailable, faults.Browser, "navigate: the tab's renderer crashed")
	}
	if changed {
		if fe := nav.failure(); fe != nil {
			t.settle(ctx, s.opts.SettleTimeout)
			return fe
		}
	}
	if !loaded {
		s.stopLoading(t)
		return errNavTimeout(u, s.opts.NavigationTimeout)
	}
	t.settle(ctx, s.opts.SettleTimeout)
	return nil
}

// stopLoading ends a load that missed its deadline, so that it cannot
// commit (or abort the next navigation) after the step has failed.
func (s *Session) stopLoading(t *tab) {
	ctx, cancel := t.callCtx(context.Background(), s.opts.CallTimeout)
	defer cancel()
	if _, err := cdp.Call(ctx, t.target, page.StopLoading, cdp.Empty{}); err != nil {
		s.log.Debug("stop loading", "error", err)
	}
}

func (s *Session) reload(ctx context.Context, t *tab) error {
	t.mu.Lock()
	loads, navs := t.loads, t.navs
	url := t.url
	t.mu.Unlock()
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout, errTabCrashed)
	_, err := cdp.Call(cctx, t.target, page.Reload, page.ReloadParams{})
	cancel()
	if err != nil {
		return s.classify(cctx, t, "reload", err)
	}
	loaded := t.waitUntil(ctx, s.opts.NavigationTimeout, func() bool {
		return t.loads > loads && !t.loading || t.dialog != nil
	})
	return s.navResult(ctx, t, navs, loaded, url)
}

// history goes back (-1) or forward (+1) in t's session history.
func (s *Session) history(ctx context.Context, t *tab, delta int) error {
	what := "back"
	if delta > 0 {
		what = "forward"
	}
	cctx, cancel := t.callCtx(ctx, s.opts.CallTimeout)
	h, err := cdp.Call(cctx, t.target, page.GetNavigationHistory, cdp.Empty{})
	if err != nil {
		cancel()
		return s.classify(cctx, t, what, err)
	}
	i := int(h.CurrentIndex) + delta
	if i < 0 || i >= len(h.Entries) {
		cancel()
		return faults.Newf(faults.CodeNavigationNoHistory, faults.ActionFailed, faults.Policy, "%s: no page to go %s to", what, what)
	}
	t.mu.Lock()
	loads, docs, navs, before := t.loads, t.docs, t.navs, t.url
	t.mu.Unlock()
	_, err = cdp.Call(cctx, t.target, page.NavigateToHistoryEntry, page.NavigateToHistoryEntryParams{EntryID: h.Entries[i].ID})
	cancel()
	if err != nil {
		return s.classify(cctx, t, what, err)
	}
	// A cross-document entry fires a load; a same-document one (or a page
	// restored from the back-forward cache) only changes the URL.
	loaded := t.waitUntil(ctx, s.opts.NavigationTimeout, func() bool {
		return !t.loading && (t.loads > loads || t.docs > docs || t.url != before) || t.dialog != nil
	})
	return s.navResult(ctx, t, navs, loaded, h.Entries[i].URL)
}

// navResult finishes a reload or history move: settle, then report the
// main document's failure or a load that never came.
func (s *Session) navResult(ctx context.Context, t *tab, navs int64, loaded bool, u string) error {
	if ctx.Err() != nil {
		return faults.Of(context.Cause(ctx))
	}
	t.settle(ctx, s.opts.SettleTimeout)
	t.mu.Lock()
	nav, changed := t.lastNav, t.navs != navs
	t.mu.Unlock()
	if changed {
		if fe := nav.failure(); fe != nil {
			return fe
		}
	}
	if !loaded {
		return errNavTimeout(u, s.opts.NavigationTimeout)
	}
	return nil
}

// networkQuiet is how long no request may be in flight for wait
// {until: "networkidle"}: the usual definition of network idle.
const networkQuiet = 500 * time.Millisecond

// waitUntil runs wait {until}. ms, when given, caps the wait. A page that
// never gets there is not a failure: the agent observes it as it is.
func (s *Session) waitUntil(ctx context.Context, t *tab, a Action) error {
	limit := s.opts.NavigationTimeout
	if a.MS > 0 {
		limit = min(time.Duration(a.MS)*time.Millisecond, maxWait)
	}
	deadline := time.Now().Add(limit)
	switch a.Until {
	case "load":
		t.waitUntil(ctx, limit, func() bool { return !t.loading || t.dialog != nil })
	case "networkidle":
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if !t.waitUntil(ctx, time.Until(deadline), func() bool { return !t.busyLocked() || t.dialog != nil }) {
				break
			}
			if t.openDialog() != nil {
				break
			}
			if !t.waitUntil(ctx, min(networkQuiet, time.Until(deadline)), func() bool { return t.busyLocked() }) {
				break // stayed idle for networkQuiet
			}
		}
	case "settled":
		t.settle(ctx, limit)
	}
	if ctx.Err() != nil {
		return faults.Of(context.Cause(ctx))
	}
	// A wait that the session's end cut short did not see the page get
	// anywhere.
	return s.Err()
}

func (s *Session) switchTab(ctx context.Context, index int) error {
	s.mu.Lock()
	if index < 0 || index >= len(s.tabs) {
		n := len(s.tabs)
		s.mu.Unlock()
		return faults.Newf(faults.CodeActionNoSuchTab, faults.ActionFailed, faults.Policy, "switch_tab: no tab %d (%d open)", index, n)
	}
	t := s.tabs[index]
	s.active = t
	s.mu.Unlock()
	if err := t.waitReady(ctx); err != nil {
		return err
	}
	return s.toFront(ctx, t)
}

func (s *Session) closeTab(ctx context.Context, index *int) error {
	s.mu.Lock()
	t := s.active
	if index != nil {
		if *index < 0 || *index >= len(s.tabs) {
			n := len(s.tabs)
			s.mu.Unlock()
			return faults.Newf(faults.CodeActionNoSuchTab, faults.ActionFailed, faults.Policy, "close_tab: no tab %d (%d open)", *index, n)
		}
		t = s.tabs[*index]
	}
	last := len(s.tabs) == 1
	s.mu.Unlock()
	if t == nil {
		return faults.New(faults.CodeActionNoSuchTab, faults.ActionFailed, faults.Policy, "close_tab: no tab is open")
	}
	if last {
		// The browser must keep a tab: the agent gets a blank one.
		if _, err := s.openTab(ctx); err != nil {
			return err
		}
	}
	if err := t.waitReady(ctx); err != nil && !faults.Is(err, faults.CodeActionNoSuchTab) {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer cancel()
	if _, err := cdp.Call(cctx, s.b, target.CloseTarget, target.CloseTargetParams{TargetID: t.id}); err != nil {
		return s.classify(cctx, nil, "close_tab", err)
	}
	// The destroyed event removes the tab; do it here if it is late.
	select {
	case <-t.gone:
	case <-time.After(s.opts.CallTimeout):
		s.forget(t)
	case <-ctx.Done():
		return faults.Of(context.Cause(ctx))
	}
	s.mu.Lock()
	ok := !slices.Contains(s.tabs, t)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("close_tab: tab %s still open", t.id)
	}
	return nil
}
