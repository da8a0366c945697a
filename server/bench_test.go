package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/internal/testing/floor"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store/redis"
)

// httpClient keeps connections alive across benchmark iterations, as the
// SDK's session does.
var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}}

func post(b testing.TB, srv *testserver.Server, path string, body any) (int, map[string]any) {
	buf, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", srv.URL+path, bytes.NewReader(buf))
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := httpClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(res.Body).Decode(&m)
	return res.StatusCode, m
}

func del(srv *testserver.Server, id string) error {
	req, _ := http.NewRequest("DELETE", srv.URL+"/sandboxes/"+id, nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		return fmt.Errorf("delete %s: %d", id, res.StatusCode)
	}
	return nil
}

func getWait(b testing.TB, srv *testserver.Server, id string) map[string]any {
	req, _ := http.NewRequest("GET", srv.URL+"/sandboxes/"+id+"/wait?timeout=600", nil)
	req.Header.Set("X-API-Key", srv.APIKey)
	res, err := httpClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(res.Body).Decode(&m)
	return m
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(p*float64(len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkExecRoundTrip: POST /exec wait:true through the REST API,
// against raw spawns measured in the same loop. Two commands: `true`, a
// bash builtin, so the agent must start bash; and `/bin/true`, a plain
// program, which bash -c would only exec. The raw baselines are `sh -c true`
// (the goal's yardstick), `bash -c true` (what the contract runs) and
// `/bin/true` spawned directly (like for like with the second command).
// agent_true is the agent hop alone (Client.Exec of `true` from this
// process), so API − agent is what the server adds.
func BenchmarkExecRoundTrip(b *testing.B) {
	srv := testserver.Start(b, testserver.Options{})
	id := createReady(b, srv, map[string]any{"memory": "512Mi"})
	exec1 := func(command string) time.Duration {
		t0 := time.Now()
		code, body := post(b, srv, "/sandboxes/"+id+"/exec", map[string]any{"command": command, "wait": true})
		d := time.Since(t0)
		if code != 200 || body["status"] != "succeeded" {
			b.Fatalf("exec %q: %d %v", command, code, body)
		}
		return d
	}
	spawn := func(argv ...string) time.Duration {
		t0 := time.Now()
		if err := exec.Command(argv[0], argv[1:]...).Run(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	// The agent hop alone, from this process: what the API adds on top
	// of it is the server hop.
	ac, err := srv.Manager.Agent(context.Background(), id)
	if err != nil {
		b.Fatal(err)
	}
	hop := func(command string) time.Duration {
		t0 := time.Now()
		exit, err := ac.Exec(context.Background(), api.AgentExecRequest{Command: command, TimeoutSeconds: 10}, func(api.ExecEvent) {})
		d := time.Since(t0)
		if err != nil || exit.ExitCode != 0 {
			b.Fatalf("agent exec %q: %+v %v", command, exit, err)
		}
		return d
	}
	const warm = 20
	for range warm {
		exec1("true")
		exec1("/bin/true")
		hop("true")
	}
	var apiBuiltin, apiProgram, agentBuiltin, rawSh, rawBash, rawProgram []time.Duration
	b.ResetTimer()
	for range b.N {
		apiBuiltin = append(apiBuiltin, exec1("true"))
		apiProgram = append(apiProgram, exec1("/bin/true"))
		agentBuiltin = append(agentBuiltin, hop("true"))
		rawSh = append(rawSh, spawn("sh", "-c", "true"))
		rawBash = append(rawBash, spawn("bash", "-c", "true"))
		rawProgram = append(rawProgram, spawn("/bin/true"))
	}
	b.StopTimer()
	sh := percentile(rawSh, 0.5)
	ratio := func(d []time.Duration, base time.Duration) float64 {
		return float64(percentile(d, 0.5)) / float64(base)
	}
	b.ReportMetric(ms(percentile(apiBuiltin, 0.5)), "api_true_p50_ms")
	b.ReportMetric(ms(percentile(apiBuiltin, 0.9)), "api_true_p90_ms")
	b.ReportMetric(ms(percentile(apiProgram, 0.5)), "api_bintrue_p50_ms")
	b.ReportMetric(ms(percentile(apiProgram, 0.9)), "api_bintrue_p90_ms")
	b.ReportMetric(ms(percentile(agentBuiltin, 0.5)), "agent_true_p50_ms")
	b.ReportMetric(ms(sh), "sh_p50_ms")
	b.ReportMetric(ms(percentile(rawBash, 0.5)), "bash_p50_ms")
	b.ReportMetric(ms(percentile(rawProgram, 0.5)), "bintrue_p50_ms")
	b.ReportMetric(ratio(apiBuiltin, sh), "true/sh")
	b.ReportMetric(ratio(apiProgram, sh), "bintrue/sh")
	b.ReportMetric(ratio(apiBuiltin, percentile(rawBash, 0.5)), "true/bash")
	b.ReportMetric(ratio(apiProgram, percentile(rawProgram, 0.5)), "bintrue/raw")
}

// BenchmarkCreate: POST /sandboxes then /wait until ready, one at a time
// (cold: every create is a new container).
func BenchmarkCreate(b *testing.B) {
	srv := testserver.Start(b, testserver.Options{})
	var lat []time.Duration
	var ids []string
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		code, body := post(b, srv, "/sandboxes", map[string]any{"image": "host", "block_network": true, "memory": "256Mi"})
		if code != 200 {
			b.Fatalf("create: %d %v", code, body)
		}
		id := body["sandbox_id"].(string)
		if w := getWait(b, srv, id); w["status"] != "ready" {
			b.Fatalf("wait: %v", w)
		}
		lat = append(lat, time.Since(t0))
		ids = append(ids, id)
		if len(ids) >= 20 { // bound the live set so later creates are not slowed by earlier ones
			for _, id := range ids {
				_ = del(srv, id)
			}
			ids = ids[:0]
		}
	}
	b.StopTimer()
	for _, id := range ids {
		_ = del(srv, id)
	}
	b.ReportMetric(ms(percentile(lat, 0.5)), "create_p50_ms")
	b.ReportMetric(ms(percentile(lat, 0.9)), "create_p90_ms")
}

// BenchmarkScale: ORCHARD_BENCH_SANDBOXES (default 1000) sandboxes created
// concurrently, one exec each, then all deleted; reports wall time, the
// success rate and memory per idle sandbox. Run with -benchtime=1x.
func BenchmarkScale(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("ORCHARD_BENCH_SANDBOXES")); err == nil && v > 0 {
		n = v
	}
	var mc manager.Config
	if v, err := strconv.Atoi(os.Getenv("ORCHARD_BENCH_CREATE_CONCURRENCY")); err == nil && v > 0 {
		mc.MaxConcurrentCreates = v
	}
	srv := testserver.Start(b, testserver.Options{Manager: mc})
	// The floor runs at the concurrency the server creates at.
	floorConcurrency := mc.MaxConcurrentCreates
	if floorConcurrency == 0 {
		floorConcurrency = 4 * runtime.NumCPU() // the server's default
	}
	for range b.N {
		// Two floors: bare containers that exit once they have printed,
		// and ones held alive until all have, as the sandboxes are.
		fl, err := floor.Run(b.Context(), n, floorConcurrency, os.TempDir())
		if err != nil || fl.Err != nil || fl.OK != n {
			b.Fatalf("floor: %d of %d bare containers ran: %v %v", fl.OK, n, err, fl.Err)
		}
		held, err := floor.RunHeld(b.Context(), n, floorConcurrency, os.TempDir())
		if err != nil || held.Err != nil || held.OK != n || held.Held != n {
			b.Fatalf("held floor: %d of %d bare containers ran, %d held: %v %v", held.OK, n, held.Held, err, held.Err)
		}
		memBefore := usedMemory()
		var ok atomic.Int64
		var wg sync.WaitGroup
		ids := make([]string, n)
		start := time.Now()
		sem := make(chan struct{}, 128) // client-side concurrency, as a trainer's pool
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				code, body := post(b, srv, "/sandboxes", map[string]any{"image": "host", "block_network": true, "memory": "128Mi", "cpu": "0.5"})
				if code != 200 {
					return
				}
				id := body["sandbox_id"].(string)
				ids[i] = id
				if w := getWait(b, srv, id); w["status"] != "ready" {
					return
				}
				code, body = post(b, srv, "/sandboxes/"+id+"/exec", map[string]any{"command": "echo ok", "wait": true})
				if code == 200 && body["stdout"] == "ok\n" {
					ok.Add(1)
				}
			}()
		}
		wg.Wait()
		live := time.Since(start)
		memPer := float64(usedMemory()-memBefore) / float64(n)
		for _, id := range ids {
			if id != "" {
				_ = del(srv, id)
			}
		}
		// Deletes finish in the background; wait for the runtime to be empty.
		for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if insts, _ := srv.Runtime.List(b.Context()); len(insts) == 0 {
				break
			}
		}
		total := time.Since(start)
		b.ReportMetric(live.Seconds(), "create_exec_s")
		b.ReportMetric(fl.Elapsed.Seconds(), "floor_s")
		b.ReportMetric(live.Seconds()/fl.Elapsed.Seconds(), "x_floor")
		b.ReportMetric(held.Elapsed.Seconds(), "held_floor_s")
		b.ReportMetric(live.Seconds()/held.Elapsed.Seconds(), "x_held_floor")
		b.ReportMetric(total.Seconds(), "total_s")
		b.ReportMetric(100*float64(ok.Load())/float64(n), "success_%")
		b.ReportMetric(memPer/(1<<20), "MiB/sandbox")
	}
}

