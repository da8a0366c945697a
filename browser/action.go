package browser

import (
	"context"
	"net/url"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/ordered"
	"github.com/orchard/orchard/retry"
)

// Action types (the "type" of an Action).
const (
	ActNavigate     = "navigate"
	ActClick        = "click"
	ActDoubleClick  = "double_click"
	ActHover        = "hover"
	ActType         = "type"
	ActKey          = "key"
	ActScroll       = "scroll"
	ActDrag         = "drag"
	ActSelectOption = "select_option"
	ActUploadFile   = "upload_file"
	ActBack         = "back"
	ActForward      = "forward"
	ActReload       = "reload"
	ActNewTab       = "new_tab"
	ActSwitchTab    = "switch_tab"
	ActCloseTab     = "close_tab"
	ActWait         = "wait"
	ActDialog       = "dialog"
	ActAnswer       = "answer"
)

// Action is one step an agent asks for (api.BrowserAction lists the
// types and their arguments).
type Action = api.BrowserAction

// RetryPolicy is the wire form of a page-load retry policy (per session:
// Options.NavigationRetry; per action: Action.Retry).
type RetryPolicy = api.RetryPolicy

// retryPolicy is r as the retry helper runs it.
func retryPolicy(r RetryPolicy) retry.Policy {
	p := retry.Policy{Attempts: max(r.Attempts, 1), Initial: 500 * time.Millisecond, Max: 5 * time.Second,
		Budget: time.Duration(r.BudgetMS) * time.Millisecond}
	if r.InitialMS > 0 {
		p.Initial = time.Duration(r.InitialMS) * time.Millisecond
	}
	if r.MaxMS > 0 {
		p.Max = time.Duration(r.MaxMS) * time.Millisecond
	}
	return p
}

// isLoad reports the actions a retry policy repeats: loads of the current
// tab (a new_tab is not repeated, or each attempt would open another tab).
func isLoad(typ string) bool {
	switch typ {
	case ActNavigate, ActReload, ActBack, ActForward:
		return true
	}
	return false
}

// Result is the outcome of one action.
type Result = api.BrowserActionResult

// Do runs actions in order on the active tab and stops at the first that
// fails. It returns one Result per action run: all of them, or up to and
// including the failed one, whose Error says why. A failure on the page
// (no such element, a site error) leaves the session usable and Do's error
// nil; Do returns an error only when the session itself can no longer
// work (browser.crashed, browser.closed) or ctx ended.
func (s *Session) Do(ctx context.Context, actions []Action) ([]Result, error) {
	return ordered.Run(ctx, actions, func(ctx context.Context, a Action) (Result, error) {
		start := time.Now()
		var injected *faults.Truth
		attempt := func(ctx context.Context, _ int) error {
			at := time.Now()
			err := s.do(ctx, a)
			var inj *faults.Truth
			err, inj = s.withEvidence(ctx, a, at, err)
			if inj != nil {
				injected = inj
			}
			return err
		}
		var err error
		var tries retry.Result
		if rp := s.retryPolicy(a); rp.Attempts > 1 && isLoad(a.Type) {
			tries, err = retry.Do(ctx, rp, attempt)
		} else {
			err = attempt(ctx, 1)
		}
		r := Result{ActionResult: api.ActionResult{Type: a.Type, OK: err == nil, DurationMS: msSince(start)}, Injected: injected}
		if n := tries.Count(); n > 0 {
			r.Attempts = n
			if n > 1 {
				r.Retries = retries(tries.Attempts)
			}
		}
		if err != nil {
			info := faults.Of(err).Info()
			r.Error = &info
		}
		return r, err
	}, s.Err, func(a Action, fe *faults.Error) {
		s.log.Debug("action failed", "type", a.Type, "code", fe.Code, "category", fe.Category, "source", fe.Source, "error", fe)
	})
}

// retries is the wire form of a page load's attempts.
func retries(l []retry.Attempt) []api.RetryAttempt {
	out := make([]api.RetryAttempt, len(l))
	for i, a := range l {
		out[i] = api.RetryAttempt{N: a.N, Error: a.Err, DurationMS: durationMS(a.Duration), WaitMS: durationMS(a.Wait)}
	}
	return out
}

func durationMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (s *Session) retryPolicy(a Action) retry.Policy {
	p := retryPolicy(s.opts.NavigationRetry)
	if a.Retry != nil {
		p = retryPolicy(*a.Retry)
	}
	// A dead browser is its owner's to restart: retrying the load in it
	// cannot help.
	p.Retryable = func(err error) bool { return faults.IsRetryable(err) && s.Err() == nil }
	return p
}

