package retry

import (
	"context"
	"errors"
	"time"
)

// ErrExhausted is Backoff's answer when its Policy allows no further
// wait: Attempts tries were made, or the wait would end after the Budget.
var ErrExhausted = errors.New("retry: backoff attempts or budget spent")

// Backoff hands out the waits of a Policy one at a time, for the loops
// that Do does not fit: supervisors that restart what dies and pollers
// that wait for a condition, which run until their context ends, and
// loops whose attempts must not be canceled by a budget (a command that
// runs for minutes once it started). Each wait is the one Do would make
// after as many failures: a random fraction of Initial·2^(n-1), capped at
// Max. Reset starts over after a success.
//
// Of the Policy, Backoff uses Initial, Max, Rand and OnRetry, and:
// Attempts, when above 0, bounds the tries (Attempts-1 waits; 0 means no
// bound, unlike Do); Budget, when above 0, refuses a wait that would end
// more than Budget after the Backoff was made or last Reset.
// PerAttempt and Retryable are the loop's business.
//
// A Backoff is not safe for concurrent use.
type Backoff struct {
	p     Policy
	n     int       // waits handed out since the start or the last Reset
	start time.Time // the start of the Budget
}

// NewBackoff returns the waits of p, starting with the first.
func NewBackoff(p Policy) *Backoff {
	attempts := p.Attempts
	p = p.withDefaults()
	p.Attempts = attempts
	return &Backoff{p: p, start: time.Now()}
}

// Reset starts over: the next wait is the first one again, and the Budget
// counts from now.
func (b *Backoff) Reset() {
	b.n = 0
	b.start = time.Now()
}

// Next returns the wait before the next try after failure err (nil when
// the loop has no error to give): the delay err asks for when it carries
// one (see After), else the next backoff. ok is false when the Policy
// allows no more tries; nothing is counted then.
func (b *Backoff) Next(err error) (wait time.Duration, ok bool) {
	if b.p.Attempts > 0 && b.n+1 >= b.p.Attempts {
		return 0, false
	}
	wait = b.p.backoff(b.n + 1)
	if d, asked := After(err); asked {
		wait = d
	}
	if b.p.Budget > 0 && time.Since(b.start)+wait > b.p.Budget {
		return 0, false
	}
	b.n++
	if b.p.OnRetry != nil {
		b.p.OnRetry(b.n, err)
	}
	return wait, true
}

// Wait waits Next(err), or until ctx ends. It returns nil after the wait,
// ErrExhausted when the Policy allows no more tries, and
// context.Cause(ctx) when ctx ended first.
func (b *Backoff) Wait(ctx context.Context, err error) error {
	d, ok := b.Next(err)
	if !ok {
		return ErrExhausted
	}
	return Sleep(ctx, d)
}

// Failures is the number of waits handed out since the start or the last
// Reset: the failures in a row, for a loop that waits after each.
func (b *Backoff) Failures() int { return b.n }

// Sleep waits d, or until ctx ends: then it returns context.Cause(ctx).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Delay is the wait after failure n (n ≥ 1) under p: a random fraction of
// Cap(n). For loops that count their failures themselves (and report the
// count); others use a Backoff.
func (p Policy) Delay(n int) time.Duration {
	return p.withDefaults().backoff(max(n, 1))
}

// Cap is the longest wait after failure n (n ≥ 1) under p:
// Initial·2^(n-1), at most Max.
func (p Policy) Cap(n int) time.Duration {
	return p.withDefaults().ceiling(max(n, 1))
}

// RetryAfterError is an error that carries the delay its source asked for
// before it is tried again: an HTTP answer's Retry-After, say. Do and
// Backoff wait that delay instead of their own backoff, within the
// Budget, and only when the error is retried at all.
type RetryAfterError interface {
	error
	RetryAfter() time.Duration
}

// After returns the delay err asks for before the next try: that of the
// first RetryAfterError in its chain, 0 when it asks for a negative one.
// ok is false when err asks for none.
func After(err error) (d time.Duration, ok bool) {
	var ra RetryAfterError
	if err == nil || !errors.As(err, &ra) {
		return 0, false
	}
	return max(ra.RetryAfter(), 0), true
}

// WithRetryAfter returns err asking to be tried again no sooner than d. It
// wraps err: its class (faults.Of) and text stay as they are.
func WithRetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfter{err: err, d: d}
}

type retryAfter struct {
	err error
	d   time.Duration
}

func (e *retryAfter) Error() string             { return e.err.Error() }
func (e *retryAfter) Unwrap() error             { return e.err }
func (e *retryAfter) RetryAfter() time.Duration { return e.d }
