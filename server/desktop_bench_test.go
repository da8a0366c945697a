package server_test

import (
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// BenchmarkDesktopReady: cold desktop sandbox (1280x800, openbox, an
// xterm), POST /sandboxes then /wait, then the first JPEG screenshot
// action; each is deleted (untimed) before the next. pss_MB is the last
// sandbox's processes' PSS after its first screenshot.
//
//	ORCHARD_AGENT=$PWD/bin/orchard-agent go test -tags seccomp -run XXX -bench DesktopReady -benchtime 10x ./server/
func BenchmarkDesktopReady(b *testing.B) {
	requireXvfb(b)
	srv := testserver.Start(b, testserver.Options{})
	body := map[string]any{"image": "host", "block_network": true, "kind": "desktop", "memory": "1Gi",
		"desktop": map[string]any{"width": 1280, "height": 800, "apps": []string{"xterm"}}}
	var ready, first []time.Duration
	var pss int64
	for i := range b.N + 1 {
		t0 := time.Now()
		code, r := post(b, srv, "/sandboxes", body)
		if code != 200 {
			b.Fatalf("create: %d %v", code, r)
		}
		id := r["sandbox_id"].(string)
		if w := getWait(b, srv, id); w["status"] != "ready" {
			b.Fatalf("desktop sandbox %s: %v", id, w)
		}
		d := time.Since(t0)
		if code, r := post(b, srv, "/sandboxes/"+id+"/desktop/actions",
			map[string]any{"actions": []map[string]any{{"type": "screenshot", "format": "jpeg"}}}); code != 200 || r["ok"] != true {
			b.Fatalf("first screenshot on %s: %d %.400v", id, code, r)
		}
		if i > 0 { // the first warms the page cache
			ready, first = append(ready, d), append(first, time.Since(t0))
		}
		if i == b.N {
			time.Sleep(time.Second) // let the xterm and the window manager settle
			kb, _, err := sandboxPSS(id)
			if err != nil {
				b.Fatal(err)
			}
			pss = kb
		}
		if err := del(srv, id); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(ms(percentile(ready, 0.5)), "ready_p50_ms")
	b.ReportMetric(ms(percentile(first, 0.5)), "first_shot_p50_ms")
	b.ReportMetric(float64(pss)/1024, "pss_MB")
}
