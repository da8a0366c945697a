package manager

import (
	"sync"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
)

// TestOutputFlush checks the output's flush timer: none without output,
// one flush per interval with it, never two at once, and none after stop.
func TestOutputFlush(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		chunks  int           // written one per gap
		gap     time.Duration // between chunks
		slow    time.Duration // how long each flush takes
		flushes func(n int, elapsed time.Duration) bool
	}{
		{name: "no output, no flush", chunks: 0, flushes: func(n int, _ time.Duration) bool { return n == 0 }},
		{name: "short job ends before the first flush", chunks: 3, flushes: func(n int, _ time.Duration) bool { return n == 0 }},
		{name: "chatty job flushes about once per interval", chunks: 16, gap: outputFlushInterval / 8,
			flushes: func(n int, elapsed time.Duration) bool { return n >= 1 && n <= int(elapsed/outputFlushInterval)+1 }},
		{name: "slow store: flushes do not overlap", chunks: 12, gap: outputFlushInterval / 4, slow: outputFlushInterval,
			flushes: func(n int, _ time.Duration) bool { return n >= 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var (
				mu       sync.Mutex
				n, inFly int
				overlap  bool
				stopped  bool
				late     bool
			)
			o := &output{}
			o.flush = func() {
				mu.Lock()
				n++
				inFly++
				overlap = overlap || inFly > 1
				late = late || stopped
				mu.Unlock()
				o.snapshot()
				time.Sleep(tt.slow)
				mu.Lock()
				inFly--
				mu.Unlock()
			}
			start := time.Now()
			for range tt.chunks {
				o.add(api.ExecEvent{Stream: "stdout", Data: []byte("x")})
				time.Sleep(tt.gap)
			}
			o.stop()
			elapsed := time.Since(start)
			mu.Lock()
			stopped = true
			if inFly != 0 {
				t.Errorf("stop returned with a flush in progress")
			}
			mu.Unlock()
			time.Sleep(2 * outputFlushInterval)
			mu.Lock()
			defer mu.Unlock()
			if !tt.flushes(n, elapsed) {
				t.Errorf("%d flushes in %v", n, elapsed)
			}
			if overlap {
				t.Error("two flushes ran at once")
			}
			if late {
				t.Error("a flush ran after stop")
			}
			if so, _, _ := o.snapshot(); len(so) != tt.chunks {
				t.Errorf("stdout %q, want %d bytes", so, tt.chunks)
			}
		})
	}
}
