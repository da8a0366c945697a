package redis_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/sitehealth"
	"github.com/orchard/orchard/sitehealth/sitehealthtest"
)

func TestSiteHealthContract(t *testing.T) {
	srv := testenv.StartRedis(t)
	sitehealthtest.Run(t, func(t *testing.T) sitehealth.Backend { return open(t, srv.URL(), uniquePrefix()).SiteHealth() })
}

// Two replicas share one breaker per host: failures seen by one open it
// for the other.
func TestSiteHealthReplicas(t *testing.T) {
	_, a, b := replicas(t)
	cfg := sitehealth.Config{FailureThreshold: 2, OpenFor: time.Minute}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ta, err := sitehealth.New(a.SiteHealth(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := sitehealth.New(b.SiteHealth(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	fail := faults.New(faults.CodeSiteConnectionReset, faults.Unavailable, faults.Site, "connection reset")
	for _, tr := range []*sitehealth.Tracker{ta, tb} {
		done, err := tr.Allow(c, "shared.test")
		if err != nil {
			t.Fatal(err)
		}
		done(fail)
	}
	if _, err := ta.Allow(c, "shared.test"); !faults.Is(err, faults.CodeSiteUnavailable) {
		t.Fatalf("replica a after failures on a and b: %v", err)
	}
	st, err := tb.Status(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].State != sitehealth.Open || st[0].Requests != 2 || st[0].Rejected != 1 {
		t.Fatalf("replica b's status %+v", st)
	}
}

// Keys follow the documented layout, expire when idle, and the index
// forgets expired hosts.
func TestSiteHealthLayout(t *testing.T) {
	srv := testenv.StartRedis(t)
	h := open(t, srv.URL(), "orchard:").SiteHealth()
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer raw.Close()
	c := ctx(t)
	set := func(host string, ttl time.Duration) {
		t.Helper()
		if err := h.Update(c, host, ttl, func([]byte) ([]byte, error) { return []byte(`{}`), nil }); err != nil {
			t.Fatal(err)
		}
	}
	set("idle.test", 100*time.Millisecond)
	set("kept.test", time.Minute)
	if ttl := raw.PTTL(c, "orchard:site:kept.test").Val(); ttl <= 50*time.Second || ttl > time.Minute {
		t.Fatalf("record TTL %v, want about a minute", ttl)
	}
	if ttl := raw.PTTL(c, "orchard:sites").Val(); ttl <= 50*time.Second {
		t.Fatalf("index TTL %v, want about a minute", ttl)
	}
	if m := raw.ZRange(c, "orchard:sites", 0, -1).Val(); len(m) != 2 {
		t.Fatalf("index %v", m)
	}
	time.Sleep(200 * time.Millisecond)
	set("kept.test", time.Minute) // prunes idle.test from the index
	if n := raw.Exists(c, "orchard:site:idle.test").Val(); n != 0 {
		t.Fatal("idle record did not expire")
	}
	if m := raw.ZRange(c, "orchard:sites", 0, -1).Val(); len(m) != 1 || m[0] != "kept.test" {
		t.Fatalf("index after expiry %v, want [kept.test]", m)
	}
	// A record without a TTL stays listed.
	set("forever.test", 0)
	if ttl := raw.TTL(c, "orchard:site:forever.test").Val(); ttl != -1 {
		t.Fatalf("record TTL %v, want none", ttl)
	}
	all, err := h.List(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all["forever.test"] == nil || all["kept.test"] == nil {
		t.Fatalf("List = %q", all)
	}
}

// With Redis down, calls fail fast as store_unavailable and the Tracker
// lets requests through.
func TestSiteHealthRedisDown(t *testing.T) {
	srv := testenv.StartRedis(t)
	h := open(t, srv.URL(), uniquePrefix()).SiteHealth()
	tr, err := sitehealth.New(h, sitehealth.Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	c := ctx(t)
	if _, err := h.List(c); !faults.Is(err, faults.CodeStoreUnavailable) {
		t.Fatalf("List with Redis down: %v", err)
	}
	start := time.Now()
	done, err := tr.Allow(c, "h.test")
	if err != nil {
		t.Fatalf("Allow with Redis down: %v", err)
	}
	done(nil)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Allow with Redis down took %v", took)
	}
}
