package browser

import (
	"context"
	"errors"
	"time"

	"github.com/orchard/orchard/faults"
)

// Request is the body of POST /browser/actions: a list of actions (or a
// single one), an optional observation to take afterwards, and a frame
// and strictness that apply to every action that does not set its own.
type Request struct {
	Actions []Action        `json:"actions,omitempty"`
	Action  *Action         `json:"action,omitempty"`
	Observe *ObserveOptions `json:"observe,omitempty"`
	Frame   *int64          `json:"frame,omitempty"`
	Strict  bool            `json:"strict,omitempty"`
	// Settle overrides the session's settle wait for these actions.
	Settle *Settle `json:"settle,omitempty"`
}

// Settle tunes the wait after each action for the page to go quiet (no
// DOM mutation, no request in flight). Zero fields keep the session's.
type Settle struct {
	// QuietMS: how long the page must stay quiet.
	QuietMS int `json:"quiet_ms,omitempty"`
	// IdleMS: end early when nothing at all happened for this long.
	IdleMS int `json:"idle_ms,omitempty"`
	// TimeoutMS caps the wait.
	TimeoutMS int `json:"timeout_ms,omitempty"`
}

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

// List returns the request's actions with the request-level frame and
// strictness applied.
func (r Request) List() []Action {
	list := append([]Action(nil), r.Actions...)
	if r.Action != nil {
		list = append(list, *r.Action)
	}
	for i := range list {
		if list[i].Frame == nil && r.Frame != nil {
			f := *r.Frame
			list[i].Frame = &f
		}
		if r.Strict {
			list[i].Strict = true
		}
	}
	return list
}

// Response is the body answering a Request.
type Response struct {
	OK          bool         `json:"ok"`
	Results     []Result     `json:"results"`
	Observation *Observation `json:"observation,omitempty"`
	Timing      Timing       `json:"timing"`
}

// Timing of a Request, in milliseconds.
type Timing struct {
	TotalMS   float64 `json:"total_ms"`
	ActionsMS float64 `json:"actions_ms"`
	ObserveMS float64 `json:"observe_ms,omitempty"`
}

// Run serves a Request: the actions, then the observation if asked for
// (also after a failed action, so the agent sees where it stands). The
// error is non-nil only when the session cannot go on (see Do) or the
// observation failed.
func (s *Session) Run(ctx context.Context, r Request) (Response, error) {
	start := time.Now()
	ctx = withSettle(ctx, r.Settle)
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
