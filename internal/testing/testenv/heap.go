package testenv

import (
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// HeapPeak samples the heap while the code under test runs, with the
// garbage collector kept close to the live heap so that garbage does not
// pass for it. The returned function stops the sampling, puts the
// collector back and reports how far the heap grew above where it stood
// at the start, in bytes.
func HeapPeak() (stop func() int64) {
	old := debug.SetGCPercent(10)
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(done)
		<-sampled
		debug.SetGCPercent(old)
		return int64(peak.Load()) - int64(base.HeapAlloc)
	}
}
