// Package sitehealth keeps a circuit breaker and a rate limiter per site
// host, shared by every sandbox of a server — and by every replica when the
// Backend is shared (Redis). A host that keeps failing is given a rest:
// requests to it fail fast with site.unavailable instead of each sandbox
// waiting for its own timeout, and after a pause a few probes find out
// whether it is back. The rate limiter spaces requests to one host so that
// many sandboxes together do not flood it.
//
// A host's state is one small record that the Tracker reads and rewrites
// atomically through the Backend on each request and each outcome, so the
// breaker's logic lives here once and a Backend only stores bytes.
package sitehealth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orchard/orchard/faults"
)

const (
	// DefaultFailureThreshold is how many consecutive failures open a
	// breaker: enough that a single flaky response never does.
	DefaultFailureThreshold = 5
	// DefaultOpenFor is how long an open breaker rejects before it lets a
	// probe through: long enough for a restarting or overloaded site to
	// recover, short enough that agents do not give up on it.
	DefaultOpenFor = 30 * time.Second
	// DefaultHalfOpenProbes is how many requests may probe a half-open
	// host at once: one answer is enough to decide.
	DefaultHalfOpenProbes = 1

	// idleTTL is how long a host's record outlives its last request. A host
	// visited every few minutes keeps its failure count and counters; one
	// no longer visited leaves the shared store.
	idleTTL = 10 * time.Minute

	// reportTimeout bounds writing one outcome, which happens after the
	// request's own context may have ended. The write is one small
	// transaction: two seconds means the store is gone, and losing one
	// outcome only delays the breaker by one failure.
	reportTimeout = 2 * time.Second

	// maxLastError bounds the failure text kept per host.
	maxLastError = 200

	// backendWarnEvery spaces the warnings about a failing Backend: one
	// line per interval tells operators the breaker is off, without a line
	// per request for the length of an outage.
	backendWarnEvery = 10 * time.Second
)

// Backend holds the host records a Tracker shares. Its two
// implementations are Memory (one server) and the Redis store (replicas);
// both pass sitehealthtest.
type Backend interface {
	// Update calls fn with host's current record (nil if there is none or
	// it expired) and stores the record fn returns, atomically: if another
	// writer changed the record in between, fn is called again with the
	// new one, so fn must not have effects beyond its result. fn must not
	// keep or modify rec. When fn returns an error nothing is stored and
	// Update returns that error. The stored record expires ttl after this
	// write.
	Update(ctx context.Context, host string, ttl time.Duration, fn func(rec []byte) ([]byte, error)) error
	// List returns every record that has not expired, by host.
	List(ctx context.Context) (map[string][]byte, error)
}

// Config tunes a Tracker. Zero fields take the defaults.
type Config struct {
	// FailureThreshold is the number of consecutive failures that opens a
	// host's breaker; DefaultFailureThreshold if 0.
	FailureThreshold int
	// OpenFor is how long an open breaker rejects requests before it turns
	// half-open; DefaultOpenFor if 0. It is also how long a probe may take
	// to report before another probe is let through.
	OpenFor time.Duration
	// HalfOpenProbes is how many requests may be in flight to a half-open
	// host; DefaultHalfOpenProbes if 0.
	HalfOpenProbes int
	// RatePerSecond is the sustained request rate allowed to one host;
	// 0 means no limit.
	RatePerSecond float64
	// Burst is how many requests may go to a host at once after it was
	// quiet; 1 if 0. Only used with a rate.
	Burst int
	// Now is the clock; time.Now if nil. Replicas sharing a Backend must
	// have clocks that agree to well within OpenFor and 1/RatePerSecond
	// (NTP does): the records hold absolute times.
	Now func() time.Time
}

// State is a breaker's state. Strings are API.
type State string

