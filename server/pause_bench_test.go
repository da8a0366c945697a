package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// BenchmarkPauseResume: POST /pause and /resume of a shell sandbox with a
// busy process in it, through the REST API; in the same loop the runtime's
// Pause and Resume called directly, and the floor: the sandbox's freezer
// cgroup written by hand (FROZEN, polled until the kernel reports every
// task frozen; THAWED). The kernel's freeze waits for each task to reach
// a point where it can stop, so the floor is the machine's, not ours.
//
//	go test -tags seccomp -run '^$' -bench PauseResume -benchtime 200x ./server
func BenchmarkPauseResume(b *testing.B) {
	srv := testserver.Start(b, testserver.Options{})
	id := createReady(b, srv, map[string]any{"memory": "256Mi"})
	execWait(b, srv, id, map[string]any{"command": "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &"})
	state := filepath.Join("/sys/fs/cgroup/freezer/orchard", id, "freezer.state")
	if _, err := os.Stat(state); err != nil {
		b.Skipf("no cgroup v1 freezer for the floor: %v", err)
	}
	timed := func(f func() error) time.Duration {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	rest := func(path string) func() error {
		return func() error {
			if code, body := post(b, srv, "/sandboxes/"+id+path, nil); code != 200 {
				b.Fatalf("%s: %d %v", path, code, body)
			}
			return nil
		}
	}
	write := func(s string) error { return os.WriteFile(state, []byte(s), 0) }
	freeze := func() error {
		if err := write("FROZEN"); err != nil {
			return err
		}
		for {
			got, err := os.ReadFile(state)
			if err != nil || strings.TrimSpace(string(got)) == "FROZEN" {
				return err
			}
		}
	}
	ctx := context.Background()
	var pause, resume, rtPause, rtResume, bareFreeze, bareThaw []time.Duration
	for b.Loop() {
		pause = append(pause, timed(rest("/pause")))
		resume = append(resume, timed(rest("/resume")))
		rtPause = append(rtPause, timed(func() error { return srv.Runtime.Pause(ctx, id) }))
		rtResume = append(rtResume, timed(func() error { return srv.Runtime.Resume(ctx, id) }))
		bareFreeze = append(bareFreeze, timed(freeze))
		bareThaw = append(bareThaw, timed(func() error { return write("THAWED") }))
	}
	p50 := func(d []time.Duration) float64 { return ms(percentile(d, 0.5)) }
	b.ReportMetric(p50(pause), "pause-p50-ms")
	b.ReportMetric(p50(resume), "resume-p50-ms")
	b.ReportMetric(p50(rtPause), "runtime-pause-p50-ms")
	b.ReportMetric(p50(rtResume), "runtime-resume-p50-ms")
	b.ReportMetric(p50(bareFreeze), "bare-freeze-p50-ms")
	b.ReportMetric(p50(bareThaw), "bare-thaw-p50-ms")
	b.ReportMetric(p50(pause)/p50(bareFreeze), "pause/bare")
	b.ReportMetric(p50(resume)/p50(bareThaw), "resume/bare")
}
