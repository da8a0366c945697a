package server_test

import (
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// BenchmarkFork: POST /sandboxes/{id}/fork of a shell sandbox holding
// 100 MB of changes into 8 branches, each ready when the call answers,
// against, in the same loop: 8 cold creates of the same sandbox started
// at once and waited for (the floor of 8 sandboxes), a snapshot of the
// same sandbox (its copy of the 100 MB) and a bare `cp -a` of 100 MB on
// this host's disk.
//
//	go test -tags seccomp -run '^$' -bench Fork -benchtime 20x ./server
func BenchmarkFork(b *testing.B) {
	const branches = 8
	srv := testserver.Start(b, testserver.Options{})
	body := map[string]any{"memory": "256Mi"}
	parent := createReady(b, srv, body)
	execWait(b, srv, parent, map[string]any{"command": "head -c 100000000 /dev/urandom > /workspace/data"})
	// The bare copy's source is on the host's disk, as the layers' file is.
	bare := b.TempDir()
	if out, err := exec.Command("sh", "-c", "mkdir "+bare+"/src && head -c 100000000 /dev/urandom > "+bare+"/src/data").CombinedOutput(); err != nil {
		b.Fatalf("bare source: %v %s", err, out)
	}
	timed := func(f func()) time.Duration {
		t0 := time.Now()
		f()
		return time.Since(t0)
	}
	var fork, cold, snap, cp []time.Duration
	for b.Loop() {
		var ids []string
		fork = append(fork, timed(func() {
			code, res := post(b, srv, "/sandboxes/"+parent+"/fork", map[string]any{"count": branches})
			if code != 200 {
				b.Fatalf("fork: %d %v", code, res)
			}
			for _, s := range res["sandboxes"].([]any) {
				ids = append(ids, s.(map[string]any)["sandbox_id"].(string))
			}
		}))
		cold = append(cold, timed(func() {
			ids = append(ids, coldCreates(b, srv, branches, map[string]any{"image": "host", "block_network": true, "memory": "256Mi"})...)
		}))
		var snapID string
		snap = append(snap, timed(func() {
			code, res := post(b, srv, "/sandboxes/"+parent+"/snapshots", nil)
			if code != 201 {
				b.Fatalf("snapshot: %d %v", code, res)
			}
			snapID = res["snapshot_id"].(string)
		}))
		cp = append(cp, timed(func() {
			if out, err := exec.Command("cp", "-a", bare+"/src", bare+"/dst").CombinedOutput(); err != nil {
				b.Fatalf("cp: %v %s", err, out)
			}
		}))
		b.StopTimer()
		_ = exec.Command("rm", "-rf", bare+"/dst").Run()
		call(b, srv, "DELETE", "/snapshots/"+snapID, nil)
		for _, id := range ids {
			_ = del(srv, id)
		}
		waitRuntimeGone(b, srv, ids...)
		b.StartTimer()
	}
	p50 := func(d []time.Duration) float64 { return ms(percentile(d, 0.5)) }
	b.ReportMetric(p50(fork), "fork8-p50-ms")
	b.ReportMetric(p50(cold), "cold8-p50-ms")
	b.ReportMetric(p50(snap), "snapshot-p50-ms")
	b.ReportMetric(p50(cp), "bare-cp-p50-ms")
	b.ReportMetric(p50(fork)/p50(cold), "fork/cold")
	b.ReportMetric(p50(fork)/(p50(cold)+p50(cp)), "fork/(cold+cp)")
}

// BenchmarkForkBrowser: POST /sandboxes/{id}/fork of a browser sandbox
// signed in on the bundled shop into 8 branches, each ready for its next
// step (the sites started, the browser state restored) when the call
// answers, against 8 cold browser sandboxes started at once and waited for
// (with the same start command) in the same loop.
//
//	go test -tags seccomp -run '^$' -bench ForkBrowser -benchtime 5x ./server
func BenchmarkForkBrowser(b *testing.B) {
	const branches = 8
	testenv.RequireChromium(b)
	srv := testserver.Start(b, testserver.Options{})
	code, res := post(b, srv, "/sandboxes", map[string]any{"image": "host", "block_network": true, "kind": "browser", "exec": []string{sitesCmd}})
	if code != 200 {
		b.Fatalf("create: %d %v", code, res)
	}
	parent := res["sandbox_id"].(string)
	if w := getWait(b, srv, parent); w["status"] != "ready" {
		b.Fatalf("wait: %v", w)
	}
	code, res = post(b, srv, "/sandboxes/"+parent+"/browser/actions", map[string]any{"actions": []map[string]any{
		{"type": "navigate", "url": "http://127.0.0.1:8100/shop/account.html"},
		{"type": "click", "selector": "#user"}, {"type": "type", "text": "ada"},
		{"type": "click", "selector": "#password"}, {"type": "type", "text": "greenleaf"},
		{"type": "click", "selector": "#sign-in"}, {"type": "wait", "selector": "#signed-in:not([hidden])"}}})
	if code != 200 || res["ok"] != true {
		b.Fatalf("sign in: %d %v", code, res)
	}
	timed := func(f func()) time.Duration {
		t0 := time.Now()
		f()
		return time.Since(t0)
	}
	var fork, cold []time.Duration
	for b.Loop() {
		var ids []string
		fork = append(fork, timed(func() {
			code, res := post(b, srv, "/sandboxes/"+parent+"/fork", map[string]any{"count": branches, "exec": []string{sitesCmd}})
			if code != 200 {
				b.Fatalf("fork: %d %v", code, res)
			}
			for _, s := range res["sandboxes"].([]any) {
				ids = append(ids, s.(map[string]any)["sandbox_id"].(string))
			}
		}))
		cold = append(cold, timed(func() {
			ids = append(ids, coldCreates(b, srv, branches, map[string]any{"image": "host", "block_network": true, "kind": "browser", "exec": []string{sitesCmd}})...)
		}))
		b.StopTimer()
		for _, id := range ids {
			_ = del(srv, id)
		}
		waitRuntimeGone(b, srv, ids...)
		b.StartTimer()
	}
	p50 := func(d []time.Duration) float64 { return ms(percentile(d, 0.5)) }
	b.ReportMetric(p50(fork), "fork8-p50-ms")
	b.ReportMetric(p50(cold), "cold8-p50-ms")
	b.ReportMetric(p50(fork)/p50(cold), "fork/cold")
}

// coldCreates creates n sandboxes of body at once and returns their ids
// once all are ready.
func coldCreates(b *testing.B, srv *testserver.Server, n int, body map[string]any) []string {
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids []string
	)
	for range n {
		wg.Go(func() {
			code, res := post(b, srv, "/sandboxes", body)
			if code != 200 {
				b.Errorf("create: %d %v", code, res)
				return
			}
			id := res["sandbox_id"].(string)
			if w := getWait(b, srv, id); w["status"] != "ready" {
				b.Errorf("wait: %v", w)
			}
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
		})
	}
	wg.Wait()
	return ids
}