// States.
const (
	// Closed: requests pass; failures are counted.
	Closed State = "closed"
	// Open: requests fail fast with site.unavailable until Until.
	Open State = "open"
	// HalfOpen: a few probes pass; the first to report closes the breaker
	// on success or opens it again on failure.
	HalfOpen State = "half_open"
)

// HostStatus is the state of one host's breaker and its counters.
type HostStatus struct {
	Host  string `json:"host"`
	State State  `json:"state"`
	// Failures is the number of consecutive failures counted while closed.
	Failures int `json:"failures"`
	// OpenedAt is when the breaker last opened.
	OpenedAt time.Time `json:"opened_at,omitzero"`
	// Until is, while open, when the breaker turns half-open.
	Until time.Time `json:"until,omitzero"`
	// LastError is the class and message of the last failure counted.
	LastError string `json:"last_error,omitempty"`
	// Requests counts requests let through; Rejected those refused by the
	// breaker or the rate limit. Both reset when the record expires.
	Requests int64 `json:"requests"`
	Rejected int64 `json:"rejected"`
	// Blocked counts the pages of the host that were bot walls or CAPTCHA
	// interstitials (site.blocked), whatever their HTTP status: the
	// connection succeeded, so they do not count as failures toward the
	// breaker, but the site refused the environment. LastBlocked is the
	// last one's evidence.
	Blocked     int64  `json:"blocked"`
	LastBlocked string `json:"last_blocked,omitempty"`
}

// Tracker decides, per host, whether a request may go out now. It is safe
// for concurrent use and starts no goroutines.
type Tracker struct {
	b   Backend
	cfg Config
	ttl time.Duration
	log *slog.Logger
	// lastWarn is when a Backend failure was last logged (Unix ns).
	lastWarn atomic.Int64
}

// New returns a Tracker over b. A negative or NaN setting is an error
// (platform.misconfigured); zero settings take the defaults.
func New(b Backend, cfg Config, log *slog.Logger) (*Tracker, error) {
	if cfg.FailureThreshold < 0 || cfg.OpenFor < 0 || cfg.HalfOpenProbes < 0 || cfg.Burst < 0 ||
		cfg.RatePerSecond < 0 || math.IsNaN(cfg.RatePerSecond) || math.IsInf(cfg.RatePerSecond, 0) {
		return nil, faults.Newf(faults.CodeMisconfigured, faults.Internal, faults.Platform,
			"site health: invalid config %+v: settings must not be negative", cfg)
	}
	if cfg.FailureThreshold == 0 {
		cfg.FailureThreshold = DefaultFailureThreshold
	}
	if cfg.OpenFor == 0 {
		cfg.OpenFor = DefaultOpenFor
	}
	if cfg.HalfOpenProbes == 0 {
		cfg.HalfOpenProbes = DefaultHalfOpenProbes
	}
	cfg.Burst = max(cfg.Burst, 1)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	// An open breaker must outlive its rest even with a long OpenFor.
	return &Tracker{b: b, cfg: cfg, ttl: max(idleTTL, 2*cfg.OpenFor), log: log}, nil
}

// errNoChange aborts an Update whose record needs no write.
var errNoChange = errors.New("no change")

