package browser

import (
	"bytes"
	"image"
	"image/color"
	"image/draw"
	"image/jpeg"
	"image/png"
	"strconv"
)

// digits is a 5×7 bitmap font for the mark labels: one row per byte, the
// low five bits from left to right.
var digits = [10][7]uint8{
	{0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E},
	{0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},
	{0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F},
	{0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},
	{0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02},
	{0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},
	{0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E},
	{0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},
	{0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E},
	{0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C},
}

// markColors are distinct, saturated colours that white digits read on.
var markColors = []color.RGBA{
	{230, 25, 75, 255}, {60, 140, 60, 255}, {0, 90, 200, 255}, {200, 100, 0, 255},
	{145, 30, 180, 255}, {0, 130, 130, 255}, {170, 110, 40, 255}, {128, 0, 0, 255},
	{0, 0, 128, 255}, {100, 100, 100, 255},
}

// drawMarks outlines each element on the screenshot and labels it with its
// id, then re-encodes the image in its format.
func drawMarks(shot *Screenshot, els []Element, quality int) error {
	src, _, err := image.Decode(bytes.NewReader(shot.Data))
	if err != nil {
		return err
	}
	img := image.NewRGBA(src.Bounds())
	draw.Draw(img, img.Bounds(), src, src.Bounds().Min, draw.Src)
	// Labels scale with the image: 2× pixels from about 800 px wide.
	px := 1
	if img.Bounds().Dx() >= 800 {
		px = 2
	}
	for _, e := range els {
		c := markColors[e.ID%len(markColors)]
		r := image.Rect(int(e.BBox[0]), int(e.BBox[1]), int(e.BBox[0]+e.BBox[2]), int(e.BBox[1]+e.BBox[3])).Intersect(img.Bounds())
		if r.Empty() {
			continue
		}
		outline(img, r, c, px)
		label(img, r.Min, strconv.Itoa(e.ID), c, px)
	}
	var buf bytes.Buffer
	if shot.Format == "png" {
		enc := png.Encoder{CompressionLevel: png.BestSpeed}
		err = enc.Encode(&buf, img)
	} else {
		err = jpeg.Encode(&buf, img, &jpeg.Options{Quality: quality})
	}
	if err != nil {
		return err
	}
	shot.Data = buf.Bytes()
	return nil
}

func outline(img *image.RGBA, r image.Rectangle, c color.RGBA, w int) {
	u := image.NewUniform(c)
	draw.Draw(img, image.Rect(r.Min.X, r.Min.Y, r.Max.X, r.Min.Y+w).Intersect(r), u, image.Point{}, draw.Src)
	draw.Draw(img, image.Rect(r.Min.X, r.Max.Y-w, r.Max.X, r.Max.Y).Intersect(r), u, image.Point{}, draw.Src)
	draw.Draw(img, image.Rect(r.Min.X, r.Min.Y, r.Min.X+w, r.Max.Y).Intersect(r), u, image.Point{}, draw.Src)
	draw.Draw(img, image.Rect(r.Max.X-w, r.Min.Y, r.Max.X, r.Max.Y).Intersect(r), u, image.Point{}, draw.Src)
}

// label draws text (digits) in white on a box of colour c whose top-left
// corner is at p, moved inside the image when it would fall off.
func label(img *image.RGBA, p image.Point, text string, c color.RGBA, px int) {
	w := (len(text)*6 + 1) * px
	h := 9 * px
	b := img.Bounds()
	if p.X+w > b.Max.X {
		p.X = b.Max.X - w
	}
	if p.Y+h > b.Max.Y {
		p.Y = b.Max.Y - h
	}
	p.X, p.Y = max(p.X, b.Min.X), max(p.Y, b.Min.Y)
	draw.Draw(img, image.Rect(p.X, p.Y, p.X+w, p.Y+h).Intersect(b), image.NewUniform(c), image.Point{}, draw.Src)
	white := color.RGBA{255, 255, 255, 255}
	for i, ch := range text {
		g := digits[ch-'0']
		ox := p.X + (1+i*6)*px
		for row := 0; row < 7; row++ {
			for col := 0; col < 5; col++ {
				if g[row]&(0x10>>col) == 0 {
					continue
				}
				for dy := 0; dy < px; dy++ {
					for dx := 0; dx < px; dx++ {
						x, y := ox+col*px+dx, p.Y+(1+row)*px+dy
						if (image.Point{x, y}).In(b) {
							img.SetRGBA(x, y, white)
						}
					}
				}
			}
		}
	}
}
