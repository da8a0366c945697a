package retry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/retry"
)

// half is a jitter source that always draws the middle of the cap.
func half() float64 { return 0.5 }

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// A Backoff hands out Do's waits one at a time: doubling caps, the same
// jitter, Attempts and Budget as bounds, a failure's Retry-After in place
// of the backoff, and Reset to start over.
func TestBackoffNext(t *testing.T) {
	t.Parallel()
	unavailable := faults.New(faults.CodeStoreUnavailable, faults.Unavailable, faults.Platform, "store down")
	type step struct {
		err   error         // the failure handed to Next
		reset bool          // Reset before this step
		wait  time.Duration // want
		ok    bool
	}
	tests := []struct {
		name   string
		policy retry.Policy
		steps  []step
	}{
		{"doubles up to Max", retry.Policy{Initial: ms(10), Max: ms(40), Rand: half}, []step{
			{wait: ms(5), ok: true}, {wait: ms(10), ok: true}, {wait: ms(20), ok: true}, {wait: ms(20), ok: true}}},
		{"defaults", retry.Policy{Rand: half}, []step{
			{wait: retry.DefaultInitial / 2, ok: true}, {wait: retry.DefaultInitial, ok: true}}},
		{"no Attempts means no bound", retry.Policy{Initial: ms(1), Max: ms(1), Rand: half},
			func() []step {
				s := make([]step, 50)
				for i := range s {
					s[i] = step{wait: ms(0.5), ok: true}
				}
				return s
			}()},
		{"Attempts bounds the tries", retry.Policy{Attempts: 3, Initial: ms(10), Max: ms(40), Rand: half}, []step{
			{wait: ms(5), ok: true}, {wait: ms(10), ok: true}, {ok: false}, {ok: false}}},
		{"Reset starts over", retry.Policy{Attempts: 3, Initial: ms(10), Max: ms(40), Rand: half}, []step{
			{wait: ms(5), ok: true}, {wait: ms(10), ok: true}, {ok: false},
			{reset: true, wait: ms(5), ok: true}, {wait: ms(10), ok: true}}},
		{"a failure's Retry-After replaces the backoff", retry.Policy{Initial: ms(10), Max: ms(40), Rand: half}, []step{
			{err: retry.WithRetryAfter(unavailable, ms(300)), wait: ms(300), ok: true},
			{err: unavailable, wait: ms(10), ok: true},
			{err: retry.WithRetryAfter(unavailable, 0), wait: 0, ok: true},
			{err: retry.WithRetryAfter(unavailable, -time.Second), wait: 0, ok: true}}},
		{"Budget refuses a wait that would end after it", retry.Policy{Budget: time.Second, Initial: ms(10), Max: ms(40), Rand: half}, []step{
			{wait: ms(5), ok: true},
			{err: retry.WithRetryAfter(unavailable, 2*time.Second), ok: false},
			{wait: ms(10), ok: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := retry.NewBackoff(tt.policy)
			n := 0
			for i, s := range tt.steps {
				if s.reset {
					b.Reset()
					n = 0
				}
				wait, ok := b.Next(s.err)
				if ok {
					n++
				}
				if wait != s.wait || ok != s.ok || b.Failures() != n {
					t.Fatalf("step %d: Next = %v, %v, %d failures; want %v, %v, %d", i, wait, ok, b.Failures(), s.wait, s.ok, n)
				}
			}
		})
	}
}

func TestBackoffOnRetry(t *testing.T) {
	t.Parallel()
	var got []string
	p := retry.Policy{Attempts: 3, Initial: ms(1), Rand: half, OnRetry: func(n int, err error) { got = append(got, fmt.Sprintf("%d:%v", n, err)) }}
	b := retry.NewBackoff(p)
	for _, err := range []error{errors.New("a"), nil, errors.New("c")} {
		b.Next(err)
	}
	if fmt.Sprint(got) != "[1:a 2:<nil>]" {
		t.Fatalf("OnRetry saw %v; want [1:a 2:<nil>]", got)
	}
}

// Wait sleeps the wait, stops at once when the Policy allows no more,
// and ends with the context's cause.
func TestBackoffWait(t *testing.T) {
	t.Parallel()
	b := retry.NewBackoff(retry.Policy{Attempts: 2, Initial: ms(40), Max: ms(40), Rand: func() float64 { return 0.99 }})
	start := time.Now()
	if err := b.Wait(context.Background(), nil); err != nil || time.Since(start) < ms(39) {
		t.Fatalf("first Wait: %v after %v; want nil after about 40ms", err, time.Since(start))
	}
	start = time.Now()
	if err := b.Wait(context.Background(), nil); !errors.Is(err, retry.ErrExhausted) || time.Since(start) > ms(20) {
		t.Fatalf("Wait past Attempts: %v after %v; want ErrExhausted at once", err, time.Since(start))
	}

	cause := errors.New("supervisor stopped")
	ctx, cancel := context.WithCancelCause(context.Background())
	b = retry.NewBackoff(retry.Policy{Initial: time.Hour, Max: time.Hour, Rand: half})
	time.AfterFunc(ms(20), func() { cancel(cause) })
	start = time.Now()
	if err := b.Wait(ctx, nil); err != cause || time.Since(start) > 10*time.Second {
		t.Fatalf("Wait canceled: %v after %v; want the cause at once", err, time.Since(start))
	}
	if err := retry.Sleep(ctx, time.Hour); err != cause {
		t.Fatalf("Sleep on an ended context: %v; want its cause", err)
	}
}

func TestPolicyDelayAndCap(t *testing.T) {
	t.Parallel()
	p := retry.Policy{Initial: ms(200), Max: ms(5000), Rand: half}
	tests := []struct {
		n          int
		cap, delay time.Duration
	}{
		{0, ms(200), ms(100)}, {1, ms(200), ms(100)}, {2, ms(400), ms(200)}, {3, ms(800), ms(400)},
		{5, ms(3200), ms(1600)}, {6, ms(5000), ms(2500)}, {100, ms(5000), ms(2500)},
	}
	for _, tt := range tests {
		if c, d := p.Cap(tt.n), p.Delay(tt.n); c != tt.cap || d != tt.delay {
			t.Errorf("n=%d: Cap %v, Delay %v; want %v, %v", tt.n, c, d, tt.cap, tt.delay)
		}
	}
}

// After finds a Retry-After anywhere in the chain; WithRetryAfter keeps
// the error's class and text.
func TestAfter(t *testing.T) {
	t.Parallel()
	base := faults.New(faults.CodeSiteHTTPPrefix+"503", faults.Unavailable, faults.Site, "site answered 503")
	tests := []struct {
		name string
		err  error
		d    time.Duration
		ok   bool
	}{
		{"nil", nil, 0, false},
		{"none", base, 0, false},
		{"direct", retry.WithRetryAfter(base, time.Second), time.Second, true},
		{"wrapped", fmt.Errorf("fetch: %w", retry.WithRetryAfter(base, 2*time.Second)), 2 * time.Second, true},
		{"negative is now", retry.WithRetryAfter(base, -time.Second), 0, true},
	}
	for _, tt := range tests {
		if d, ok := retry.After(tt.err); d != tt.d || ok != tt.ok {
			t.Errorf("%s: After = %v, %v; want %v, %v", tt.name, d, ok, tt.d, tt.ok)
		}
	}
	if retry.WithRetryAfter(nil, time.Second) != nil {
		t.Error("WithRetryAfter(nil) is not nil")
	}
	e := retry.WithRetryAfter(base, time.Second)
	if e.Error() != base.Error() || faults.Of(e) != base {
		t.Errorf("WithRetryAfter changed the error: %q, %v", e, faults.Of(e))
	}
}

// Do waits what a failure asks for instead of its backoff, and stops
// rather than come back sooner than asked when the Budget is too short.
func TestDoRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		policy  retry.Policy
		after   time.Duration
		count   int
		outcome retry.Outcome
		waits   []time.Duration
	}{
		{"honoured instead of the backoff", retry.Policy{Attempts: 3, Initial: time.Hour, Max: time.Hour, Rand: half}, ms(30),
			3, retry.Succeeded, []time.Duration{ms(30), ms(30), 0}},
		{"zero retries at once", retry.Policy{Attempts: 3, Initial: time.Hour, Max: time.Hour, Rand: half}, 0,
			3, retry.Succeeded, []time.Duration{0, 0, 0}},
		{"bounded by the budget", retry.Policy{Attempts: 3, Budget: ms(200), Initial: ms(1), Max: ms(1), Rand: half}, time.Minute,
			1, retry.BudgetExhausted, []time.Duration{0}},
		{"not retryable is not waited", retry.Policy{Attempts: 3, Initial: ms(1), Rand: half, Retryable: func(error) bool { return false }}, time.Minute,
			1, retry.NotRetryable, []time.Duration{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := retry.Do(context.Background(), tt.policy, func(_ context.Context, n int) error {
				if n < 3 {
					return retry.WithRetryAfter(errUnavailable, tt.after)
				}
				return nil
			})
			if res.Count() != tt.count || res.Outcome != tt.outcome {
				t.Fatalf("%d attempts, %s (%v); want %d, %s", res.Count(), res.Outcome, err, tt.count, tt.outcome)
			}
			for i, a := range res.Attempts {
				if a.Wait != tt.waits[i] {
					t.Errorf("attempt %d waited %v; want %v", a.N, a.Wait, tt.waits[i])
				}
			}
			if tt.outcome != retry.Succeeded && faults.Of(err).Code != errUnavailable.Code {
				t.Errorf("error class %q; want the attempt's, %q", faults.Of(err).Code, errUnavailable.Code)
			}
		})
	}
}
