package recordings

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color/palette"
	"image/gif"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"

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
		if maxWidth > 0 && img.Bounds().Dx() > maxWidth {
			img = scaleTo(img, maxWidth, img.Bounds().Dy()*maxWidth/img.Bounds().Dx())
		}
		if err := fn(img); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func scaleTo(src image.Image, w, h int) *image.RGBA {
	if h < 1 {
		h = 1
	}
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.ApproxBiLinear.Scale(dst, dst.Bounds(), src, src.Bounds(), draw.Src, nil)
	return dst
}

// exportGIF animates the screenshots, one second per step, dithered
// (Floyd-Steinberg) onto the fixed Plan 9 palette: no per-frame palette
// search, and colours stay stable from frame to frame.
func (r *Recording) exportGIF(ctx context.Context, w io.Writer) error {
	anim := &gif.GIF{}
	_, err := r.frames(ctx, maxGIFWidth, func(img image.Image) error {
		b := img.Bounds()
		p := image.NewPaletted(image.Rect(0, 0, b.Dx(), b.Dy()), palette.Plan9)
		draw.FloydSteinberg.Draw(p, p.Bounds(), img, b.Min)
		anim.Image = append(anim.Image, p)
		anim.Delay = append(anim.Delay, gifDelay)
		anim.Config.Width = max(anim.Config.Width, b.Dx())
		anim.Config.Height = max(anim.Config.Height, b.Dy())
		return nil
	})
	if err != nil {
		return fmt.Errorf("export %s as gif: %w", r.m.ID, err)
	}
	if len(anim.Image) == 0 {
		return fmt.Errorf("export %s as gif: %w", r.m.ID, errNoFrames)
	}
	if err := gif.EncodeAll(w, anim); err != nil {
		return fmt.Errorf("export %s as gif: %w", r.m.ID, err)
	}
	return nil
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
