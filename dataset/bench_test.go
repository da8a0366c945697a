package dataset

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"path/filepath"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/recordings"
)

// benchStore records n browser episodes of 4 screenshots of 24 KiB each
// (a 1280x720 JPEG at quality 60 is 60-120 KiB; the ratio of image to text
// is what matters here, and a smaller image keeps the store quick to make).
func benchStore(b *testing.B, n int) *recordings.Store {
	s, err := recordings.NewStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	img := make([]byte, 24<<10)
	rand.Read(img)
	for i := range n {
		w, err := s.Create(recordings.Manifest{ID: fmt.Sprintf("r%05d", i), TaskID: fmt.Sprintf("t%d", i%200), Kind: "browser",
			Question: "Find the cheapest lamp and add it to the cart", CreatedAt: time.Unix(int64(i), 0).UTC()})
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; n < 4; n++ {
			st := recordings.Step{N: n, URL: "http://shop.test/p", Title: "Shop"}
			if n > 0 {
				st.Action = json.RawMessage(`{"type":"click","element":12}`)
			}
			if err := w.Append(st, img, "jpg"); err != nil {
				b.Fatal(err)
			}
		}
		reward := 1.0
		if err := w.Finish(func(m *recordings.Manifest) { m.Outcome, m.Reward = "success", &reward }); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// peakHeap samples the live heap until stop is called, which returns the
// largest sample.
func peakHeap() (stop func() uint64) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(sample)
			peak = max(peak, sample[0].Value.Uint64())
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak
	}
}

// BenchmarkBuild builds gui datasets of 250, 1,000 and 4,000 episodes: episodes
// per second, and the peak live heap, which should not grow with the
// number of episodes.
func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{250, 1000, 4000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := benchStore(b, n)
			var peak uint64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				stop := peakHeap()
				if _, err := Build(context.Background(), s, filepath.Join(b.TempDir(), "ds"), Options{Splits: Splits{TestPercent: 10}}); err != nil {
					b.Fatal(err)
				}
				peak = max(peak, stop())
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "episodes/s")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}
