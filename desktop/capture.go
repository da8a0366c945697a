package desktop

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"image"
	"image/jpeg"
	"image/png"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/disintegration/imaging"
	"github.com/jezek/xgb/shm"
	"github.com/jezek/xgb/xproto"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// Screenshot formats.
const (
	FormatPNG  = "png"
	FormatJPEG = "jpeg"
)

// defaultQuality is the JPEG quality when none is asked for: the
// agents' usual 80, where text stays legible at about 70 KB per 1280x800
// frame.
const defaultQuality = 80

// keptFrames is how many recent frames an action may name in "frame".
// Agents act on the latest screenshot or the one before; a few more cover
// a client that pipelines.
const keptFrames = 16

// ShotOptions says how to encode a screenshot. The zero value is a PNG at
// screen size.
type ShotOptions struct {
	// Format is "png" (default) or "jpeg" ("jpg" is accepted).
	Format string `json:"format,omitempty"`
	// Quality is the JPEG quality, 1–100; 0 means 80.
	Quality int `json:"quality,omitempty"`
	// Width and Height bound the image: it is scaled down, keeping the
	// screen's aspect ratio, until it fits both. 0 leaves that side free.
	// A screenshot is never scaled up.
	Width  int `json:"width,omitempty"`
	Height int `json:"height,omitempty"`
}

func (o ShotOptions) normalize() (ShotOptions, error) {
	switch o.Format {
	case "", FormatPNG:
		o.Format = FormatPNG
	case FormatJPEG, "jpg":
		o.Format = FormatJPEG
	default:
		return o, fmt.Errorf("screenshot format %q: want png or jpeg", o.Format)
	}
	switch {
	case o.Quality == 0:
		o.Quality = defaultQuality
	case o.Quality < 1 || o.Quality > 100:
		return o, fmt.Errorf("screenshot quality %d: want 1 to 100", o.Quality)
	}
	if o.Width < 0 || o.Height < 0 {
		return o, fmt.Errorf("screenshot size %dx%d: must not be negative", o.Width, o.Height)
	}
	return o, nil
}

// Frame identifies a screenshot and maps its pixels to the screen's
// (api.Frame: ToScreen, FromScreen). Actions give coordinates in the
// pixels of a frame.
type Frame = api.Frame

// contains reports whether (x, y) in frame pixels lies on the frame.
func contains(f Frame, x, y float64) bool {
	return x >= 0 && y >= 0 && x <= float64(f.Width) && y <= float64(f.Height)
}

// Screenshot is an encoded image of the screen and the frame it defines.
type Screenshot = api.DesktopScreenshot

// Screenshot captures the screen and encodes it as o says. The capture
// becomes the latest frame: actions that follow give coordinates in its
// pixels.
func (s *Session) Screenshot(ctx context.Context, o ShotOptions) (*Screenshot, error) {
	o, err := o.normalize()
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeActionInvalid, faults.InvalidRequest, faults.Policy, err.Error())
	}
	img := s.frameBuf()
	defer s.framePool.Put(img)
	if err := s.withX(ctx, "screenshot", 0, func(_ context.Context, x *xconn) error { return x.capture(img, false) }); err != nil {
		return nil, err
	}
	f := Frame{Scale: 1, Width: s.width, Height: s.height, ScreenWidth: s.width, ScreenHeight: s.height}
	var out *image.RGBA = img
	if w, h, scale := fitSize(s.width, s.height, o.Width, o.Height); scale < 1 {
		out = downscale(img, w, h)
		f.Width, f.Height, f.Scale = w, h, scale
	}
	data, err := s.encode(out, o)
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Desktop, "encode screenshot")
	}
	f.ID = s.recordFrame(f)
	return &Screenshot{Frame: f, Format: o.Format, Data: data}, nil
}

// CaptureInto captures the screen into dst, or into a new image when dst
// is nil or not the screen's size, and returns the image. It records no
// frame: it is for streams and recordings, not for agents.
func (s *Session) CaptureInto(ctx context.Context, dst *image.RGBA) (*image.RGBA, error) {
	if dst == nil || dst.Rect != image.Rect(0, 0, s.width, s.height) {
		dst = image.NewRGBA(image.Rect(0, 0, s.width, s.height))
	}
	if err := s.withX(ctx, "capture", 0, func(_ context.Context, x *xconn) error { return x.capture(dst, false) }); err != nil {
		return nil, err
	}
	return dst, nil
}

