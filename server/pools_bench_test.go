package server_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// BenchmarkPoolClaim compares a warm pool's claim with a cold create of
// the same spec, each timed from the POST to a sandbox ready for work
// (for the claim the POST's own answer; for the cold create POST then
// /wait). Each iteration makes one of each; the pool is refilled and the
// sandboxes deleted outside the timings.
//
//	go test -run '^$' -bench BenchmarkPoolClaim -benchtime 20x ./server/
func BenchmarkPoolClaim(b *testing.B) {
	b.Run("shell", func(b *testing.B) {
		benchPoolClaim(b, map[string]any{"image": "host", "block_network": true, "memory": "256Mi"}, nil)
	})
	browser := map[string]any{"image": "host", "kind": "browser", "block_network": true}
	b.Run("browser", func(b *testing.B) {
		testenv.RequireChromium(b)
		benchPoolClaim(b, browser, nil)
	})
	// A claim that resizes the browser: one more round trip to its daemon.
	b.Run("browser-viewport", func(b *testing.B) {
		testenv.RequireChromium(b)
		benchPoolClaim(b, browser, map[string]any{"viewport": map[string]any{"width": 1024, "height": 768}})
	})
}

// benchPoolClaim times claims from a pool of spec (with browser settings
// of their own when browser is not nil) against cold creates.
func benchPoolClaim(b *testing.B, spec, browser map[string]any) {
	srv := testserver.Start(b, testserver.Options{})
	// The cold creates name a memory the pool's spec does not have, so
	// they never match it: the same work as the pool's own starts.
	cold := with(spec, "memory", "300Mi")
	createPool(b, srv, "bench", 1, spec)
	awaitPool(b, srv, "bench", full)
	var claims, colds []time.Duration
	for b.Loop() {
		start := time.Now()
		status, body := post(b, srv, "/sandboxes", cold)
		if status != 200 {
			b.Fatalf("cold create: %d %v", status, body)
		}
		id, _ := body["sandbox_id"].(string)
		if w := getWait(b, srv, id); w["status"] != "ready" {
			b.Fatalf("cold create: %v", w)
		}
		colds = append(colds, time.Since(start))
		if err := del(srv, id); err != nil {
			b.Fatal(err)
		}

		awaitPool(b, srv, "bench", full)
		req := spec
		if browser != nil {
			req = with(spec, "browser", browser)
		}
		start = time.Now()
		status, body = post(b, srv, "/sandboxes", req)
		d := time.Since(start)
		if status != 200 || body["ready"] != true || body["pool"] != "bench" {
			b.Fatalf("claim: %d %v", status, body)
		}
		claims = append(claims, d)
		if err := del(srv, body["sandbox_id"].(string)); err != nil {
			b.Fatal(err)
		}
	}
	p := poolOf(b, call(b, srv, http.MethodGet, "/pools/bench", nil))
	if p.Claims != len(claims) || p.Misses != 0 {
		b.Fatalf("pool counts %+v after %d claims", p, len(claims))
	}
	c50, k50 := percentile(claims, 0.5), percentile(colds, 0.5)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(c50), "claim-p50-ms")
	b.ReportMetric(ms(percentile(claims, 0.9)), "claim-p90-ms")
	b.ReportMetric(ms(k50), "cold-p50-ms")
	b.ReportMetric(float64(k50)/float64(c50), "cold/claim")
}