// withEvidence attributes a failed page load by what the egress proxy saw:
// Chromium reports a failed CONNECT only as "tunnel failed" and shows the
// proxy's own error page like a site's, while the proxy classified the
// failure where it happened. It also returns the fault a plan injected.
func (s *Session) withEvidence(ctx context.Context, a Action, since time.Time, err error) (error, *faults.Truth) {
	if s.opts.Evidence == nil {
		return err, nil
	}
	raw := a.URL
	switch a.Type {
	case ActNavigate, ActNewTab:
	case ActReload, ActBack, ActForward:
		if err == nil {
			return nil, nil
		}
		if t, terr := s.activeTab(ctx); terr == nil {
			t.mu.Lock()
			raw = t.url
			t.mu.Unlock()
		}
	default:
		return err, nil
	}
	if raw == "" {
		return err, nil
	}
	u, perr := url.Parse(normalizeURL(raw))
	if perr != nil || u.Hostname() == "" {
		return err, nil
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	fe, truth := s.opts.Evidence(ectx, u.Hostname(), since)
	// The proxy's record of a connection the browser itself gave up on
	// (client.canceled) says nothing about the site.
	if err != nil && fe != nil && fe.Source != faults.Client {
		if f := faults.Of(err); f.Source == faults.Site || f.Source == faults.Network || f.Category == faults.Timeout {
			err = fe
		}
	}
	return err, truth
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// maxWait bounds a wait action: an agent that asks for longer is better
// served by observing in between.
const maxWait = 60 * time.Second

func (s *Session) do(ctx context.Context, a Action) error {
	if err := s.Err(); err != nil {
		return err
	}
	if err := validate(a); err != nil {
		return err
	}
	switch a.Type {
	case ActAnswer:
		text := a.Text
		s.mu.Lock()
		s.answer = &text
		s.mu.Unlock()
		return nil
	case ActNewTab:
		t, err := s.openTab(ctx)
		if err != nil {
			return err
		}
		if a.URL == "" {
			return nil
		}
		t.act.Lock()
		defer t.act.Unlock()
		return s.blocked(ctx, t, s.navigate(ctx, t, a.URL))
	case ActSwitchTab:
		return s.switchTab(ctx, *a.Index)
	case ActCloseTab:
		return s.closeTab(ctx, a.Index)
	case ActWait:
		if a.Until == "" {
			d := min(time.Duration(a.MS)*time.Millisecond, maxWait)
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-timer.C:
				return nil
			case <-ctx.Done():
				return faults.Of(context.Cause(ctx))
			case <-s.done:
				return errClosed()
			case <-s.lostConnection():
				return s.Err()
			}
		}
	}

	t, err := s.activeTab(ctx)
	if err != nil {
		return err
	}
	t.act.Lock()
	defer t.act.Unlock()

	if d := t.openDialog(); d != nil && a.Type != ActDialog && a.Type != ActWait {
		return faults.Newf(faults.CodeActionDialogOpen, faults.Conflict, faults.Policy,
			"%s: a %s dialog is open (%q): answer it with the dialog action first", a.Type, d.Type, d.Message)
	}
	if t.isCrashed() && a.Type != ActNavigate && a.Type != ActReload && a.Type != ActWait {
		return faults.New(faults.CodeBrowserTabCrashed, faults.Unavailable, faults.Browser,
			a.Type+": the tab's renderer crashed; navigate or reload to revive it")
	}
	fi, err := s.frameFor(t, a)
	if err != nil {
		return err
	}
	if a.Type != ActDialog {
		if err := s.toFront(ctx, t); err != nil {
			return err
		}
	}

	t.mu.Lock()
	navsBefore, reqsBefore := t.navs, t.reqs
	t.mu.Unlock()

	switch a.Type {
	case ActNavigate:
		return s.blocked(ctx, t, s.navigate(ctx, t, a.URL))
	case ActReload:
		return s.blocked(ctx, t, s.reload(ctx, t))
	case ActBack:
		return s.blocked(ctx, t, s.history(ctx, t, -1))
	case ActForward:
		return s.blocked(ctx, t, s.history(ctx, t, +1))
	case ActWait:
		return s.waitUntil(ctx, t, a)
	}

	switch a.Type {
	case ActClick, ActDoubleClick, ActHover:
		err = s.click(ctx, t, fi, a)
	case ActType:
		err = s.typeText(ctx, t, a)
	case ActKey:
		err = s.pressKeys(ctx, t, a.Keys)
	case ActScroll:
		err = s.scroll(ctx, t, fi, a)
	case ActDrag:
		err = s.drag(ctx, t, fi, a)
	case ActSelectOption:
		err = s.selectOption(ctx, t, a)
	case ActUploadFile:
		err = s.uploadFile(ctx, t, a)
	case ActDialog:
		err = s.answerDialog(ctx, t, a)
	default:
		err = errInvalid("unknown action type %q", a.Type)
	}
	// What the action drew (a hover style, a focus ring, a selection) is
	// reported by the compositor shortly after its answer.
	t.touch()
	if err != nil {
		return err
	}
	if startsEarly(a.Type) {
		s.beginEarly(ctx, t)
	}
	t.settleAfter(ctx, s.opts.SettleTimeout, reqsBefore)
	// An action that navigated the page (a link, a form) reports the
	// site's failure, so a step that landed on an error page says so.
	t.mu.Lock()
	nav, changed := t.lastNav, t.navs != navsBefore
	t.mu.Unlock()
	if changed {
		var loadErr error // nil when the page loaded: then only a wall served with 200 fails
		if fe := nav.failure(); fe != nil {
			loadErr = fe
		}
		return s.blocked(ctx, t, loadErr)
	}
	return nil
}

// validate checks an action's arguments before anything runs.
func validate(a Action) error {
	hasXY := a.X != nil && a.Y != nil
	if (a.X == nil) != (a.Y == nil) {
		return errInvalid("%s: x and y go together", a.Type)
	}
	target := func() error {
		n := 0
		if hasXY {
			n++
		}
		if a.Element != nil {
			n++
		}
		if a.Selector != "" {
			n++
		}
		if n != 1 {
			return errInvalid("%s: give exactly one of x,y or element or selector", a.Type)
		}
		return nil
	}
	switch a.Type {
	case ActNavigate:
		if a.URL == "" {
			return errInvalid("navigate: url is required")
		}
	case ActClick, ActDoubleClick, ActHover:
		if err := target(); err != nil {
			return err
		}
		switch a.Button {
		case "", "left", "right", "middle", "back", "forward":
		default:
			return errInvalid("%s: unknown button %q", a.Type, a.Button)
		}
		if a.Clicks < 0 || a.Clicks > 3 {
			return errInvalid("%s: clicks must be 1 to 3", a.Type)
		}
	case ActType:
		if hasXY || a.Element != nil && a.Selector != "" {
			return errInvalid("type: give element or selector (or neither for the focused element)")
		}
	case ActKey:
		if _, err := parseKeys(a.Keys); err != nil {
			return errInvalid("key: %v", err)
		}
	case ActScroll:
		if a.Element != nil && a.Selector != "" {
			return errInvalid("scroll: give element or selector, not both")
		}
		if (a.Element != nil || a.Selector != "") && hasXY {
			return errInvalid("scroll: give x,y or an element, not both")
		}
	case ActDrag:
		if len(a.Points) < 2 {
			return errInvalid("drag: path needs at least two points")
		}
	case ActSelectOption:
		if (a.Element == nil) == (a.Selector == "") {
			return errInvalid("select_option: give exactly one of element or selector")
		}
	case ActUploadFile:
		if (a.Element == nil) == (a.Selector == "") {
			return errInvalid("upload_file: give exactly one of element or selector")
		}
		if a.File == "" {
			return errInvalid("upload_file: path is required")
		}
	case ActSwitchTab:
		if a.Index == nil {
			return errInvalid("switch_tab: index is required")
		}
	case ActWait:
		switch a.Until {
		case "", "load", "networkidle", "settled":
		default:
			return errInvalid("wait: until must be load, networkidle or settled")
		}
		if a.MS < 0 {
			return errInvalid("wait: ms must not be negative")
		}
	case ActBack, ActForward, ActReload, ActNewTab, ActCloseTab, ActDialog, ActAnswer:
	case "":
		return errInvalid("action type is required")
	default:
		return errInvalid("unknown action type %q", a.Type)
	}
	return nil
}

// errStaleFrame is the class of a strict action on an old observation.
func errStaleFrame(frame, latest int64) *faults.Error {
	return faults.Newf(faults.CodeActionStaleFrame, faults.Conflict, faults.Policy,
		"frame %d is stale (latest observation of this page is %d): observe again", frame, latest)
}
