package browser

import (
	"context"
	"errors"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// Request is the body of POST /browser/actions (api.BrowserActionsRequest).
type Request = api.BrowserActionsRequest

// Settle tunes the wait after each action for the page to go quiet.
type Settle = api.Settle

type settleKey struct{}

// withSettle carries a request's settle override to the waits below it.
func withSettle(ctx context.Context, s *Settle) context.Context {
	if s == nil {
		return ctx
	}
	return context.WithValue(ctx, settleKey{}, *s)
}

// settleParams are the quiet window, idle cut-off and cap that apply in ctx.
func (s *Session) settleParams(ctx context.Context, limit time.Duration) (quiet, idle, cap time.Duration) {
	quiet, idle, cap = s.opts.SettleQuiet, s.opts.SettleIdle, limit
	if o, ok := ctx.Value(settleKey{}).(Settle); ok {
		if o.QuietMS > 0 {
			quiet = time.Duration(o.QuietMS) * time.Millisecond
		}
		if o.IdleMS > 0 {
			idle = time.Duration(o.IdleMS) * time.Millisecond
		}
		if o.TimeoutMS > 0 {
			cap = min(cap, time.Duration(o.TimeoutMS)*time.Millisecond)
		}
	}
	return quiet, min(idle, quiet), cap
}

// Response is the body answering a Request.
type Response = api.BrowserActionsResponse

// Timing of a Request, in milliseconds.
type Timing = api.BrowserTiming

// Run serves a Request: the actions, then the observation if asked for
// (also after a failed action, so the agent sees where it stands). The
// error is non-nil only when the session cannot go on (see Do) or the
// observation failed.
func (s *Session) Run(ctx context.Context, r Request) (Response, error) {
	start := time.Now()
	ctx = withSettle(ctx, r.Settle)
	ctx = s.withEarly(ctx, r.Observe)
	results, err := s.Do(ctx, r.List())
	resp := Response{OK: err == nil, Results: results}
	for _, res := range results {
		resp.OK = resp.OK && res.OK
	}
	resp.Timing.ActionsMS = msSince(start)
	if err != nil {
		resp.Timing.TotalMS = msSince(start)
		return resp, err
	}
	if r.Observe != nil {
		obsStart := time.Now()
		obs, err := s.Observe(ctx, *r.Observe)
		resp.Timing.ObserveMS = msSince(obsStart)
		resp.Timing.TotalMS = msSince(start)
		if err != nil {
			return resp, err
		}
		resp.Observation = &obs
	}
	resp.Timing.TotalMS = msSince(start)
	return resp, nil
}

// Evaluate runs a JavaScript expression in the active tab's page (awaiting
// a promise) and returns its value as JSON: what evaluators of a finished
// episode ask of the live page.
func (s *Session) Evaluate(ctx context.Context, expr string) ([]byte, error) {
	if err := s.Err(); err != nil {
		return nil, err
	}
	t, err := s.activeTab(ctx)
	if err != nil {
		return nil, err
	}
	v, err := t.eval(ctx, expr, true, s.opts.CallTimeout)
	t.touch()
	if err != nil {
		if _, ok := errors.AsType[*faults.Error](err); ok {
			return nil, err
		}
		return nil, faults.Wrap(err, faults.CodeActionInvalid, faults.InvalidRequest, faults.Policy, "evaluate: "+err.Error())
	}
	if len(v) == 0 {
		return []byte("null"), nil
	}
	return []byte(v), nil
}
