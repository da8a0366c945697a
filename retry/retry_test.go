package retry_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/retry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	errUnavailable = faults.New(faults.CodeSiteHTTPPrefix+"503", faults.Unavailable, faults.Site, "site answered 503")
	errInvalid     = faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "bad input")
)

// script returns an operation whose attempt n returns errs[n-1] (nil past
// the end).
func script(errs ...error) func(context.Context, int) error {
	return func(_ context.Context, n int) error {
		if n <= len(errs) {
			return errs[n-1]
		}
		return nil
	}
}

// fast is a policy whose waits are negligible.
func fast(attempts int) retry.Policy {
	return retry.Policy{Attempts: attempts, Initial: time.Millisecond, Max: time.Millisecond, Rand: func() float64 { return 0.5 }}
}

func TestDo(t *testing.T) {
	t.Parallel()
	always := func(error) bool { return true }
	tests := []struct {
		name     string
		policy   retry.Policy
		errs     []error
		count    int
		outcome  retry.Outcome
		wantCode string // "" means success
	}{
		{"fails twice then succeeds", fast(5), []error{errUnavailable, errUnavailable}, 3, retry.Succeeded, ""},
		{"first attempt succeeds", fast(5), nil, 1, retry.Succeeded, ""},
		{"non-retryable is not retried", fast(5), []error{errInvalid}, 1, retry.NotRetryable, faults.CodeValidation},
		{"unclassified is not retryable", fast(5), []error{errors.New("boom")}, 1, retry.NotRetryable, faults.CodeInternal},
		{"attempts exhausted keeps the last class", fast(3),
			[]error{faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "bad input").WithRetryable(true), errUnavailable, errUnavailable, errUnavailable}, 3, retry.AttemptsExhausted, "site.http_503"},
		{"zero attempts means one", fast(0), []error{errUnavailable}, 1, retry.AttemptsExhausted, "site.http_503"},
		{"custom predicate", func() retry.Policy { p := fast(2); p.Retryable = always; return p }(),
			[]error{errors.New("boom")}, 2, retry.Succeeded, ""},
		{"bare deadline error is a retryable timeout", fast(2),
			[]error{context.DeadlineExceeded, context.DeadlineExceeded}, 2, retry.AttemptsExhausted, faults.CodeTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := retry.Do(context.Background(), tt.policy, script(tt.errs...))
			if res.Count() != tt.count || res.Outcome != tt.outcome {
				t.Fatalf("%d attempts, outcome %s; want %d, %s", res.Count(), res.Outcome, tt.count, tt.outcome)
			}
			if tt.wantCode == "" {
				if err != nil || res.LastErr() != nil {
					t.Fatalf("err %v, last %v; want nil", err, res.LastErr())
				}
				return
			}
			if got := faults.Of(err).Code; got != tt.wantCode {
				t.Fatalf("class %q (%v), want %q", got, err, tt.wantCode)
			}
			if !errors.Is(err, res.LastErr()) {
				t.Fatalf("%v does not wrap the last error %v", err, res.LastErr())
			}
			for i, a := range res.Attempts {
				if a.N != i+1 || a.Err == nil {
					t.Fatalf("attempt %d: %+v", i, a)
				}
			}
		})
	}
}

func TestDoValue(t *testing.T) {
	t.Parallel()
	v, res, err := retry.DoValue(context.Background(), fast(3), func(_ context.Context, n int) (string, error) {
		if n < 2 {
			return "partial", errUnavailable
		}
		return "ok", nil
	})
	if v != "ok" || err != nil || res.Count() != 2 {
		t.Fatalf("%q, %v after %d attempts", v, err, res.Count())
	}
	v, _, err = retry.DoValue(context.Background(), fast(1), func(context.Context, int) (string, error) { return "partial", errInvalid })
	if v != "" || err == nil {
		t.Fatalf("failed run gave %q, %v; want the zero value and an error", v, err)
	}
}