// Allow asks whether a request to host may go out. It returns at once
// with a site.unavailable fault (category unavailable, source site,
// retryable) while host's breaker is open, or half-open with its probes
// in flight. Under a rate limit it waits for the request's turn; when that
// turn comes after ctx's deadline it returns a site.rate_limited fault at
// once instead.
//
// On success the caller must call done exactly once with the request's
// outcome (later calls do nothing): failures that are the site's or the
// network's (see IsFailure) count toward opening the breaker; a
// cancellation, or a failure that never reached the host, decides nothing
// (a probe's slot is given back); anything else counts as success.
//
// If the Backend fails, the request is allowed and the failure logged
// (at most every ten seconds):
// the breaker protects sites and saves time, and losing its state must
// not stop every sandbox from reaching any site.
func (t *Tracker) Allow(ctx context.Context, host string) (done func(err error), err error) {
	host = strings.ToLower(host)
	var d decision
	err = t.b.Update(ctx, host, t.ttl, func(old []byte) ([]byte, error) {
		// The wait is slept on the real clock, so it is measured against
		// the real time left, whatever Config.Now says.
		left := time.Duration(-1)
		if deadline, ok := ctx.Deadline(); ok {
			left = max(0, time.Until(deadline))
		}
		now := t.cfg.Now()
		r := t.decode(old, now)
		d = t.admit(&r, host, now, left)
		return json.Marshal(r)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		t.warn(ctx, "site health unavailable, allowing requests", host, err)
		return func(error) {}, nil
	}
	t.logTransition(ctx, host, d.from, d.rec)
	if d.reject != nil {
		return nil, d.reject
	}
	if d.wait > 0 {
		timer := time.NewTimer(d.wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			// The turn is not given back (a later request may already
			// have been queued behind it), but a probe slot is, so the
			// breaker need not wait for the probe lease to end.
			if d.t.probe {
				t.update(ctx, host, func(r *record, _ time.Time) bool { return r.releaseProbe(d.t) })
			}
			return nil, context.Cause(ctx)
		}
	}
	var once sync.Once
	return func(err error) {
		once.Do(func() {
			t.update(ctx, host, func(r *record, now time.Time) bool { return t.report(r, now, d.t, err) })
		})
	}, nil
}

// ReportBlocked counts a page of host that was a bot wall or a CAPTCHA
// interstitial (site.blocked), with its evidence. A backend failure is
// logged, not returned: losing a count must not fail a step.
func (t *Tracker) ReportBlocked(ctx context.Context, host, evidence string) {
	host = strings.ToLower(host)
	if host == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	defer cancel()
	err := t.b.Update(ctx, host, t.ttl, func(old []byte) ([]byte, error) {
		r := t.decode(old, t.cfg.Now())
		r.Blocked++
		r.LastBlocked = evidence
		return json.Marshal(r)
	})
	if err != nil {
		t.warn(ctx, "site health unavailable, block not recorded", host, err)
	}
}

// update applies change to host's record; change reports whether it
// changed anything. It runs after the request's context may have ended,
// so it has its own short bound; a failure is logged, not returned.
func (t *Tracker) update(ctx context.Context, host string, change func(r *record, now time.Time) bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	defer cancel()
	var from, to record
	err := t.b.Update(ctx, host, t.ttl, func(old []byte) ([]byte, error) {
		if old == nil { // expired: the request's record is gone
			return nil, errNoChange
		}
		now := t.cfg.Now()
		r := t.decode(old, now)
		from = r
		if !change(&r, now) {
			return nil, errNoChange
		}
		to = r
		return json.Marshal(r)
	})
	switch {
	case err == nil:
		t.logTransition(ctx, host, from.State, to)
	case !errors.Is(err, errNoChange):
		t.warn(ctx, "site health unavailable, outcome not recorded", host, err)
	}
}

// warn logs a Backend failure, at most once per backendWarnEvery.
func (t *Tracker) warn(ctx context.Context, msg, host string, err error) {
	now, last := time.Now().UnixNano(), t.lastWarn.Load()
	if now-last < int64(backendWarnEvery) || !t.lastWarn.CompareAndSwap(last, now) {
		return
	}
	t.log.WarnContext(ctx, msg, "host", host, "error", err)
}

// report records the outcome err of a request admitted with ticket tk.
func (t *Tracker) report(r *record, now time.Time, tk ticket, err error) bool {
	if r.Gen != tk.gen {
		// Admitted before the breaker last opened: the outcome says
		// nothing about the host now.
		return false
	}
	if silent(err) {
		// The host was never heard from: the outcome decides nothing, but a
		// probe gives its slot back so that another may go at once.
		return tk.probe && r.releaseProbe(tk)
	}
	failed := IsFailure(err)
	switch r.State {
	case Closed:
		if !failed {
			if r.Failures == 0 {
				return false
			}
			r.Failures = 0
			return true
		}
		r.Failures++
		r.LastError = describe(err)
		if r.Failures >= t.cfg.FailureThreshold {
			r.open(now, t.cfg.OpenFor)
		}
	case HalfOpen:
		if failed {
			r.LastError = describe(err)
			r.open(now, t.cfg.OpenFor)
		} else {
			r.close()
		}
	default: // Open: a probe answering after its lease, when another re-opened it
		return false
	}
	return true
}

// logTransition logs a change of host's state from from to r's.
func (t *Tracker) logTransition(ctx context.Context, host string, from State, r record) {
	if from == r.State {
		return
	}
	args := []any{"host", host, "from", from, "to", r.State, "failures", r.Failures, "last_error", r.LastError}
	switch r.State {
	case Open:
		t.log.WarnContext(ctx, "site circuit opened", append(args, "until", r.Until)...)
	default:
		t.log.InfoContext(ctx, "site circuit "+strings.ReplaceAll(string(r.State), "_", "-"), args...)
	}
}

// Status returns the state of every host with a live record, sorted by
// host. An open breaker whose rest is over shows as half-open: the next
// request will probe.
func (t *Tracker) Status(ctx context.Context) ([]HostStatus, error) {
	recs, err := t.b.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("site health status: %w", err)
	}
	now := t.cfg.Now()
	out := make([]HostStatus, 0, len(recs))
	for host, b := range recs {
		r := t.decode(b, now)
		s := HostStatus{Host: host, State: r.State, Failures: r.Failures, OpenedAt: r.OpenedAt,
			LastError: r.LastError, Requests: r.Requests, Rejected: r.Rejected, Blocked: r.Blocked, LastBlocked: r.LastBlocked}
		if r.State == Open {
			if now.Before(r.Until) {
				s.Until = r.Until
			} else {
				s.State = HalfOpen
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, nil
}

// IsFailure reports whether an outcome counts against a host: a retryable
// failure that is the site's (an HTTP 5xx, a timeout, a reset) or the
// network's on the way to it (DNS, a proxy). Refusals by policy, client
// mistakes, non-retryable site answers (a 404) and cancellations do not.
// Neither does network.egress_unavailable: that is a sandbox's own tunnel
// to the server, and one sandbox's broken tunnel must not close a site for
// all of them. Nor do site.unavailable and site.rate_limited, the
// Tracker's own refusals: the host never saw those requests.
func IsFailure(err error) bool {
	if err == nil {
		return false
	}
	f := faults.Of(err)
	switch {
	case !f.Retryable:
		return false
	case f.Code == faults.CodeEgressUnavailable, f.Code == faults.CodeSiteUnavailable, f.Code == faults.CodeSiteRateLimited:
		return false
	}
	return f.Source == faults.Site || f.Source == faults.Network
}

// silent reports whether an outcome says nothing about the host either
// way: the caller gave up before the host answered (a canceled dial, its
// sandbox gone), the sandbox's own egress tunnel broke, or the Tracker
// itself refused. Such an outcome neither counts as a failure nor, as a
// success would, resets the run of failures or closes a half-open breaker.
func silent(err error) bool {
	if err == nil {
		return false
	}
	f := faults.Of(err)
	switch {
	case f.Category == faults.Canceled:
		return true
	case f.Code == faults.CodeEgressUnavailable, f.Code == faults.CodeSiteUnavailable, f.Code == faults.CodeSiteRateLimited:
		return true
	}
	return false
}

// describe is the LastError text of a failure: its class and safe message.
func describe(err error) string {
	f := faults.Of(err)
	s := f.Code
	if f.Message != "" {
		s += ": " + f.Message
	}
	if len(s) > maxLastError {
		s = strings.ToValidUTF8(s[:maxLastError], "")
	}
	return s
}
