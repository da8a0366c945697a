package recordings

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color/palette"
	"image/gif"
	"image/png"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"golang.org/x/image/draw"

	"github.com/orchard/orchard/faults"
)

// maxGIFWidth bounds GIF frames: recordings are watched in a browser or an
// issue comment, where wider frames only cost bytes.
const maxGIFWidth = 640

// gifDelay is the time each frame shows, in 1/100 s: one step a second is
// slow enough to read the page.
const gifDelay = 100

var errNoFrames = faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "recording has no screenshots to animate")

// frames decodes the screenshots in step order, scaled to at most maxWidth
// pixels wide (0: no limit), calling fn for each.
func (r *Recording) frames(ctx context.Context, maxWidth int, fn func(image.Image) error) (int, error) {
	n := 0
	for _, st := range r.steps {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if st.Screenshot == "" {
			if r.textFrames() {
				img := shellFrame(st)
				if w, h := frameSize(textFrameW, textFrameH, maxWidth); w != textFrameW {
					img = scaleTo(img, w, h)
				}
				if err := fn(img); err != nil {
					return n, err
				}
				n++
			}
			continue
		}
		b, err := r.readImage(st)
		if err != nil {
			return n, err
		}
		img, _, err := image.Decode(bytes.NewReader(b))
		if err != nil {
			return n, fmt.Errorf("decode screenshot of step %d: %w", st.N, err)
		}
		if w, h := frameSize(img.Bounds().Dx(), img.Bounds().Dy(), maxWidth); w != img.Bounds().Dx() {
			img = scaleTo(img, w, h)
		}
		if err := fn(img); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// frameSize is the size of a w×h screenshot as a frame at most maxWidth
// wide (0: no limit), its aspect kept.
func frameSize(w, h, maxWidth int) (int, int) {
	if maxWidth > 0 && w > maxWidth {
		return maxWidth, max(h*maxWidth/w, 1)
	}
	return w, h
}

func scaleTo(src image.Image, w, h int) *image.RGBA {
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.ApproxBiLinear.Scale(dst, dst.Bounds(), src, src.Bounds(), draw.Src, nil)
	return dst
}

// exportGIF animates the screenshots, one second per step, dithered
// (Floyd-Steinberg) onto the fixed Plan 9 palette: no per-frame palette
// search, and colours stay stable from frame to frame (ditherPlan9). Frames are encoded
// and written one at a time, so a long recording costs one frame of
// memory, not all of them: the file is the header of a GIF the size of the
// largest frame, then each frame as image/gif encodes it alone.
func (r *Recording) exportGIF(ctx context.Context, w io.Writer) error {
	width, height, n, err := r.frameBounds(ctx, maxGIFWidth)
	if err != nil {
		return fmt.Errorf("export %s as gif: %w", r.m.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("export %s as gif: %w", r.m.ID, errNoFrames)
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	writeGIFHeader(bw, width, height, n > 1)
	var one bytes.Buffer
	_, err = r.frames(ctx, maxGIFWidth, func(img image.Image) error {
		p := ditherPlan9(img)
		one.Reset()
		if err := gif.EncodeAll(&one, &gif.GIF{Image: []*image.Paletted{p}, Delay: []int{gifDelay}}); err != nil {
			return err
		}
		frame, err := gifFrame(one.Bytes())
		if err != nil {
			return err
		}
		_, err = bw.Write(frame)
		return err
	})
	if err == nil {
		err = bw.WriteByte(gifTrailer)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return fmt.Errorf("export %s as gif: %w", r.m.ID, err)
	}
	return nil
}

const gifTrailer = 0x3b

// writeGIFHeader writes a GIF89a header for a screen of w×h with no
// global colour table (each frame carries its own), looping for ever when
// there is more than one frame — what gif.EncodeAll writes for such a GIF.
func writeGIFHeader(w *bufio.Writer, width, height int, loop bool) {
	w.WriteString("GIF89a")
	w.Write([]byte{byte(width), byte(width >> 8), byte(height), byte(height >> 8), 0, 0, 0})
	if loop {
		w.Write([]byte{0x21, 0xff, 0x0b})
		w.WriteString("NETSCAPE2.0")
		w.Write([]byte{0x03, 0x01, 0, 0, 0})
	}
}

// gifFrame returns the frame of a one-frame GIF as gif.EncodeAll writes
// it without a global colour table: the bytes between its 13-byte header
// and its trailer.
func gifFrame(b []byte) ([]byte, error) {
	if len(b) < 14 || string(b[:6]) != "GIF89a" || b[10]&0x80 != 0 || b[len(b)-1] != gifTrailer {
		return nil, errors.New("unexpected layout of an encoded frame")
	}
	return b[13 : len(b)-1], nil
}

// frameBounds reads only the screenshots' headers: how many frames there
// are and the largest width and height among them as frames (frameSize).
func (r *Recording) frameBounds(ctx context.Context, maxWidth int) (width, height, n int, err error) {
	for _, st := range r.steps {
		if err := ctx.Err(); err != nil {
			return 0, 0, 0, err
		}
		if st.Screenshot == "" {
			if r.textFrames() {
				w, h := frameSize(textFrameW, textFrameH, maxWidth)
				width, height, n = max(width, w), max(height, h), n+1
			}
			continue
		}
		cfg, err := r.imageConfig(st)
		if err != nil {
			return 0, 0, 0, err
		}
		w, h := frameSize(cfg.Width, cfg.Height, maxWidth)
		width, height, n = max(width, w), max(height, h), n+1
	}
	return width, height, n, nil
}

func errNeedFFmpeg() error {
	return faults.New(faults.CodeKindUnsupported, faults.NotImplemented, faults.Platform, "mp4 export needs ffmpeg")
}

// exportMP4 writes the screenshots as PNG frames to a temporary directory
// and encodes them with ffmpeg at one frame a second, H.264 (or MPEG-4 Part
// 2 where ffmpeg lacks libx264), yuv420p so every player can show it.
func (r *Recording) exportMP4(ctx context.Context, w io.Writer) error {
	ffmpeg, err := exec.LookPath("ffmpeg")
	if err != nil {
		return errNeedFFmpeg()
	}
	tmp, err := os.MkdirTemp("", "orchard-mp4-")
	if err != nil {
		return fmt.Errorf("export %s as mp4: %w", r.m.ID, err)
	}
	defer os.RemoveAll(tmp)
	// yuv420p needs even sizes, and every frame must match the first.
	var fw, fh, n int
	_, err = r.frames(ctx, 0, func(img image.Image) error {
		if n == 0 {
			fw, fh = max(img.Bounds().Dx()&^1, 2), max(img.Bounds().Dy()&^1, 2)
		}
		if img.Bounds().Dx() != fw || img.Bounds().Dy() != fh {
			img = scaleTo(img, fw, fh)
		}
		f, err := os.Create(filepath.Join(tmp, fmt.Sprintf("frame%06d.png", n)))
		if err != nil {
			return err
		}
		if err := png.Encode(f, img); err != nil {
			f.Close()
			return err
		}
		n++
		return f.Close()
	})
	if err != nil {
		return fmt.Errorf("export %s as mp4: %w", r.m.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("export %s as mp4: %w", r.m.ID, errNoFrames)
	}
	out := filepath.Join(tmp, "out.mp4")
	var lastErr error
	for _, codec := range []string{"libx264", "mpeg4"} {
		cmd := exec.CommandContext(ctx, ffmpeg, "-hide_banner", "-loglevel", "error", "-y",
			"-framerate", "1", "-i", filepath.Join(tmp, "frame%06d.png"),
			"-c:v", codec, "-pix_fmt", "yuv420p", "-r", "25", "-movflags", "+faststart", out)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			lastErr = fmt.Errorf("ffmpeg -c:v %s: %w: %s", codec, err, bytes.TrimSpace(stderr.Bytes()))
			continue
		}
		f, err := os.Open(out)
		if err != nil {
			return fmt.Errorf("export %s as mp4: %w", r.m.ID, err)
		}
		defer f.Close()
		if _, err := io.Copy(w, f); err != nil {
			return fmt.Errorf("export %s as mp4: %w", r.m.ID, err)
		}
		return nil
	}
	return faults.Wrap(fmt.Errorf("export %s as mp4: %w", r.m.ID, lastErr), faults.CodeInternal, faults.Internal, faults.Platform, "mp4 encoding failed")
}

// plan9Cells maps a colour, 5 bits a channel, to the Plan 9 palette entry
// nearest the middle of its cell.
var plan9Cells = sync.OnceValue(func() *[1 << 15]uint8 {
	var lut [1 << 15]uint8
	for i := range lut {
		r, g, b := (i>>10)<<3|4, (i>>5&31)<<3|4, (i&31)<<3|4
		best, bestD := 0, math.MaxInt
		for j, c := range palette.Plan9 {
			cr, cg, cb, _ := c.RGBA()
			dr, dg, db := r-int(cr>>8), g-int(cg>>8), b-int(cb>>8)
			if d := dr*dr + dg*dg + db*db; d < bestD {
				best, bestD = j, d
			}
		}
		lut[i] = uint8(best)
	}
	return &lut
})

// ditherPlan9 maps img onto the Plan 9 palette with Floyd-Steinberg error
// diffusion. The nearest entry comes from a table (plan9Cells) instead of
// a search of the 256 entries for every pixel, as image/draw does: a
// 640×400 frame takes a few milliseconds instead of some 190. Alpha is
// ignored (screenshots are opaque).
func ditherPlan9(img image.Image) *image.Paletted {
	b := img.Bounds()
	src, ok := img.(*image.RGBA)
	if !ok {
		src = image.NewRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
		draw.Draw(src, src.Bounds(), img, b.Min, draw.Src)
	}
	w, h := src.Rect.Dx(), src.Rect.Dy()
	dst := image.NewPaletted(image.Rect(0, 0, w, h), palette.Plan9)
	lut := plan9Cells()
	var pal [256][3]int32
	for i, c := range palette.Plan9 {
		r, g, bl, _ := c.RGBA()
		pal[i] = [3]int32{int32(r >> 8), int32(g >> 8), int32(bl >> 8)}
	}
	// Errors carried to this row and the next, in 1/16ths, with a pixel
	// of margin on each side.
	cur, next := make([][3]int32, w+2), make([][3]int32, w+2)
	for y := range h {
		row := src.Pix[y*src.Stride : y*src.Stride+4*w]
		out := dst.Pix[y*dst.Stride : y*dst.Stride+w]
		for x := range w {
			var v [3]int32
			for c := range 3 {
				v[c] = min(max(int32(row[4*x+c])+(cur[x+1][c]+8)>>4, 0), 255)
			}
			idx := lut[v[0]>>3<<10|v[1]>>3<<5|v[2]>>3]
			out[x] = idx
			for c := range 3 {
				e := v[c] - pal[idx][c]
				cur[x+2][c] += 7 * e
				next[x][c] += 3 * e
				next[x+1][c] += 5 * e
				next[x+2][c] += e
			}
		}
		cur, next = next, cur
		clear(next)
	}
	return dst
}