// usedMemory is MemTotal − MemAvailable in bytes.
func usedMemory() int64 {
	raw, _ := os.ReadFile("/proc/meminfo")
	var total, avail int64
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = v
		case "MemAvailable:":
			avail = v
		}
	}
	return (total - avail) * 1024
}

// BenchmarkStores: exec round trip and create with the Redis store against
// the memory store, interleaved in the same run (goal: Redis ≤ 1.3× memory
// on the exec p50).
func BenchmarkStores(b *testing.B) {
	rs := testenv.StartRedis(b)
	st, err := redis.New(context.Background(), redis.Config{URL: rs.URL(), Prefix: "bench:"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	mem := testserver.Start(b, testserver.Options{})
	red := testserver.Start(b, testserver.Options{Store: st})
	ids := map[*testserver.Server]string{}
	for _, srv := range []*testserver.Server{mem, red} {
		ids[srv] = createReady(b, srv, map[string]any{"memory": "256Mi"})
		for range 20 {
			post(b, srv, "/sandboxes/"+ids[srv]+"/exec", map[string]any{"command": "true", "wait": true})
		}
	}
	lat := map[*testserver.Server][]time.Duration{}
	create := map[*testserver.Server][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for _, srv := range []*testserver.Server{mem, red} {
			t0 := time.Now()
			code, body := post(b, srv, "/sandboxes/"+ids[srv]+"/exec", map[string]any{"command": "true", "wait": true})
			lat[srv] = append(lat[srv], time.Since(t0))
			if code != 200 || body["status"] != "succeeded" {
				b.Fatalf("exec: %d %v", code, body)
			}
			if i%10 == 0 {
				t1 := time.Now()
				_, cb := post(b, srv, "/sandboxes", map[string]any{"image": "host", "block_network": true, "memory": "128Mi"})
				id := cb["sandbox_id"].(string)
				if w := getWait(b, srv, id); w["status"] != "ready" {
					b.Fatalf("wait: %v", w)
				}
				create[srv] = append(create[srv], time.Since(t1))
				_ = del(srv, id)
			}
		}
	}
	b.StopTimer()
	pm, pr := percentile(lat[mem], 0.5), percentile(lat[red], 0.5)
	b.ReportMetric(ms(pm), "mem_exec_p50_ms")
	b.ReportMetric(ms(pr), "redis_exec_p50_ms")
	b.ReportMetric(float64(pr)/float64(pm), "exec_ratio")
	b.ReportMetric(ms(percentile(create[mem], 0.5)), "mem_create_p50_ms")
	b.ReportMetric(ms(percentile(create[red], 0.5)), "redis_create_p50_ms")
}
