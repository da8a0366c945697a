package server_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// BenchmarkEpisodes: whole episodes of the offline shop task (create with
// setup, start page, three scripted steps, finish with evaluation,
// recording on) at 1, 4 and 16 at once; episodes per minute and the
// step latency seen by the policy.
//
//	ORCHARD_AGENT=$PWD/bin/orchard-agent go test -tags seccomp -run XXX -bench Episodes -benchtime 1x ./server/
func BenchmarkEpisodes(b *testing.B) {
	testenv.RequireChromium(b)
	srv := testserver.Start(b, testserver.Options{})
	loadShop(b, srv)
	for _, conc := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("concurrent=%d", conc), func(b *testing.B) {
			perWorker := 2
			var mu sync.Mutex
			var steps []time.Duration
			failed := 0
			start := time.Now()
			for range b.N {
				var wg sync.WaitGroup
				for range conc {
					wg.Go(func() {
						for range perWorker {
							code, e := post(b, srv, "/episodes", map[string]any{"task_id": "search-dom",
								"sandbox": map[string]any{"memory": "1Gi"}})
							if code != 200 {
								b.Errorf("create: %d %v", code, e)
								return
							}
							id := e["episode_id"].(string)
							for _, a := range searchSteps {
								t0 := time.Now()
								if code, r := post(b, srv, "/episodes/"+id+"/step", map[string]any{"action": a}); code != 200 {
									b.Errorf("step: %d %v", code, r)
								}
								mu.Lock()
								steps = append(steps, time.Since(t0))
								mu.Unlock()
							}
							if code, r := post(b, srv, "/episodes/"+id+"/finish", map[string]any{}); code != 200 || r["outcome"] != "success" {
								mu.Lock()
								failed++
								mu.Unlock()
							}
						}
					})
				}
				wg.Wait()
			}
			el := time.Since(start)
			n := b.N * conc * perWorker
			b.ReportMetric(float64(n)/el.Minutes(), "episodes/min")
			b.ReportMetric(ms(percentile(steps, 0.5)), "step_p50_ms")
			b.ReportMetric(ms(percentile(steps, 0.9)), "step_p90_ms")
			b.ReportMetric(float64(failed), "not_success")
		})
	}
}
