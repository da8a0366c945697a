package sitehealth

import (
	"encoding/json"
	"time"

	"github.com/orchard/orchard/faults"
)

// record is what a Backend stores per host, as JSON. Its fields are not
// API: only HostStatus is.
type record struct {
	State State `json:"state"`
	// Gen counts the openings of the breaker. An outcome reported with an
	// older generation than the record's is ignored.
	Gen      int64     `json:"gen"`
	Failures int       `json:"failures,omitempty"`
	OpenedAt time.Time `json:"opened_at,omitzero"`
	// Until is, while open, when the rest ends; while half-open with
	// probes in flight, when their lease ends and new probes may go.
	Until     time.Time `json:"until,omitzero"`
	Probes    int       `json:"probes,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	Requests  int64     `json:"requests"`
	Rejected  int64     `json:"rejected"`
	// Blocked counts pages that were bot walls or CAPTCHA interstitials
	// (site.blocked), whatever their status; LastBlocked is the last
	// one's evidence.
	Blocked     int64  `json:"blocked,omitempty"`
	LastBlocked string `json:"last_blocked,omitempty"`
	// Tokens is the rate limiter's bucket as of TokensAt. It goes below
	// zero when turns are handed out ahead of time to waiting requests.
	Tokens   float64   `json:"tokens"`
	TokensAt time.Time `json:"tokens_at,omitzero"`
}

// decode reads a stored record. No record, or one that cannot be read
// (written by an incompatible version), starts afresh: losing a count
// only delays a breaker.
func (t *Tracker) decode(b []byte, now time.Time) record {
	var r record
	if b != nil && json.Unmarshal(b, &r) == nil {
		switch r.State {
		case Closed, Open, HalfOpen:
			return r
		}
	}
	return record{State: Closed, Tokens: float64(t.cfg.Burst), TokensAt: now}
}

func (r *record) open(now time.Time, d time.Duration) {
	r.State, r.Gen, r.OpenedAt, r.Until, r.Probes = Open, r.Gen+1, now, now.Add(d), 0
}

func (r *record) close() {
	r.State, r.Failures, r.Until, r.Probes = Closed, 0, time.Time{}, 0
}

// releaseProbe gives back the probe slot of a request that never went out.
func (r *record) releaseProbe(tk ticket) bool {
	if r.State != HalfOpen || r.Gen != tk.gen || r.Probes == 0 {
		return false
	}
	r.Probes--
	return true
}

// refill adds the tokens earned since TokensAt. A TokensAt ahead of now
// (another replica's clock runs ahead) earns nothing and stays.
func (r *record) refill(now time.Time, rate float64, burst int) {
	if el := now.Sub(r.TokensAt); el > 0 {
		r.Tokens = min(float64(burst), r.Tokens+el.Seconds()*rate)
		r.TokensAt = now
	}
}

// ticket identifies an admitted request when it reports its outcome.
type ticket struct {
	gen   int64
	probe bool
}

// decision is admit's verdict on one request.
type decision struct {
	t      ticket
	wait   time.Duration // until the request's turn under the rate limit
	reject error         // non-nil: the request must not go out
	from   State         // the state before the request
	rec    record        // the record after it
}

// admit decides on a request to host at now and updates r for it. left is
// how long the request may wait for its turn; negative means no bound.
func (t *Tracker) admit(r *record, host string, now time.Time, left time.Duration) (d decision) {
	d.from = r.State
	defer func() { d.rec = *r }()
	if r.State == Open && !now.Before(r.Until) {
		r.State, r.Until, r.Probes = HalfOpen, time.Time{}, 0
	}
	switch r.State {
	case Open:
		r.Rejected++
		d.reject = faults.Newf(faults.CodeSiteUnavailable, faults.Unavailable, faults.Site,
			"%s is unavailable: requests to it are paused for %s after repeated failures (last: %s)",
			host, r.Until.Sub(now).Round(time.Second), r.LastError)
		return d
	case HalfOpen:
		if r.Probes >= t.cfg.HalfOpenProbes {
			if now.Before(r.Until) {
				r.Rejected++
				d.reject = faults.Newf(faults.CodeSiteUnavailable, faults.Unavailable, faults.Site,
					"%s is unavailable: it failed repeatedly and is being probed (last: %s)", host, r.LastError)
				return d
			}
			// The probes' lease is over: they are presumed lost (their
			// server died, or a caller never reported).
			r.Probes = 0
		}
		d.t.probe = true
	}
	if rate := t.cfg.RatePerSecond; rate > 0 {
		r.refill(now, rate, t.cfg.Burst)
		if r.Tokens < 1 {
			d.wait = time.Duration((1 - r.Tokens) / rate * float64(time.Second))
			if left >= 0 && d.wait > left {
				r.Rejected++
				d.reject = faults.Newf(faults.CodeSiteRateLimited, faults.Capacity, faults.Site,
					"requests to %s are limited to %g per second: the next turn is in %s, after the request's deadline",
					host, rate, d.wait.Round(time.Millisecond))
				return d
			}
		}
		r.Tokens--
	}
	if d.t.probe {
		r.Probes++
		r.Until = now.Add(d.wait + t.cfg.OpenFor)
	}
	r.Requests++
	d.t.gen = r.Gen
	return d
}