func TestOnRetry(t *testing.T) {
	t.Parallel()
	var seen []int
	p := fast(4)
	p.OnRetry = func(n int, err error) {
		if !errors.Is(err, errUnavailable) {
			t.Errorf("OnRetry(%d, %v)", n, err)
		}
		seen = append(seen, n)
	}
	if _, err := retry.Do(context.Background(), p, script(errUnavailable, errUnavailable)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(seen, []int{1, 2}) {
		t.Fatalf("OnRetry saw attempts %v, want [1 2]", seen)
	}
}

// The loop never waits past the budget: it hands back the last failure as
// soon as the next wait would end after it, and cuts an attempt that runs
// into it.
func TestBudget(t *testing.T) {
	t.Parallel()
	const budget = 300 * time.Millisecond
	// Each wait is 50 ms (Rand just under 1), so six attempts fit and the
	// seventh's wait would pass the budget.
	p := retry.Policy{Attempts: 100, Budget: budget, Initial: 50 * time.Millisecond, Max: 50 * time.Millisecond,
		Rand: func() float64 { return 0.9999 }}
	tests := []struct {
		name     string
		fn       func(ctx context.Context, n int) error
		wantCode string
		minTime  time.Duration
	}{
		{"fast failures", script(repeat(100, errUnavailable)...), "site.http_503", 200 * time.Millisecond},
		{"attempt runs into the budget", func(ctx context.Context, n int) error {
			if n == 1 {
				return errUnavailable
			}
			<-ctx.Done()
			return ctx.Err()
		}, faults.CodeTimeout, budget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			res, err := retry.Do(context.Background(), p, tt.fn)
			took := time.Since(start)
			if res.Outcome != retry.BudgetExhausted {
				t.Fatalf("outcome %s, want %s", res.Outcome, retry.BudgetExhausted)
			}
			if got := faults.Of(err).Code; got != tt.wantCode {
				t.Fatalf("class %q (%v), want %q", got, err, tt.wantCode)
			}
			// Generous upper margin for a loaded CI machine; the point is
			// that no 50 ms wait, let alone more attempts, follows.
			if took < tt.minTime || took > budget+150*time.Millisecond {
				t.Fatalf("took %v, want within [%v, %v+150ms]", took, tt.minTime, budget)
			}
			if res.Attempts[len(res.Attempts)-1].Wait != 0 {
				t.Fatalf("last attempt has a wait: %+v", res.Attempts)
			}
		})
	}
}

func repeat(n int, err error) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

// A wait that would end after the caller's deadline is not started either.
func TestCallerDeadlineStopsEarly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p := retry.Policy{Attempts: 5, Initial: 10 * time.Second, Max: 10 * time.Second, Rand: func() float64 { return 0.5 }}
	start := time.Now()
	res, err := retry.Do(ctx, p, script(errUnavailable, errUnavailable))
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Fatalf("took %v: waited although the deadline forbids the next attempt", took)
	}
	if res.Count() != 1 || res.Outcome != retry.BudgetExhausted || faults.Of(err).Code != "site.http_503" {
		t.Fatalf("%d attempts, %s, %v", res.Count(), res.Outcome, err)
	}
}

// The caller's deadline ending an attempt is the budget running out: the
// error has the class of the deadline's cause.
func TestCallerDeadlineCause(t *testing.T) {
	t.Parallel()
	cause := faults.New(faults.CodeExecTimeout, faults.Timeout, faults.Sandbox, "execution timed out")
	ctx, cancel := context.WithTimeoutCause(context.Background(), 50*time.Millisecond, cause)
	defer cancel()
	res, err := retry.Do(ctx, fast(3), func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() })
	if res.Count() != 1 || res.Outcome != retry.BudgetExhausted {
		t.Fatalf("%d attempts, %s", res.Count(), res.Outcome)
	}
	if got := faults.Of(err).Code; got != faults.CodeExecTimeout || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("class %q (%v), want %s wrapping the deadline", got, err, faults.CodeExecTimeout)
	}
}

func TestPerAttemptTimeout(t *testing.T) {
	t.Parallel()
	const per = 30 * time.Millisecond
	tests := []struct {
		name     string
		fn       func(ctx context.Context, n int) error
		wantCode string
	}{
		{"bare context error", func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() }, faults.CodeTimeout},
		{"cause", func(ctx context.Context, _ int) error { <-ctx.Done(); return context.Cause(ctx) }, faults.CodeTimeout},
		{"operation's own class wins", func(ctx context.Context, _ int) error {
			<-ctx.Done()
			return faults.Wrap(ctx.Err(), faults.CodeSiteTimeout, faults.Timeout, faults.Site, "site did not answer")
		}, faults.CodeSiteTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := fast(2)
			p.PerAttempt = per
			res, err := retry.Do(context.Background(), p, tt.fn)
			f := faults.Of(err)
			if f.Code != tt.wantCode || f.Category != faults.Timeout || !f.Retryable {
				t.Fatalf("class %+v (%v), want %s, timeout, retryable", f.Info(), err, tt.wantCode)
			}
			if res.Count() != 2 || res.Outcome != retry.AttemptsExhausted {
				t.Fatalf("%d attempts, %s: a timeout must be retried", res.Count(), res.Outcome)
			}
			for _, a := range res.Attempts {
				if a.Duration < per || a.Duration > per+time.Second {
					t.Fatalf("attempt ran %v, want about %v", a.Duration, per)
				}
				if a.Err.Category != faults.Timeout {
					t.Fatalf("attempt class %+v", a.Err)
				}
			}
		})
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		fn   func(ctx context.Context, n int) error
	}{
		{"during the wait", script(errUnavailable, errUnavailable)},
		{"during an attempt", func(ctx context.Context, n int) error { <-ctx.Done(); return ctx.Err() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			p := retry.Policy{Attempts: 5, Initial: 10 * time.Second, Max: 10 * time.Second, Rand: func() float64 { return 0.5 }}
			start := time.Now()
			res, err := retry.Do(ctx, p, tt.fn)
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("took %v after cancel", took)
			}
			if res.Outcome != retry.Canceled || res.Count() != 1 {
				t.Fatalf("%d attempts, %s", res.Count(), res.Outcome)
			}
			if f := faults.Of(err); f.Category != faults.Canceled || !errors.Is(err, context.Canceled) {
				t.Fatalf("class %+v (%v), want canceled", f.Info(), err)
			}
		})
	}
	t.Run("before the first attempt", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var calls atomic.Int32
		res, err := retry.Do(ctx, fast(3), func(context.Context, int) error { calls.Add(1); return nil })
		if calls.Load() != 0 || res.Count() != 0 || res.Outcome != retry.Canceled || !errors.Is(err, context.Canceled) {
			t.Fatalf("%d calls, %d attempts, %s, %v", calls.Load(), res.Count(), res.Outcome, err)
		}
	})
}

// Waits are a fraction Rand of a cap that doubles from Initial up to Max.
func TestJitterBounds(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	tests := []struct {
		name  string
		rand  float64
		waits []time.Duration // after attempts 1..5
	}{
		{"no jitter draw", 0, []time.Duration{0, 0, 0, 0, 0}},
		{"half", 0.5, []time.Duration{5 * ms, 10 * ms, 20 * ms, 20 * ms, 20 * ms}},
		{"almost all", 0.999, []time.Duration{9990 * time.Microsecond, 19980 * time.Microsecond,
			39960 * time.Microsecond, 39960 * time.Microsecond, 39960 * time.Microsecond}},
		{"out of range is no wait", 1.5, []time.Duration{0, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := retry.Policy{Attempts: 6, Initial: 10 * ms, Max: 40 * ms, Rand: func() float64 { return tt.rand }}
			res, _ := retry.Do(context.Background(), p, script(repeat(6, errUnavailable)...))
			var got []time.Duration
			for _, a := range res.Attempts[:5] {
				got = append(got, a.Wait)
			}
			if !reflect.DeepEqual(got, tt.waits) {
				t.Fatalf("waits %v, want %v", got, tt.waits)
			}
		})
	}
}

func TestResultJSON(t *testing.T) {
	t.Parallel()
	p := fast(3)
	res, _ := retry.Do(context.Background(), p, script(errUnavailable))
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	attempts, _ := raw["attempts"].([]any)
	if raw["outcome"] != "succeeded" || raw["elapsed_ms"] == nil || len(attempts) != 2 {
		t.Fatalf("result JSON %s", b)
	}
	first := attempts[0].(map[string]any)
	if first["attempt"] != 1.0 || first["wait_ms"] != 0.5 || first["duration_ms"] == nil ||
		first["error"].(map[string]any)["code"] != "site.http_503" {
		t.Fatalf("attempt JSON %s", b)
	}
	if _, ok := attempts[1].(map[string]any)["error"]; ok {
		t.Fatalf("successful attempt has an error: %s", b)
	}
	var back retry.Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Count() != 2 || back.Attempts[0].Wait != p.Max/2 || back.Attempts[0].Err.Code != "site.http_503" || back.Outcome != retry.Succeeded {
		t.Fatalf("round trip: %+v", back)
	}
}
