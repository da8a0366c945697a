package floor

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
)

func TestMain(m *testing.M) {
	MaybeChild()
	os.Exit(m.Run())
}

// The floor's containers run, print and are removed, cgroups and
// scratch space included; held ones too, once all have printed.
func TestRunMakesBareContainers(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct {
		name string
		run  func(context.Context, int, int, string) (Result, error)
		held int
	}{
		{"exit at once", Run, 0},
		{"held", RunHeld, 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			res, err := tc.run(context.Background(), 24, 4, tmp)
			if err != nil || res.Err != nil || res.OK != 24 || res.Held != tc.held || res.Elapsed <= 0 {
				t.Fatalf("Run = %+v, %v", res, err)
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("scratch left: %v", left)
			}
			for _, d := range newCgroups("orchard-floor-x").dirs("") {
				parent := d[:len(d)-len("orchard-floor-x")]
				entries, _ := os.ReadDir(parent)
				for _, e := range entries {
					if len(e.Name()) > 14 && e.Name()[:14] == "orchard-floor-" {
						t.Errorf("cgroup left: %s%s", parent, e.Name())
					}
				}
			}
			if out, _ := exec.Command("pgrep", "-f", "^sleep infinity$").Output(); len(out) != 0 {
				t.Errorf("held containers left running: %s", out)
			}
		})
	}
}

// Two bare browsers each take memory, share their binary's pages (so each
// takes less than one alone), and leave no process behind.
func TestBrowserPSS(t *testing.T) {
	exe := testenv.RequireChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	one, err := BrowserPSS(ctx, exe, 1, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	two, err := BrowserPSS(ctx, exe, 2, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("one browser %d kB; each of two %d kB", one, two)
	if one < 10<<10 || two < 10<<10 || two >= one {
		t.Errorf("PSS: one browser %d kB, each of two %d kB", one, two)
	}
	d, err := BrowserStart(ctx, exe)
	if err != nil || d <= 0 {
		t.Fatalf("BrowserStart = %v, %v", d, err)
	}
	t.Logf("started and loaded its page in %v", d)
	out, _ := exec.Command("pgrep", "-f", "orchard-floor-browser-").Output()
	if len(out) > 0 {
		t.Errorf("browsers left: %s", out)
	}
}

// BenchmarkFloor makes ORCHARD_BENCH_SANDBOXES (1,000) bare containers, 8
// at a time (the server's default of 4 per CPU on two cores).
func BenchmarkFloor(b *testing.B) {
	testenv.RequireRoot(b)
	n, c := 1000, 8
	if v, err := strconv.Atoi(os.Getenv("ORCHARD_BENCH_SANDBOXES")); err == nil && v > 0 {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("ORCHARD_BENCH_CREATE_CONCURRENCY")); err == nil && v > 0 {
		c = v
	}
	for range b.N {
		res, err := Run(b.Context(), n, c, os.TempDir())
		if err != nil || res.Err != nil || res.OK != n {
			b.Fatalf("Run = %+v, %v", res, err)
		}
		b.ReportMetric(res.Elapsed.Seconds(), "floor_s")
	}
}
