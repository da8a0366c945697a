package agent

import (
	"context"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
)

// BenchmarkExec measures the agent hop alone: Client.Exec of `true` over
// the unix socket, against a raw `bash -c true` spawn in the same run. The
// raw spawns come first: the agent's reaper collects every child of the
// process, os/exec's included.
func BenchmarkExec(b *testing.B) {
	var hop, raw []time.Duration
	for range b.N {
		t1 := time.Now()
		if err := exec.Command("bash", "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
		raw = append(raw, time.Since(t1))
	}
	a := startAgent(b, nil)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		exit, err := a.Exec(ctx, api.AgentExecRequest{Command: "true", TimeoutSeconds: 10}, func(api.ExecEvent) {})
		if err != nil || exit.ExitCode != 0 {
			b.Fatalf("exec: %+v %v", exit, err)
		}
		hop = append(hop, time.Since(t0))
	}
	p50 := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	h, r := p50(hop), p50(raw)
	b.ReportMetric(float64(h)/1e6, "agent_p50_ms")
	b.ReportMetric(float64(r)/1e6, "bash_p50_ms")
	b.ReportMetric(float64(h)/float64(r), "ratio")
}
