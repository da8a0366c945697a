package browser

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkStep is one RL step on a simple page: a click by coordinates
// (with its settle wait) and a JPEG observation with set-of-marks. The
// settle quiet window dominates, so it runs at the default and at a short
// window.
func BenchmarkStep(b *testing.B) {
	s := openPage(b, "/basic.html")
	for _, quiet := range []time.Duration{defaultSettleQuiet, 50 * time.Millisecond} {
		b.Run("quiet="+quiet.String(), func(b *testing.B) {
			old := s.opts.SettleQuiet
			s.opts.SettleQuiet = quiet
			defer func() { s.opts.SettleQuiet = old }()
			ctx := context.Background()
			for b.Loop() {
				if _, err := s.Do(ctx, []Action{{Type: ActClick, X: fptr(650), Y: fptr(320)}}); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Observe(ctx, ObserveOptions{Screenshot: "jpeg", SOM: true}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkObserve(b *testing.B) {
	s := openPage(b, "/form.html")
	cases := []struct {
		name string
		o    ObserveOptions
	}{
		{"jpeg", ObserveOptions{Screenshot: "jpeg"}},
		{"png", ObserveOptions{Screenshot: "png"}},
		{"jpeg_w640", ObserveOptions{Screenshot: "jpeg", Width: 640}},
		{"jpeg_som", ObserveOptions{Screenshot: "jpeg", SOM: true}},
		{"jpeg_marks", ObserveOptions{Screenshot: "jpeg", Marks: true}},
		{"none_axtree", ObserveOptions{Screenshot: "none", AXTree: true}},
		{"none_text", ObserveOptions{Screenshot: "none", Text: true}},
		{"all", ObserveOptions{Screenshot: "jpeg", SOM: true, AXTree: true, Text: true}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				if _, err := s.Observe(ctx, c.o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkObserveLargePage observes a page with 1000 list items, each a
// link and a button (2000 interactive elements).
func BenchmarkObserveLargePage(b *testing.B) {
	s := openPage(b, "/basic.html")
	js[any](b, s, `document.body.innerHTML = '<ul>' + Array.from({length: 1000}, (_, i) => '<li>Item ' + i + ' <a href="#' + i + '">link ' + i + '</a> <button>buy ' + i + '</button></li>').join('') + '</ul>'`)
	for _, c := range []struct {
		name string
		o    ObserveOptions
	}{
		{"jpeg_som", ObserveOptions{Screenshot: "jpeg", SOM: true}},
		{"axtree", ObserveOptions{Screenshot: "none", AXTree: true}},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				obs, err := s.Observe(ctx, c.o)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(len(obs.AXTree)), "axtree_bytes")
			}
		})
	}
}

// BenchmarkInput measures the input actions without their settle wait.
func BenchmarkInput(b *testing.B) {
	s := openPage(b, "/form.html")
	tb, err := s.activeTab(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	text := strings.Repeat("a", 50)
	b.Run("type50", func(b *testing.B) {
		for b.Loop() {
			if err := s.typeText(ctx, tb, Action{Type: ActType, Selector: "#name", Text: text, Clear: true}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("click", func(b *testing.B) {
		fi := frameInfo{scale: 1}
		for b.Loop() {
			if err := s.click(ctx, tb, fi, Action{Type: ActClick, X: fptr(10), Y: fptr(400)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("key", func(b *testing.B) {
		for b.Loop() {
			if err := s.pressKeys(ctx, tb, "Control+a"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkNavigate loads a page (a new navigation each time, like
// Playwright's page.goto), with the default settle wait after the load
// and with a 1 ms one, which leaves the wait for the load event alone:
// what page.goto waits for.
func BenchmarkNavigate(b *testing.B) {
	s := openPage(b, "/basic.html")
	benchNavigate(b, s)
}

func benchNavigate(b *testing.B, s *Session) {
	for _, settle := range []time.Duration{0, time.Millisecond} {
		name := "settle=default"
		if settle > 0 {
			name = "settle=" + settle.String()
		}
		b.Run(name, func(b *testing.B) {
			oldQ, oldI := s.opts.SettleQuiet, s.opts.SettleIdle
			if settle > 0 {
				s.opts.SettleQuiet, s.opts.SettleIdle = settle, settle
			}
			defer func() { s.opts.SettleQuiet, s.opts.SettleIdle = oldQ, oldI }()
			ctx := context.Background()
			var times []time.Duration
			for b.Loop() {
				t0 := time.Now()
				res, err := s.Do(ctx, []Action{{Type: ActNavigate, URL: site.URL + "/basic.html"}})
				if err != nil || !res[0].OK {
					b.Fatalf("navigate: %v %+v", err, res)
				}
				times = append(times, time.Since(t0))
			}
			// Medians, as bench/playwright/bench.js reports.
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(times[len(times)*9/10].Microseconds())/1000, "p90_ms")
		})
	}
}

// BenchmarkFastFrames repeats the screenshot, step and navigate benchmarks
// on a browser with Options.FastFrames.
func BenchmarkFastFrames(b *testing.B) {
	s := launchFastFrames(b)
	ctx := context.Background()
	if _, err := s.Do(ctx, []Action{{Type: ActNavigate, URL: site.URL + "/form.html"}}); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		o    ObserveOptions
	}{
		{"observe/jpeg", ObserveOptions{Screenshot: "jpeg"}},
		{"observe/png", ObserveOptions{Screenshot: "png"}},
		{"observe/jpeg_som", ObserveOptions{Screenshot: "jpeg", SOM: true}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := s.Observe(ctx, c.o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("navigate", func(b *testing.B) { benchNavigate(b, s) })
	if _, err := s.Do(ctx, []Action{{Type: ActNavigate, URL: site.URL + "/basic.html"}}); err != nil {
		b.Fatal(err)
	}
	for _, quiet := range []time.Duration{defaultSettleQuiet, 50 * time.Millisecond} {
		b.Run("step/quiet="+quiet.String(), func(b *testing.B) {
			old := s.opts.SettleQuiet
			s.opts.SettleQuiet = quiet
			defer func() { s.opts.SettleQuiet = old }()
			for b.Loop() {
				if _, err := s.Do(ctx, []Action{{Type: ActClick, X: fptr(650), Y: fptr(320)}}); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Observe(ctx, ObserveOptions{Screenshot: "jpeg", SOM: true}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
