package agent

import (
	"context"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
)

// BenchmarkExec measures the agent hop alone: Client.Exec over the unix
// socket of `true` (a bash builtin: bash is started) and of `/bin/true` (a
// plain program), against raw spawns of `bash -c true` and `/bin/true` in
// the same run. The raw spawns come first: the agent's reaper collects
// every child of the process, os/exec's included.
func BenchmarkExec(b *testing.B) {
	spawn := func(argv ...string) time.Duration {
		t0 := time.Now()
		if err := exec.Command(argv[0], argv[1:]...).Run(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var rawBash, rawProgram []time.Duration
	for range b.N {
		rawBash = append(rawBash, spawn("bash", "-c", "true"))
		rawProgram = append(rawProgram, spawn("/bin/true"))
	}
	a := startAgent(b, nil)
	ctx := context.Background()
	hop := func(command string) time.Duration {
		t0 := time.Now()
		exit, err := a.Exec(ctx, api.AgentExecRequest{Command: command, TimeoutSeconds: 10}, func(api.ExecEvent) {})
		if err != nil || exit.ExitCode != 0 {
			b.Fatalf("exec %q: %+v %v", command, exit, err)
		}
		return time.Since(t0)
	}
	var hopBuiltin, hopProgram []time.Duration
	b.ResetTimer()
	for range b.N {
		hopBuiltin = append(hopBuiltin, hop("true"))
		hopProgram = append(hopProgram, hop("/bin/true"))
	}
	p50 := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	hb, hp, rb, rp := p50(hopBuiltin), p50(hopProgram), p50(rawBash), p50(rawProgram)
	b.ReportMetric(float64(hb)/1e6, "agent_true_p50_ms")
	b.ReportMetric(float64(hp)/1e6, "agent_bintrue_p50_ms")
	b.ReportMetric(float64(rb)/1e6, "bash_p50_ms")
	b.ReportMetric(float64(rp)/1e6, "bintrue_p50_ms")
	b.ReportMetric(float64(hb)/float64(rb), "true/bash")
	b.ReportMetric(float64(hp)/float64(rp), "bintrue/raw")
}
