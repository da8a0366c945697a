package sitehealth_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/sitehealth"
	"github.com/orchard/orchard/sitehealth/sitehealthtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestMemoryContract(t *testing.T) {
	sitehealthtest.Run(t, func(*testing.T) sitehealth.Backend { return sitehealth.NewMemory() })
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  sitehealth.Config
		ok   bool
	}{
		{"zero takes defaults", sitehealth.Config{}, true},
		{"negative threshold", sitehealth.Config{FailureThreshold: -1}, false},
		{"negative open", sitehealth.Config{OpenFor: -time.Second}, false},
		{"negative probes", sitehealth.Config{HalfOpenProbes: -1}, false},
		{"negative rate", sitehealth.Config{RatePerSecond: -1}, false},
		{"negative burst", sitehealth.Config{RatePerSecond: 1, Burst: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := sitehealth.New(sitehealth.NewMemory(), tt.cfg, nil)
			if (err == nil) != tt.ok {
				t.Fatalf("New(%+v) = %v", tt.cfg, err)
			}
			if err != nil && faults.Of(err).Code != faults.CodeMisconfigured {
				t.Fatalf("class %+v", faults.Of(err))
			}
		})
	}
}

func TestHostStatusJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b, err := json.Marshal([]sitehealth.HostStatus{
		{Host: "a.test", State: sitehealth.HalfOpen, Failures: 5, OpenedAt: at, Until: at.Add(time.Second),
			LastError: "site.http_503: x", Requests: 7, Rejected: 2},
		{Host: "b.test", State: sitehealth.Closed},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"host":"a.test","state":"half_open","failures":5,"opened_at":"2026-01-02T03:04:05Z",` +
		`"until":"2026-01-02T03:04:06Z","last_error":"site.http_503: x","requests":7,"rejected":2,"blocked":0},` +
		`{"host":"b.test","state":"closed","failures":0,"requests":0,"rejected":0,"blocked":0}]`
	if string(b) != want {
		t.Fatalf("JSON\n%s\nwant\n%s", b, want)
	}
}

// brokenBackend fails every call, as a shared store that is down.
type brokenBackend struct{}

var errDown = faults.New(faults.CodeStoreUnavailable, faults.Unavailable, faults.Platform, "state store unavailable")

func (brokenBackend) Update(context.Context, string, time.Duration, func([]byte) ([]byte, error)) error {
	return errDown
}

func (brokenBackend) List(context.Context) (map[string][]byte, error) { return nil, errDown }

// Losing the shared state must not stop requests; Status reports it.
func TestBackendDownAllows(t *testing.T) {
	t.Parallel()
	tr, err := sitehealth.New(brokenBackend{}, sitehealth.Config{RatePerSecond: 1}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		done, err := tr.Allow(context.Background(), "h.test")
		if err != nil {
			t.Fatalf("Allow with the backend down: %v", err)
		}
		done(errors.New("whatever"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tr.Allow(ctx, "h.test"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Allow of a canceled request: %v", err)
	}
	if _, err := tr.Status(context.Background()); !errors.Is(err, errDown) {
		t.Fatalf("Status: %v", err)
	}
}