// frameBuf returns a screen-sized image from the pool: a 1280x800 frame
// is 4 MB, too much to allocate per screenshot.
func (s *Session) frameBuf() *image.RGBA {
	if img, ok := s.framePool.Get().(*image.RGBA); ok {
		return img
	}
	return image.NewRGBA(image.Rect(0, 0, s.width, s.height))
}

// recordFrame registers f as the latest frame and returns its id.
func (s *Session) recordFrame(f Frame) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.frameSeq++
	f.ID = s.frameSeq
	s.frames = append(s.frames, f)
	if len(s.frames) > keptFrames {
		s.frames = s.frames[1:]
	}
	return f.ID
}

// frame returns the frame an action's coordinates refer to: the one it
// names if still kept, else the latest; with strict, naming any frame
// but the latest is an error. Before the first screenshot coordinates are
// screen pixels.
func (s *Session) frame(id *int64, strict bool) (Frame, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	screen := Frame{Scale: 1, Width: s.width, Height: s.height, ScreenWidth: s.width, ScreenHeight: s.height}
	latest := screen
	if n := len(s.frames); n > 0 {
		latest = s.frames[n-1]
	}
	if id == nil {
		return latest, nil
	}
	if strict && *id != latest.ID {
		return Frame{}, faults.Newf(faults.CodeActionStaleFrame, faults.Conflict, faults.Policy,
			"frame %d is not the latest screenshot (%d): take a screenshot and act on it", *id, latest.ID)
	}
	for _, f := range s.frames {
		if f.ID == *id {
			return f, nil
		}
	}
	return latest, nil
}

// fitSize is the largest size within maxW x maxH (0 = unbounded) with the
// aspect ratio of w x h, and its scale; scale 1 means no scaling.
func fitSize(w, h, maxW, maxH int) (int, int, float64) {
	scale := 1.0
	if maxW > 0 && maxW < w {
		scale = float64(maxW) / float64(w)
	}
	if maxH > 0 && maxH < h {
		scale = min(scale, float64(maxH)/float64(h))
	}
	if scale >= 1 {
		return w, h, 1
	}
	sw, sh := max(1, int(math.Round(float64(w)*scale))), max(1, int(math.Round(float64(h)*scale)))
	switch {
	case sw == w && sh == h:
		return w, h, 1
	case sw == w:
		// A side far shorter than the other can round back to its full
		// size; the image is still scaled, along the other side.
		return sw, sh, float64(sh) / float64(h)
	}
	return sw, sh, float64(sw) / float64(w)
}

// downscale resizes img to w x h with imaging's linear (triangle) filter.
// Measured at 1280x800 → 640x400 on 2 cores: imaging.Linear 6.5 ms,
// golang.org/x/image/draw BiLinear 13.8 ms, CatmullRom 23 ms (imaging
// 10.4 ms). draw.ApproxBiLinear takes 5.0 ms but samples without
// averaging, so thin text aliases away; imaging.Linear widens its kernel
// with the scale factor (an area filter) and spreads rows over the cores.
func downscale(img *image.RGBA, w, h int) *image.RGBA {
	n := imaging.Resize(img, w, h, imaging.Linear)
	// The screen is opaque, so the non-premultiplied result is also a
	// valid premultiplied one once alpha is exactly 255 again (the filter
	// may round it); the encoders then take their RGBA fast paths.
	for i := 3; i < len(n.Pix); i += 4 {
		n.Pix[i] = 0xff
	}
	return &image.RGBA{Pix: n.Pix, Stride: n.Stride, Rect: n.Rect}
}

// pngBuffers lets the PNG encoder reuse its compression state across
// screenshots (png.EncoderBufferPool).
type pngBuffers struct{ p sync.Pool }

func (b *pngBuffers) Get() *png.EncoderBuffer {
	buf, _ := b.p.Get().(*png.EncoderBuffer)
	return buf
}

func (b *pngBuffers) Put(buf *png.EncoderBuffer) { b.p.Put(buf) }

