// Package sitehealthtest is the contract every sitehealth.Backend must
// pass, run both directly and through a sitehealth.Tracker: the memory
// backend runs it in-process, the Redis store against a real redis-server.
package sitehealthtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/sitehealth"
)

// Run runs the contract against backends made by newBackend (a fresh,
// empty backend per call).
func Run(t *testing.T, newBackend func(t *testing.T) sitehealth.Backend) {
	// The backend alone.
	t.Run("UpdateAndList", func(t *testing.T) { testUpdateAndList(t, newBackend(t)) })
	t.Run("Expiry", func(t *testing.T) { testExpiry(t, newBackend(t)) })
	t.Run("AtomicUpdates", func(t *testing.T) { testAtomicUpdates(t, newBackend(t)) })

	// A Tracker over it.
	t.Run("OpensAfterThreshold", func(t *testing.T) { testOpensAfterThreshold(t, newBackend(t)) })
	t.Run("FailuresMustBeConsecutive", func(t *testing.T) { testConsecutive(t, newBackend(t)) })
	t.Run("WhichOutcomesCount", func(t *testing.T) { testWhichOutcomesCount(t, newBackend) })
	t.Run("HalfOpenProbeCloses", func(t *testing.T) { testProbeCloses(t, newBackend(t)) })
	t.Run("FailedProbeReopens", func(t *testing.T) { testProbeReopens(t, newBackend(t)) })
	t.Run("LostProbeIsReplaced", func(t *testing.T) { testLostProbe(t, newBackend(t)) })
	t.Run("StaleOutcomesIgnored", func(t *testing.T) { testStaleOutcomes(t, newBackend(t)) })
	t.Run("CanceledOutcomesDecideNothing", func(t *testing.T) { testCanceledOutcomes(t, newBackend) })
	t.Run("SharedBetweenTrackers", func(t *testing.T) { testShared(t, newBackend(t)) })
	t.Run("RateLimitSpacesRequests", func(t *testing.T) { testRateSpacing(t, newBackend(t)) })
	t.Run("RateLimitDeadline", func(t *testing.T) { testRateDeadline(t, newBackend(t)) })
	t.Run("RateLimitCanceled", func(t *testing.T) { testRateCanceled(t, newBackend(t)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, newBackend(t)) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// clock is a manual clock for Config.Now.
type clock struct {
	mu  sync.Mutex // guards now
	now time.Time
}

func newClock() *clock { return &clock{now: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

const openFor = 200 * time.Millisecond

// tracker is a Tracker over b on clock c with a threshold of 3.
func tracker(t *testing.T, b sitehealth.Backend, c *clock, cfg sitehealth.Config) *sitehealth.Tracker {
	t.Helper()
	if cfg.FailureThreshold == 0 {
		cfg.FailureThreshold = 3
	}
	if cfg.OpenFor == 0 {
		cfg.OpenFor = openFor
	}
	if c != nil {
		cfg.Now = c.Now
	}
	tr, err := sitehealth.New(b, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

var (
	err503  = faults.New(faults.CodeSiteHTTPPrefix+"503", faults.Unavailable, faults.Site, "the site answered 503")
	errDNS  = faults.New(faults.CodeNetworkDNS, faults.Unavailable, faults.Network, "name resolution failed")
	err404  = faults.New(faults.CodeSiteHTTPPrefix+"404", faults.NotFound, faults.Site, "the site answered 404")
	errDeny = faults.New(faults.CodeEgressDenied, faults.PermissionDenied, faults.Policy, "host not allowed")
)

// request makes one request to host with outcome err; it returns Allow's
// error.
func request(t *testing.T, tr *sitehealth.Tracker, host string, err error) error {
	t.Helper()
	done, aerr := tr.Allow(ctx(t), host)
	if aerr != nil {
		if done != nil {
			t.Fatalf("Allow returned a done func with error %v", aerr)
		}
		return aerr
	}
	done(err)
	return nil
}

func mustAllow(t *testing.T, tr *sitehealth.Tracker, host string, err error) {
	t.Helper()
	if aerr := request(t, tr, host, err); aerr != nil {
		t.Fatalf("request to %s refused: %v", host, aerr)
	}
}

func wantUnavailable(t *testing.T, err error) {
	t.Helper()
	f := faults.Of(err)
	if err == nil || f.Code != faults.CodeSiteUnavailable || f.Category != faults.Unavailable ||
		f.Source != faults.Site || !f.Retryable {
		t.Fatalf("got %v (%+v), want site.unavailable, unavailable, site, retryable", err, f)
	}
}

func status(t *testing.T, tr *sitehealth.Tracker, host string) sitehealth.HostStatus {
	t.Helper()
	all, err := tr.Status(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.Host == host {
			return s
		}
	}
	t.Fatalf("no status for %s in %+v", host, all)
	return sitehealth.HostStatus{}
}

func testUpdateAndList(t *testing.T, b sitehealth.Backend) {
	c := ctx(t)
	set := func(host, v string) {
		t.Helper()
		if err := b.Update(c, host, time.Minute, func([]byte) ([]byte, error) { return []byte(v), nil }); err != nil {
			t.Fatal(err)
		}
	}
	var seen []byte
	if err := b.Update(c, "a.test", time.Minute, func(old []byte) ([]byte, error) {
		seen = old
		return []byte("1"), nil
	}); err != nil || seen != nil {
		t.Fatalf("first update saw %q, %v; want nil", seen, err)
	}
	set("b.test", "x")
	boom := errors.New("boom")
	if err := b.Update(c, "a.test", time.Minute, func(old []byte) ([]byte, error) {
		seen = old
		return []byte("2"), boom
	}); !errors.Is(err, boom) || string(seen) != "1" {
		t.Fatalf("failing update saw %q and returned %v", seen, err)
	}
	all, err := b.List(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || string(all["a.test"]) != "1" || string(all["b.test"]) != "x" {
		t.Fatalf("List = %q; the failed update must not have written", all)
	}
}

func testExpiry(t *testing.T, b sitehealth.Backend) {
	c := ctx(t)
	if err := b.Update(c, "short.test", 100*time.Millisecond, func([]byte) ([]byte, error) { return []byte("1"), nil }); err != nil {
		t.Fatal(err)
	}
	if err := b.Update(c, "long.test", time.Minute, func([]byte) ([]byte, error) { return []byte("1"), nil }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond)
	all, err := b.List(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := all["short.test"]; ok || len(all) != 1 {
		t.Fatalf("List after expiry = %q, want only long.test", all)
	}
	if err := b.Update(c, "short.test", time.Minute, func(old []byte) ([]byte, error) {
		if old != nil {
			t.Errorf("expired record still read: %q", old)
		}
		return []byte("2"), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Concurrent read-modify-writes of one record lose no update.
func testAtomicUpdates(t *testing.T, b sitehealth.Backend) {
	c := ctx(t)
	const writers, rounds = 16, 25
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range rounds {
				if err := b.Update(c, "count.test", time.Minute, func(old []byte) ([]byte, error) {
					n, _ := strconv.Atoi(string(old))
					return []byte(strconv.Itoa(n + 1)), nil
				}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	all, err := b.List(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(all["count.test"]); got != strconv.Itoa(writers*rounds) {
		t.Fatalf("counter = %s after %d increments", got, writers*rounds)
	}
}

func testOpensAfterThreshold(t *testing.T, b sitehealth.Backend) {
	tr := tracker(t, b, newClock(), sitehealth.Config{})
	for range 3 {
		mustAllow(t, tr, "down.test", err503)
	}
	start := time.Now()
	wantUnavailable(t, request(t, tr, "down.test", nil))
	if took := time.Since(start); took > time.Second {
		t.Fatalf("an open breaker took %v to refuse", took)
	}
	// Hosts are independent, and names are case-insensitive.
	mustAllow(t, tr, "up.test", nil)
	wantUnavailable(t, request(t, tr, "DOWN.test", nil))
	s := status(t, tr, "down.test")
	if s.State != sitehealth.Open || s.Failures != 3 || s.Requests != 3 || s.Rejected != 2 ||
		s.OpenedAt.IsZero() || s.Until.Sub(s.OpenedAt) != openFor || s.LastError != "site.http_503: the site answered 503" {
		t.Fatalf("status %+v", s)
	}
}

func testConsecutive(t *testing.T, b sitehealth.Backend) {
	tr := tracker(t, b, newClock(), sitehealth.Config{})
	for _, err := range []error{err503, err503, nil, err503, err503, errDeny, err503, err503} {
		mustAllow(t, tr, "flaky.test", err)
	}
	if s := status(t, tr, "flaky.test"); s.State != sitehealth.Closed || s.Failures != 2 {
		t.Fatalf("status %+v, want closed with 2 failures", s)
	}
}

func testWhichOutcomesCount(t *testing.T, newBackend func(t *testing.T) sitehealth.Backend) {
	tests := []struct {
		name  string
		err   error
		opens bool
	}{
		{"site 5xx", err503, true},
		{"network dns", errDNS, true},
		{"wrapped site timeout", fmt.Errorf("navigate: %w",
			faults.New(faults.CodeSiteTimeout, faults.Timeout, faults.Site, "no answer")), true},
		{"success", nil, false},
		{"site 404", err404, false},
		{"policy", errDeny, false},
		{"client", faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "bad"), false},
		{"canceled", context.Canceled, false},
		{"egress tunnel down", faults.New(faults.CodeEgressUnavailable, faults.Unavailable, faults.Network, "tunnel down"), false},
		{"own refusal", faults.New(faults.CodeSiteUnavailable, faults.Unavailable, faults.Site, "paused"), false},
		{"unclassified", errors.New("boom"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := tracker(t, newBackend(t), newClock(), sitehealth.Config{})
			for range 3 {
				mustAllow(t, tr, "h.test", tt.err)
			}
			if got := request(t, tr, "h.test", nil) != nil; got != tt.opens {
				t.Fatalf("after 3 × %v: breaker open = %v, want %v", tt.err, got, tt.opens)
			}
		})
	}
}

// open trips host's breaker on tr.
func open(t *testing.T, tr *sitehealth.Tracker, host string) {
	t.Helper()
	for range 3 {
		mustAllow(t, tr, host, err503)
	}
	wantUnavailable(t, request(t, tr, host, nil))
}

func testProbeCloses(t *testing.T, b sitehealth.Backend) {
	c := newClock()
	tr := tracker(t, b, c, sitehealth.Config{})
	open(t, tr, "h.test")
	c.Advance(openFor - time.Millisecond)
	wantUnavailable(t, request(t, tr, "h.test", nil))
	c.Advance(time.Millisecond)
	if s := status(t, tr, "h.test"); s.State != sitehealth.HalfOpen {
		t.Fatalf("status after the rest %+v, want half_open", s)
	}
	probe, err := tr.Allow(ctx(t), "h.test")
	if err != nil {
		t.Fatalf("probe refused: %v", err)
	}
	// One probe at a time.
	wantUnavailable(t, request(t, tr, "h.test", nil))
	probe(nil)
	probe(err503) // a second call does nothing
	if s := status(t, tr, "h.test"); s.State != sitehealth.Closed || s.Failures != 0 {
		t.Fatalf("status after a good probe %+v, want closed", s)
	}
	mustAllow(t, tr, "h.test", nil)
	mustAllow(t, tr, "h.test", nil)
}

func testProbeReopens(t *testing.T, b sitehealth.Backend) {
	c := newClock()
	tr := tracker(t, b, c, sitehealth.Config{})
	open(t, tr, "h.test")
	c.Advance(openFor)
	mustAllow(t, tr, "h.test", errDNS)
	s := status(t, tr, "h.test")
	if s.State != sitehealth.Open || !s.OpenedAt.Equal(c.Now()) || !s.Until.Equal(c.Now().Add(openFor)) ||
		s.LastError != "network.dns: name resolution failed" {
		t.Fatalf("status after a failed probe %+v, want open again from now", s)
	}
	wantUnavailable(t, request(t, tr, "h.test", nil))
	c.Advance(openFor)
	mustAllow(t, tr, "h.test", nil)
	mustAllow(t, tr, "h.test", nil)
}

// A probe that never reports holds its slot only for OpenFor.
func testLostProbe(t *testing.T, b sitehealth.Backend) {
	c := newClock()
	tr := tracker(t, b, c, sitehealth.Config{})
	open(t, tr, "h.test")
	c.Advance(openFor)
	lost, err := tr.Allow(ctx(t), "h.test")
	if err != nil {
		t.Fatal(err)
	}
	wantUnavailable(t, request(t, tr, "h.test", nil))
	c.Advance(openFor)
	mustAllow(t, tr, "h.test", nil)
	// Too late to decide anything: the breaker closed meanwhile, so this
	// counts as one failure of the closed breaker.
	lost(err503)
	if s := status(t, tr, "h.test"); s.State != sitehealth.Closed || s.Failures != 1 {
		t.Fatalf("status %+v, want closed with 1 failure", s)
	}
}

// An outcome of a request admitted before the breaker opened says nothing
// about the host now.
func testStaleOutcomes(t *testing.T, b sitehealth.Backend) {
	c := newClock()
	tr := tracker(t, b, c, sitehealth.Config{})
	slow, err := tr.Allow(ctx(t), "h.test")
	if err != nil {
		t.Fatal(err)
	}
	open(t, tr, "h.test")
	slow(nil)
	wantUnavailable(t, request(t, tr, "h.test", nil))
	c.Advance(openFor)
	probe, err := tr.Allow(ctx(t), "h.test")
	if err != nil {
		t.Fatal(err)
	}
	probe(nil)
	slowFail, err := tr.Allow(ctx(t), "h.test")
	if err != nil {
		t.Fatal(err)
	}
	open(t, tr, "h.test")
	c.Advance(openFor)
	slowFail(err503) // from the previous closed period: must not re-open
	mustAllow(t, tr, "h.test", nil)
	if s := status(t, tr, "h.test"); s.State != sitehealth.Closed {
		t.Fatalf("status %+v, want closed", s)
	}
}

// Trackers over one backend (sandboxes of one server, or replicas) share
// each host's breaker.
func testShared(t *testing.T, b sitehealth.Backend) {
	c := newClock()
	a, other := tracker(t, b, c, sitehealth.Config{}), tracker(t, b, c, sitehealth.Config{})
	mustAllow(t, a, "h.test", err503)
	mustAllow(t, other, "h.test", err503)
	mustAllow(t, a, "h.test", err503)
	wantUnavailable(t, request(t, other, "h.test", nil))
	c.Advance(openFor)
	probe, err := other.Allow(ctx(t), "h.test")
	if err != nil {
		t.Fatal(err)
	}
	wantUnavailable(t, request(t, a, "h.test", nil))
	probe(nil)
	mustAllow(t, a, "h.test", nil)
}

func testRateSpacing(t *testing.T, b sitehealth.Backend) {
	tests := []struct {
		name         string
		rate         float64
		burst, n     int
		minT, maxT   time.Duration
		host         string
		parallelRuns bool
	}{
		// 5 requests at 20/s: the first goes at once, then one per 50 ms.
		{name: "sequential", rate: 20, burst: 1, n: 5, minT: 190 * time.Millisecond, maxT: 2 * time.Second, host: "seq.test"},
		// A burst of 3 goes at once; the 4th waits 100 ms.
		{name: "burst", rate: 10, burst: 3, n: 4, minT: 90 * time.Millisecond, maxT: 2 * time.Second, host: "burst.test"},
		// 6 requests at once at 50/s are spread over 100 ms.
		{name: "concurrent", rate: 50, burst: 1, n: 6, minT: 90 * time.Millisecond, maxT: 2 * time.Second, host: "conc.test", parallelRuns: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := tracker(t, b, nil, sitehealth.Config{RatePerSecond: tt.rate, Burst: tt.burst})
			start := time.Now()
			var wg sync.WaitGroup
			for range tt.n {
				run := func() { mustAllowAsync(t, tr, tt.host) }
				if tt.parallelRuns {
					wg.Go(run)
				} else {
					run()
				}
			}
			wg.Wait()
			if took := time.Since(start); took < tt.minT || took > tt.maxT {
				t.Fatalf("%d requests at %g/s, burst %d, took %v; want within [%v, %v]", tt.n, tt.rate, tt.burst, took, tt.minT, tt.maxT)
			}
		})
	}
}

// mustAllowAsync is mustAllow for use off the test's goroutine.
func mustAllowAsync(t *testing.T, tr *sitehealth.Tracker, host string) {
	done, err := tr.Allow(ctx(t), host)
	if err != nil {
		t.Errorf("request to %s refused: %v", host, err)
		return
	}
	done(nil)
}

// A request whose turn would come after its deadline fails at once.
func testRateDeadline(t *testing.T, b sitehealth.Backend) {
	tr := tracker(t, b, nil, sitehealth.Config{RatePerSecond: 2, Burst: 1})
	mustAllow(t, tr, "h.test", nil)
	c, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	done, err := tr.Allow(c, "h.test")
	if took := time.Since(start); took > 150*time.Millisecond {
		t.Fatalf("refusal took %v: it must not wait", took)
	}
	f := faults.Of(err)
	if done != nil || f == nil || f.Code != faults.CodeSiteRateLimited || f.Category != faults.Capacity ||
		f.Source != faults.Site || !f.Retryable {
		t.Fatalf("got %v (%+v), want site.rate_limited, capacity, site, retryable", err, f)
	}
	// With time enough, it waits for its turn (the refused one took none).
	c, cancel = context.WithTimeout(ctx(t), 2*time.Second)
	defer cancel()
	start = time.Now()
	if done, err = tr.Allow(c, "h.test"); err != nil {
		t.Fatal(err)
	}
	done(nil)
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Fatalf("second request went after %v, want about 500ms", took)
	}
	if s := status(t, tr, "h.test"); s.Requests != 2 || s.Rejected != 1 {
		t.Fatalf("status %+v", s)
	}
}

func testRateCanceled(t *testing.T, b sitehealth.Backend) {
	tr := tracker(t, b, nil, sitehealth.Config{RatePerSecond: 0.5, Burst: 1})
	mustAllow(t, tr, "h.test", nil)
	c, cancel := context.WithCancel(ctx(t))
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	done, err := tr.Allow(c, "h.test")
	if took := time.Since(start); took > time.Second || done != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled wait: %v after %v", err, took)
	}
}

// Many goroutines on few hosts: every request is either let through or
// refused, and counted once (run with -race).
func testConcurrent(t *testing.T, b sitehealth.Backend) {
	tr := tracker(t, b, nil, sitehealth.Config{OpenFor: 20 * time.Millisecond, HalfOpenProbes: 2})
	const workers, rounds = 16, 20
	hosts := []string{"a.test", "b.test", "c.test"}
	c := ctx(t)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				// a.test always fails, so its breaker cycles through every
				// state while the others stay closed.
				host := hosts[(w+i)%len(hosts)]
				done, err := tr.Allow(c, host)
				if err != nil {
					if !faults.Is(err, faults.CodeSiteUnavailable) {
						t.Errorf("Allow: %v", err)
					}
					continue
				}
				if host == "a.test" {
					done(err503)
				} else {
					done(nil)
				}
			}
		})
	}
	wg.Wait()
	all, err := tr.Status(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, s := range all {
		total += s.Requests + s.Rejected
	}
	if len(all) != len(hosts) || total != workers*rounds {
		t.Fatalf("%d hosts counted %d requests, want %d and %d: %+v", len(all), total, len(hosts), workers*rounds, all)
	}
}

// A request its caller gave up on (the sandbox went away mid-dial) never
// heard from the host: it neither closes a half-open breaker nor breaks a
// run of failures. A canceled probe gives its slot back.
func testCanceledOutcomes(t *testing.T, newBackend func(t *testing.T) sitehealth.Backend) {
	canceled := []struct {
		name string
		err  error
	}{
		{"context canceled", context.Canceled},
		{"classified", faults.Wrap(context.Canceled, faults.CodeCanceled, faults.Canceled, faults.Client, "connect canceled")},
	}
	for _, tt := range canceled {
		t.Run(tt.name+"/half-open", func(t *testing.T) {
			c := newClock()
			tr := tracker(t, newBackend(t), c, sitehealth.Config{})
			open(t, tr, "h.test")
			c.Advance(openFor)
			mustAllow(t, tr, "h.test", tt.err)
			if s := status(t, tr, "h.test"); s.State != sitehealth.HalfOpen {
				t.Fatalf("status after a canceled probe %+v, want still half_open", s)
			}
			// Its slot is free: the next request probes, and its failure re-opens.
			mustAllow(t, tr, "h.test", err503)
			if s := status(t, tr, "h.test"); s.State != sitehealth.Open {
				t.Fatalf("status after a failed probe %+v, want open", s)
			}
		})
		t.Run(tt.name+"/closed", func(t *testing.T) {
			tr := tracker(t, newBackend(t), newClock(), sitehealth.Config{})
			for _, err := range []error{err503, err503, tt.err, err503} {
				mustAllow(t, tr, "h.test", err)
			}
			if s := status(t, tr, "h.test"); s.State != sitehealth.Open {
				t.Fatalf("status %+v: a canceled request broke the run of failures", s)
			}
		})
	}
}
