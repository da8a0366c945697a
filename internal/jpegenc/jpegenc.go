// Package jpegenc encodes opaque RGBA images as baseline JPEG: 4:2:0
// chroma, the quantisation tables of image/jpeg scaled the same way by
// quality, the standard Huffman tables — and a restart marker after every
// row of MCUs. The markers make each 16-pixel stripe an independent
// entropy-coded segment (the DC predictors reset at each one), so stripes
// encode in parallel on the cores, and an Encoder reuses the coded bytes
// of the stripes whose pixels did not change since its last image: the
// screen of a desktop mostly changes in a small part between two steps.
package jpegenc

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
)

// stripe is the height of an MCU with 4:2:0 sampling.
const stripe = 16

// parallelMin is the pixel count from which stripes are spread over the
// cores: below it, starting goroutines costs more than it saves.
const parallelMin = 1 << 16

// Encoder encodes images and remembers the last one's stripes, so that
// the next image of the same size and quality re-encodes only the
// stripes that differ. The zero value is ready to use; an Encoder is safe
// for concurrent use (a call that finds it busy encodes without reuse).
type Encoder struct {
	mu sync.Mutex // guards the fields below: the last image's stripes
	// w, h and quality are the last image's; another size or quality
	// discards the stripes.
	w, h, quality int
	prev          []byte   // the last image's pixels, rows of w*4 bytes
	segs          [][]byte // coded bytes of each stripe, without a marker
	reused        int      // stripes reused by the last Encode
}

// Encode writes img as a JPEG of the given quality (1–100) with no reuse.
func Encode(w io.Writer, img *image.RGBA, quality int) error {
	var e Encoder
	return e.encode(w, img, quality, false)
}

// Encode writes img as a JPEG of the given quality (1–100), reusing the
// coded bytes of each stripe whose pixels equal the last image's.
func (e *Encoder) Encode(w io.Writer, img *image.RGBA, quality int) error {
	if !e.mu.TryLock() {
		return Encode(w, img, quality)
	}
	defer e.mu.Unlock()
	return e.encode(w, img, quality, true)
}

// Reused returns how many stripes the last Encode with reuse took from
// the image before it.
func (e *Encoder) Reused() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reused
}

func (e *Encoder) encode(out io.Writer, img *image.RGBA, quality int, keep bool) error {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	switch {
	case w <= 0 || h <= 0:
		return errors.New("jpeg: empty image")
	case w >= 1<<16 || h >= 1<<16:
		return fmt.Errorf("jpeg: image %dx%d too large", w, h)
	case quality < 1 || quality > 100:
		return fmt.Errorf("jpeg: quality %d: want 1 to 100", quality)
	}
	n := (h + stripe - 1) / stripe
	if e.w != w || e.h != h || e.quality != quality || !keep {
		e.w, e.h, e.quality = w, h, quality
		e.prev = e.prev[:0]
		e.segs = make([][]byte, n)
	}
	// Each worker takes the next stripe and encodes it if its pixels
	// changed. The comparison is exact (memcmp), so a reused stripe is
	// never stale; comparing and copying in the workers spreads them over
	// the cores too.
	fresh := len(e.prev) != w*h*4
	if fresh && keep {
		// Screenshots alternating between two sizes keep one buffer.
		if cap(e.prev) >= w*h*4 {
			e.prev = e.prev[:w*h*4]
		} else {
			e.prev = make([]byte, w*h*4)
		}
	}
	t := tablesFor(quality)
	workers := runtime.GOMAXPROCS(0)
	if w*h < parallelMin {
		workers = 1
	}
	var next, reused atomic.Int64
	work := func() {
		var s scratch
		for {
			i := int(next.Add(1)) - 1
			if i >= n {
				return
			}
			y0, y1 := i*stripe, min(i*stripe+stripe, h)
			changed := fresh
			for y := y0; y < y1 && !changed; y++ {
				changed = !bytes.Equal(row(img, y), e.prev[y*w*4:(y+1)*w*4])
			}
			if !changed {
				reused.Add(1)
				continue
			}
			if keep {
				for y := y0; y < y1; y++ {
					copy(e.prev[y*w*4:], row(img, y))
				}
			}
			e.segs[i] = s.encodeStripe(e.segs[i][:0], img, y0, t)
		}
	}
	if workers <= 1 {
		work()
	} else {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(work)
		}
		wg.Wait()
	}
	e.reused = int(reused.Load())
	size := len(t.header) + 64 + 2*n
	for _, s := range e.segs {
		size += len(s)
	}
	buf := make([]byte, 0, size)
	buf = appendHeader(buf, t, w, h)
	for i, s := range e.segs {
		if i > 0 {
			buf = append(buf, 0xff, byte(0xd0+(i-1)%8)) // RSTn, n cycling 0..7
		}
		buf = append(buf, s...)
	}
	buf = append(buf, 0xff, 0xd9) // EOI
	if !keep {
		e.segs = nil
	}
	_, err := out.Write(buf)
	return err
}

// row is the pixels of img's row y (from the image's top), w*4 bytes.
func row(img *image.RGBA, y int) []byte {
	o := img.PixOffset(img.Rect.Min.X, img.Rect.Min.Y+y)
	return img.Pix[o : o+img.Rect.Dx()*4]
}

// appendHeader writes SOI, the quantisation tables, the frame (Y 2x2,
// Cb and Cr 1x1), the Huffman tables, the restart interval (one row of
// MCUs) and the scan header.
func appendHeader(b []byte, t *tables, w, h int) []byte {
	b = append(b, 0xff, 0xd8)
	b = append(b, t.header...)
	b = append(b, 0xff, 0xc0, 0, 17, 8, byte(h>>8), byte(h), byte(w>>8), byte(w), 3,
		1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1)
	b = append(b, huffHeader...)
	mcus := (w + stripe - 1) / stripe
	b = append(b, 0xff, 0xdd, 0, 4, byte(mcus>>8), byte(mcus))
	b = append(b, 0xff, 0xda, 0, 12, 3, 1, 0x00, 2, 0x11, 3, 0x11, 0, 63, 0)
	return b
}
