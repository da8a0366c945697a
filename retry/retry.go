// Package retry is the project's one retry loop: it runs an operation again
// while it fails with a retryable error, within a Policy that bounds the
// number of attempts, the wall-clock time spent, the time of each attempt,
// and spaces attempts with exponential backoff and full jitter, or with
// the delay a failure asks for (RetryAfterError). Every retry goes through
// it, so every retry is bounded and reported the same way: Do and DoValue
// for an operation tried until it succeeds; Backoff for the loops that run
// until their context ends (supervisors restarting what dies, pollers
// waiting for a condition), which take their waits from the same Policy.
package retry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/orchard/orchard/faults"
)

const (
	// DefaultInitial is the backoff cap before the second attempt when a
	// Policy sets none: a connection reset or a restarting peer usually
	// clears within a few hundred milliseconds.
	DefaultInitial = 100 * time.Millisecond
	// DefaultMax caps one backoff when a Policy sets none: a failure that
	// lasts longer is better waited out with a larger Budget than with
	// longer, rarer attempts.
	DefaultMax = 10 * time.Second
)

// Policy says how often and how long an operation is tried. The zero
// Policy makes a single attempt.
type Policy struct {
	// Attempts is the total number of attempts, the first included; 0 or
	// less means 1.
	Attempts int
	// Budget caps the wall-clock time of all attempts and waits together;
	// 0 means no cap beyond the caller's context. An attempt still running
	// when it is spent is canceled, and no wait is started that would end
	// after it.
	Budget time.Duration
	// PerAttempt bounds each attempt; 0 means no bound. An attempt that
	// hits it fails with a timeout (platform.timeout, retryable) unless
	// the operation classified its failure itself.
	PerAttempt time.Duration
	// Initial caps the backoff before the second attempt; the cap doubles
	// for each further attempt up to Max. The wait is a uniformly random
	// fraction of the cap ("full jitter"), so callers that failed together
	// do not retry together. 0 means DefaultInitial, and Max 0 means
	// DefaultMax; a Max below Initial is raised to it.
	Initial, Max time.Duration
	// Retryable reports whether a failed attempt may be repeated; nil
	// means faults.IsRetryable.
	Retryable func(error) bool
	// OnRetry, if set, is called after failed attempt number attempt when
	// another attempt will follow, before the backoff: the hook for
	// metrics and logs.
	OnRetry func(attempt int, err error)
	// Rand returns the jitter fraction in [0, 1); nil means math/rand/v2.
	// Tests set it to make waits predictable.
	Rand func() float64
}

func (p Policy) withDefaults() Policy {
	p.Attempts = max(p.Attempts, 1)
	if p.Initial <= 0 {
		p.Initial = DefaultInitial
	}
	if p.Max <= 0 {
		p.Max = DefaultMax
	}
	p.Max = max(p.Max, p.Initial)
	if p.Retryable == nil {
		p.Retryable = faults.IsRetryable
	}
	if p.Rand == nil {
		p.Rand = rand.Float64
	}
	return p
}

// backoff is the wait after failed attempt n (n ≥ 1): a random fraction of
// Initial·2^(n-1), capped at Max.
func (p Policy) backoff(n int) time.Duration {
	c := p.ceiling(n)
	f := p.Rand()
	if f < 0 || f >= 1 || math.IsNaN(f) { // a broken source must not stretch the wait
		f = 0
	}
	return time.Duration(f * float64(c))
}

// ceiling is the cap of the wait after failed attempt n (n ≥ 1):
// Initial·2^(n-1), at most Max.
func (p Policy) ceiling(n int) time.Duration {
	c := p.Initial
	for i := 1; i < n && c < p.Max; i++ {
		if c > p.Max/2 { // doubling would pass Max (or overflow)
			c = p.Max
			break
		}
		c *= 2
	}
	return min(c, p.Max)
}

// Outcome says why the loop stopped. The strings are bounded, for metric
// labels.
type Outcome string

// Outcomes.
const (
	// Succeeded: the last attempt returned nil.
	Succeeded Outcome = "succeeded"
	// NotRetryable: the last attempt failed with an error Retryable refused.
	NotRetryable Outcome = "not_retryable"
	// AttemptsExhausted: every attempt of the policy failed.
	AttemptsExhausted Outcome = "attempts_exhausted"
	// BudgetExhausted: the Budget, or the caller's deadline, was spent or
	// would be before the next attempt could start. The error keeps the
	// last attempt's class.
	BudgetExhausted Outcome = "budget_exhausted"
	// Canceled: the caller canceled the context (a deadline is
	// BudgetExhausted).
	Canceled Outcome = "canceled"
)

// Do calls fn until it succeeds or p says to stop, and reports each
// attempt. attempt counts from 1; ctx is canceled when the attempt's time
// (PerAttempt, Budget or the caller's) is up. A failure that carries a
// Retry-After (RetryAfterError) is waited out for the delay it asks
// instead of the backoff; when that delay would pass the Budget or the
// caller's deadline, the loop stops (BudgetExhausted) rather than come
// back sooner than asked.
//
// The error is nil on success. Otherwise it wraps the last attempt's
// error, so faults.Of gives that attempt's class — also when the attempts,
// the budget or the caller's deadline ran out — except when the caller
// canceled ctx: then it is the class of context.Cause(ctx), and mentions
// the last error in its text. An attempt that returns a bare context error
// because its deadline passed takes the class of the deadline's cause
// (platform.timeout for PerAttempt and Budget).
func Do(ctx context.Context, p Policy, fn func(ctx context.Context, attempt int) error) (Result, error) {
	_, res, err := DoValue(ctx, p, func(ctx context.Context, attempt int) (struct{}, error) {
		return struct{}{}, fn(ctx, attempt)
	})
	return res, err
}

