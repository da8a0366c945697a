package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// benchInt reads a benchmark knob from the environment.
func benchInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// procStatus reads a "Vm..." line of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// BenchmarkUploadMemory measures what uploads cost the server in memory:
// a real `orchard serve` process (so that its RSS is the server's alone)
// receives ten uploads at once of 150 MiB each (200 MiB JSON bodies, as the
// SDK sends them) into one sandbox. Metrics, in MB (10^6 bytes): the peak
// RSS above the idle server's (sampled every 5 ms, and the kernel's
// high-water mark), and the RSS above idle 10 s after the last upload
// ended. ORCHARD_BENCH_UPLOADS and ORCHARD_BENCH_UPLOAD_MIB change the
// count and the file size. Every file is checked in the sandbox against
// the SHA-256 of what was sent.
//
//	go test -tags seccomp -run XXX -bench BenchmarkUploadMemory -benchtime 1x -v ./server/
func BenchmarkUploadMemory(b *testing.B) {
	testenv.RequireRoot(b)
	uploads := benchInt("ORCHARD_BENCH_UPLOADS", 10)
	size := int64(benchInt("ORCHARD_BENCH_UPLOAD_MIB", 150)) << 20

	bin := testenv.OrchardBinary(b)
	agentPath := testenv.AgentBinary(b)
	dir := testserver.StateDir(b)
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"API_KEYS=" + testserver.APIKey,
		"ORCHARD_AGENT=" + agentPath,
		"LOG_LEVEL=WARN",
	}
	var srv *replicaProc
	var err error
	for range 3 {
		if srv, err = launchServe("upload", bin, b.TempDir(), env, "--state-dir", dir, "--store", "memory"); !errors.Is(err, errPortTaken) {
			break
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.kill)
	pid := srv.cmd.Process.Pid

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cr, err := srv.c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: "host", BlockNetwork: client.Ptr(true), Memory: client.Ptr("2Gi")})
	if err != nil {
		b.Fatal(err)
	}
	id := cr.SandboxID
	if _, err := srv.c.WaitSandbox(ctx, id, 2*time.Minute); err != nil {
		b.Fatal(err)
	}
	// One small upload first: the idle figure is a server that has
	// served an upload, with its connections and pools set up.
	if _, err := srv.c.Upload(ctx, id, "/workspace/warm", []byte("warm")); err != nil {
		b.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	idle, err := procStatus(pid, "VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	// The high-water mark starts again from here (proc(5), clear_refs).
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		b.Logf("reset VmHWM: %v (the sampled peak alone counts)", err)
	}

	var peak atomic.Int64
	peak.Store(idle)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if v, err := procStatus(pid, "VmRSS"); err == nil && v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: uploads}}
	defer hc.CloseIdleConnections()
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, uploads)
		for i := range uploads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				path := fmt.Sprintf("/workspace/up%d.bin", i)
				body, length := uploadBody(`{"path":"`+path+`","content":"`, randomData(uint64(i), size), size, `"}`)
				status, res := postUpload(b, hc, srv.url, testserver.APIKey, id, body, length)
				if status != 200 || res["size"] != float64(size) {
					errs[i] = fmt.Errorf("upload %d: %d %v", i, status, res)
				}
			}()
		}
		wg.Wait()
		elapsed += time.Since(start)
		if err := errors.Join(errs...); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	time.Sleep(10 * time.Second)
	close(stop)
	<-sampled
	after, err := procStatus(pid, "VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	hwm, err := procStatus(pid, "VmHWM")
	if err == nil && hwm > peak.Load() {
		peak.Store(hwm)
	}

	// Every file arrived whole.
	j, err := srv.c.Exec(ctx, id, api.ExecRequest{Command: client.Command("cd /workspace && sha256sum up*.bin"), Wait: true, TimeoutSeconds: client.Ptr(600)})
	if err != nil || j.ExitCode == nil || *j.ExitCode != 0 {
		b.Fatalf("sha256sum: %+v %v", j, err)
	}
	for i := range uploads {
		want := sha256Hex(b, randomData(uint64(i), size))
		if !strings.Contains(j.Stdout, fmt.Sprintf("%s  up%d.bin", want, i)) {
			b.Fatalf("up%d.bin does not have the SHA-256 of what was sent:\n%s", i, j.Stdout)
		}
	}

	mb := func(v int64) float64 { return float64(v) / 1e6 }
	b.ReportMetric(mb(idle), "idle_MB")
	b.ReportMetric(mb(peak.Load()-idle), "peak_over_idle_MB")
	b.ReportMetric(mb(after-idle), "after_over_idle_MB")
	b.ReportMetric(float64(b.N*uploads)*float64(size)/(1<<20)/elapsed.Seconds(), "file_MiB/s")
	b.Logf("%d uploads of %d MiB at once: idle RSS %.1f MB, peak %.1f MB, 10 s after %.1f MB",
		uploads, size>>20, mb(idle), mb(peak.Load()), mb(after))
}
