package retry

import (
	"testing"
	"time"
)

// With the default random source every wait stays below its cap and the
// draws spread over it.
func TestBackoffDefaultRandBounds(t *testing.T) {
	t.Parallel()
	p := Policy{Initial: 10 * time.Millisecond, Max: 80 * time.Millisecond}.withDefaults()
	for n, limit := range map[int]time.Duration{1: 10 * time.Millisecond, 2: 20 * time.Millisecond,
		3: 40 * time.Millisecond, 4: 80 * time.Millisecond, 60: 80 * time.Millisecond} {
		var low, high bool
		for range 1000 {
			d := p.backoff(n)
			if d < 0 || d >= limit {
				t.Fatalf("backoff(%d) = %v, want in [0, %v)", n, d, limit)
			}
			low = low || d < limit/4
			high = high || d > limit*3/4
		}
		if !low || !high {
			t.Fatalf("backoff(%d): 1000 draws never below a quarter or above three quarters of %v", n, limit)
		}
	}
}

// A huge Max does not overflow the doubling.
func TestBackoffNoOverflow(t *testing.T) {
	t.Parallel()
	p := Policy{Initial: time.Second, Max: 1<<63 - 1, Rand: func() float64 { return 0.5 }}.withDefaults()
	for n := 1; n < 200; n++ {
		if d := p.backoff(n); d < 0 {
			t.Fatalf("backoff(%d) = %v", n, d)
		}
	}
}