// encode writes img in o's format. JPEG uses the striped encoder, which
// spreads a frame's stripes over the cores and reuses the coded stripes
// the last frame of the same size shares with this one (an agent's step
// mostly changes a small part of the screen). PNG uses BestSpeed: at
// 1280x800 it takes about 60 % of the default level's time for 1.7x the
// bytes, and a step's latency matters more than its size on a local link.
func (s *Session) encode(img *image.RGBA, o ShotOptions) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(int(s.lastSize.Load()) * 5 / 4)
	var err error
	switch o.Format {
	case FormatJPEG:
		if s.opts.StdJPEG {
			err = jpeg.Encode(&buf, img, &jpeg.Options{Quality: o.Quality})
		} else {
			err = s.jpeg.Encode(&buf, img, o.Quality)
		}
	default:
		enc := png.Encoder{CompressionLevel: png.BestSpeed, BufferPool: &s.pngPool}
		err = enc.Encode(&buf, img)
	}
	if err != nil {
		return nil, err
	}
	s.lastSize.Store(int64(buf.Len()))
	return buf.Bytes(), nil
}

// grab reads the screen's pixels, as the server's 32-bit ZPixmap, into
// the shared-memory segment, or with a plain GetImage when MIT-SHM is
// unavailable or plain is set. The bytes stay valid until the next grab.
func (x *xconn) grab(plain bool) ([]byte, error) {
	n := x.w * x.h * 4
	if x.shm != nil && !plain {
		r, err := shm.GetImage(x.c, xproto.Drawable(x.root), 0, 0, uint16(x.w), uint16(x.h),
			0xffffffff, xproto.ImageFormatZPixmap, shm.Seg(x.shm.seg), 0).Reply()
		if err := replyErr(r == nil, err); err != nil {
			return nil, err
		}
		return x.shm.mem[:n], nil
	}
	r, err := xproto.GetImage(x.c, xproto.ImageFormatZPixmap, xproto.Drawable(x.root), 0, 0,
		uint16(x.w), uint16(x.h), 0xffffffff).Reply()
	if err := replyErr(r == nil, err); err != nil {
		return nil, err
	}
	if len(r.Data) < n {
		return nil, fmt.Errorf("GetImage returned %d bytes, want %d", len(r.Data), n)
	}
	return r.Data[:n], nil
}

// capture grabs the screen into dst, which must be the screen's size.
func (x *xconn) capture(dst *image.RGBA, plain bool) error {
	src, err := x.grab(plain)
	if err != nil {
		return err
	}
	toRGBA(dst.Pix, src, x.bgr)
	return nil
}

// parallelMin is the pixel count from which conversion is split over the
// cores: below it, starting goroutines costs more than it saves.
const parallelMin = 1 << 18

// toRGBA converts 32-bit pixels from the server's layout (B,G,R,X bytes
// when bgr, else X,R,G,B) to opaque RGBA, one 32-bit word at a time.
func toRGBA(dst, src []byte, bgr bool) {
	n := min(len(dst), len(src)) / 4
	workers := runtime.GOMAXPROCS(0)
	if n < parallelMin || workers < 2 {
		convertRange(dst[:n*4], src[:n*4], bgr)
		return
	}
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Go(func() { convertRange(dst[lo*4:hi*4], src[lo*4:hi*4], bgr) })
	}
	wg.Wait()
}

func convertRange(dst, src []byte, bgr bool) {
	dst = dst[:len(src)]
	i := 0
	if bgr {
		// Two pixels per step. In a little-endian word a B,G,R,X pixel is
		// 0xXXRRGGBB and an R,G,B,A one 0xAABBGGRR: swap the low and
		// third bytes of each half and set alpha.
		for ; i+8 <= len(src); i += 8 {
			v := binary.LittleEndian.Uint64(src[i:])
			binary.LittleEndian.PutUint64(dst[i:], 0xff000000ff000000|v&0x0000ff000000ff00|
				(v>>16)&0x000000ff000000ff|(v&0x000000ff000000ff)<<16)
		}
		for ; i+4 <= len(src); i += 4 {
			v := binary.LittleEndian.Uint32(src[i:])
			binary.LittleEndian.PutUint32(dst[i:], 0xff000000|v&0x0000ff00|(v>>16)&0xff|(v&0xff)<<16)
		}
		return
	}
	for ; i+4 <= len(src); i += 4 { // X,R,G,B
		dst[i], dst[i+1], dst[i+2], dst[i+3] = src[i+1], src[i+2], src[i+3], 0xff
	}
}

// msSince is the time since t in milliseconds, with microsecond precision.
func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }
