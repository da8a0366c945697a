package recordings

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/orchard/orchard/faults"
)

// Export formats.
const (
	FormatJSONL   = "jsonl"
	FormatHTML    = "html"
	FormatGIF     = "gif"
	FormatParquet = "parquet"
	FormatMP4     = "mp4"
)

// Formats lists the export formats in a stable order.
var Formats = []string{FormatJSONL, FormatHTML, FormatGIF, FormatParquet, FormatMP4}

// contentTypes are the export formats' content types.
var contentTypes = map[string]string{
	FormatJSONL:   "application/x-ndjson",
	FormatHTML:    "text/html; charset=utf-8",
	FormatGIF:     "image/gif",
	FormatParquet: "application/vnd.apache.parquet",
	FormatMP4:     "video/mp4",
}

// ContentType is the content type of an export in format, known before
// the export is written; an unknown format is a classified error.
func ContentType(format string) (string, error) {
	if ct, ok := contentTypes[strings.ToLower(format)]; ok {
		return ct, nil
	}
	return "", faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
		"unknown export format %q (want one of %s)", format, strings.Join(Formats, ", "))
}

// Export writes the recording to w in format and returns the content type.
// Unknown formats and missing tools fail before anything is written; an
// error after the first byte means w holds a truncated export.
func (r *Recording) Export(ctx context.Context, format string, w io.Writer) (string, error) {
	ct, err := ContentType(format)
	if err != nil {
		return "", err
	}
	switch strings.ToLower(format) {
	case FormatJSONL:
		err = r.exportJSONL(ctx, w)
	case FormatHTML:
		err = r.exportHTML(ctx, w)
	case FormatGIF:
		err = r.exportGIF(ctx, w)
	case FormatParquet:
		err = r.exportParquet(ctx, w)
	case FormatMP4:
		err = r.exportMP4(ctx, w)
	}
	return ct, err
}

// JSONLLine is one line of the jsonl export. The first line has Type
// "manifest" and Manifest set; each following line has Type "step", Step
// set and, when the step has a screenshot, the image inlined as base64.
type JSONLLine struct {
	Type      string    `json:"type"` // manifest | step
	Manifest  *Manifest `json:"manifest,omitempty"`
	Step      *Step     `json:"step,omitempty"`
	ImageType string    `json:"image_type,omitempty"`
	Image     string    `json:"image,omitempty"` // standard base64
}

func (r *Recording) exportJSONL(ctx context.Context, w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	m := r.m
	if err := enc.Encode(JSONLLine{Type: "manifest", Manifest: &m}); err != nil {
		return fmt.Errorf("export %s as jsonl: %w", r.m.ID, err)
	}
	for i := range r.steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		st := r.steps[i]
		line := JSONLLine{Type: "step", Step: &st}
		if st.Screenshot != "" {
			b, err := r.readImage(st)
			if err != nil {
				return fmt.Errorf("export %s as jsonl: %w", r.m.ID, err)
			}
			line.ImageType = contentTypeOf(st.Screenshot)
			line.Image = base64.StdEncoding.EncodeToString(b)
		}
		if err := enc.Encode(line); err != nil {
			return fmt.Errorf("export %s as jsonl: %w", r.m.ID, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("export %s as jsonl: %w", r.m.ID, err)
	}
	return nil
}

// point is an action's target in screenshot pixels.
type point struct{ X, Y float64 }

// actionPoint returns the x, y of an action ({"x":..,"y":..}), or of the
// first point of a drag path ([[x,y],...] or [{"x":..,"y":..},...]).
func actionPoint(action json.RawMessage) (point, bool) {
	if len(action) == 0 {
		return point{}, false
	}
	if action[0] == '[' {
		// Several actions sent in one step: the first that has a point.
		var list []json.RawMessage
		_ = json.Unmarshal(action, &list)
		for _, a := range list {
			if p, ok := actionPoint(a); ok {
				return p, true
			}
		}
		return point{}, false
	}
	var a struct {
		X    *float64          `json:"x"`
		Y    *float64          `json:"y"`
		Path []json.RawMessage `json:"path"`
	}
	if json.Unmarshal(action, &a) != nil {
		return point{}, false
	}
	if a.X != nil && a.Y != nil {
		return point{*a.X, *a.Y}, true
	}
	if len(a.Path) > 0 {
		var pair [2]float64
		if json.Unmarshal(a.Path[0], &pair) == nil {
			return point{pair[0], pair[1]}, true
		}
		var obj struct{ X, Y *float64 }
		if json.Unmarshal(a.Path[0], &obj) == nil && obj.X != nil && obj.Y != nil {
			return point{*obj.X, *obj.Y}, true
		}
	}
	return point{}, false
}
