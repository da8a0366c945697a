package runner

import (
	"context"
	"fmt"
	"testing"

	"github.com/orchard/orchard/sites"
	"github.com/orchard/orchard/tasks"
)

// BenchmarkBundledSuite: the bundled suite's episodes with their scripted
// policy (setup that starts the offline sites, start page, every step,
// evaluation, recording on) at 1, 4 and 16 at once, through the runner
// over the REST API of a real server; episodes per minute and the step
// latency the policy sees. Each level runs max(16, 2×concurrency) tasks
// spread over the four sites.
//
//	ORCHARD_AGENT=$PWD/bin/orchard-agent go test -tags seccomp -run XXX -bench BundledSuite -benchtime 1x ./runner/
func BenchmarkBundledSuite(b *testing.B) {
	c := start(b)
	all := bundled(b, c)
	for _, conc := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("concurrent=%d", conc), func(b *testing.B) {
			n := max(16, 2*conc)
			var ts []tasks.Task
			for i := range n {
				ts = append(ts, all[i*len(all)/n])
			}
			var eps, p50, p90, fails float64
			for range b.N {
				s, err := Run(context.Background(), Config{Client: c, Tasks: ts, Concurrency: conc, Record: true, Policy: Scripted(sites.Script)})
				if err != nil {
					b.Fatal(err)
				}
				eps, p50, p90 = s.EpisodesPerMinute, s.StepLatency.P50, s.StepLatency.P90
				fails += float64(s.Total - s.Success)
			}
			b.ReportMetric(eps, "episodes/min")
			b.ReportMetric(p50, "step_p50_ms")
			b.ReportMetric(p90, "step_p90_ms")
			b.ReportMetric(fails, "not_success")
		})
	}
}