// DoValue is Do for an operation that returns a value: the value of the
// successful attempt, or the zero value.
func DoValue[T any](ctx context.Context, p Policy, fn func(ctx context.Context, attempt int) (T, error)) (T, Result, error) {
	p = p.withDefaults()
	start := time.Now()
	var res Result
	finish := func(o Outcome, err error) error {
		res.Outcome, res.Elapsed = o, time.Since(start)
		return err
	}
	var zero T
	caller := ctx
	if p.Budget > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, p.Budget,
			faults.Newf(faults.CodeTimeout, faults.Timeout, faults.Platform, "retry budget of %s spent", p.Budget))
		defer cancel()
	}
	for n := 1; ; n++ {
		if ctx.Err() != nil { // canceled, or out of time before attempt n
			o, err := ended(caller, ctx, n-1, res.last)
			return zero, res, finish(o, err)
		}
		v, took, err := attempt(ctx, p, n, fn)
		a := Attempt{N: n, Duration: took}
		if err == nil {
			res.Attempts = append(res.Attempts, a)
			res.last = nil
			return v, res, finish(Succeeded, nil)
		}
		info := faults.Of(err).Info()
		a.Err = &info
		res.Attempts = append(res.Attempts, a)
		res.last = err
		switch {
		case canceled(caller):
			return zero, res, finish(Canceled, canceledError(caller, n, err))
		case !p.Retryable(err):
			return zero, res, finish(NotRetryable, gaveUp(n, NotRetryable, err))
		case n >= p.Attempts:
			return zero, res, finish(AttemptsExhausted, gaveUp(n, AttemptsExhausted, err))
		case ctx.Err() != nil:
			return zero, res, finish(BudgetExhausted, gaveUp(n, BudgetExhausted, err))
		}
		wait := p.backoff(n)
		if d, asked := After(err); asked { // the failure's source said when to come back
			wait = d
		}
		// Waiting until (or past) the deadline would leave the next attempt
		// no time at all: better to hand back the real failure now than a
		// timeout later.
		if d, ok := ctx.Deadline(); ok && !time.Now().Add(wait).Before(d) {
			return zero, res, finish(BudgetExhausted, gaveUp(n, BudgetExhausted, err))
		}
		res.Attempts[len(res.Attempts)-1].Wait = wait
		if p.OnRetry != nil {
			p.OnRetry(n, err)
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				o, err := ended(caller, ctx, n, err)
				return zero, res, finish(o, err)
			}
		}
	}
}

// canceled reports whether the caller canceled ctx, as opposed to its
// deadline passing.
func canceled(caller context.Context) bool {
	return caller.Err() != nil && !errors.Is(caller.Err(), context.DeadlineExceeded)
}

// ended is the outcome and error of a loop whose context (ctx, the caller's
// with the budget) ended after n attempts, the last of which failed with
// last. A deadline, the caller's or the budget's, is the budget running
// out: the error keeps the last attempt's class.
func ended(caller, ctx context.Context, n int, last error) (Outcome, error) {
	switch {
	case canceled(caller):
		return Canceled, canceledError(caller, n, last)
	case last == nil:
		return BudgetExhausted, fmt.Errorf("%s before the first attempt: %w", BudgetExhausted, faults.Of(context.Cause(ctx)))
	}
	return BudgetExhausted, gaveUp(n, BudgetExhausted, last)
}

// attempt runs attempt n under its own timeout, within ctx.
func attempt[T any](ctx context.Context, p Policy, n int, fn func(context.Context, int) (T, error)) (T, time.Duration, error) {
	// Started before the deadline is set, so an attempt that ran out its
	// time measures at least PerAttempt.
	start := time.Now()
	actx := ctx
	if p.PerAttempt > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeoutCause(ctx, p.PerAttempt,
			faults.Newf(faults.CodeTimeout, faults.Timeout, faults.Platform, "attempt %d timed out after %s", n, p.PerAttempt))
		defer cancel()
	}
	v, err := fn(actx, n)
	took := time.Since(start)
	// An attempt cut short by a deadline usually returns a bare context
	// error; give it the class of the deadline's cause (PerAttempt's,
	// Budget's or the caller's own). A failure the operation classified
	// itself keeps its class: the code that first sees a failure knows it
	// best.
	if err != nil && actx.Err() != nil && !classified(err) {
		if cause := context.Cause(actx); cause != actx.Err() && !errors.Is(err, cause) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
	}
	return v, took, err
}

func classified(err error) bool {
	var e *faults.Error
	return errors.As(err, &e)
}

// gaveUp wraps the last error of a loop that stopped after n attempts.
func gaveUp(n int, o Outcome, last error) error {
	return fmt.Errorf("%s after %d %s: %w", o, n, plural(n), last)
}

// canceledError is the error of a loop whose caller canceled ctx: the
// cancellation's class, with the last failure in its text.
func canceledError(caller context.Context, n int, last error) error {
	cause := faults.Of(context.Cause(caller))
	if last == nil {
		return fmt.Errorf("%s before the first attempt: %w", Canceled, cause)
	}
	return fmt.Errorf("%s after %d %s (last error: %v): %w", Canceled, n, plural(n), last, cause)
}

func plural(n int) string {
	if n == 1 {
		return "attempt"
	}
	return "attempts"
}
