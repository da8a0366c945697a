package recordings

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed" // the replay page's template
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"image"
	_ "image/jpeg" // screenshot sizes for the action markers
	_ "image/png"
	"io"
	"slices"
	"strconv"

	_ "golang.org/x/image/webp"

	"github.com/orchard/orchard/faults"
)

type htmlStep struct {
	Step
	// ImageSrc is the src attribute with the screenshot as a data: URL,
	// given whole so html/template does not entity-escape every "+" of the
	// base64 (valid either way, but a third larger).
	ImageSrc template.HTMLAttr
	Action   string // indented JSON
	Result   string
	// Marker is the next action's target over this screenshot, as
	// percentages of the image so it scales with the rendered size.
	Marker      bool
	MarkerLeft  string
	MarkerTop   string
	MarkerLabel string
	// Overlay draws the rest of the next action (element box, drag path,
	// scroll arrow, typed text) in the screenshot's own pixels.
	Overlay    *overlay
	Shell      *shellStep
	Settle     string
	ActionType string
	Attributed bool // the manifest attributes the episode's failure to this step
}

type htmlPage struct {
	CSP        string
	Script     template.JS
	M          Manifest
	Reward     string
	Duration   string
	Steps      []htmlStep
	Evaluation *htmlEvaluation
}

// htmlEvaluation is the manifest's evaluation as the replay shows it: the
// evaluator, its verdict, and what it compared (expected vs got).
type htmlEvaluation struct {
	Type    string
	Success string
	Reward  string
	Details []evalDetail
}

type evalDetail struct{ Key, Value string }

func evaluationOf(raw json.RawMessage) *htmlEvaluation {
	var e struct {
		Type    string         `json:"type"`
		Success *bool          `json:"success"`
		Reward  *float64       `json:"reward"`
		Details map[string]any `json:"details"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &e) != nil {
		return nil
	}
	h := &htmlEvaluation{Type: e.Type}
	if e.Success != nil {
		h.Success = strconv.FormatBool(*e.Success)
	}
	if e.Reward != nil {
		h.Reward = strconv.FormatFloat(*e.Reward, 'g', -1, 64)
	}
	keys := make([]string, 0, len(e.Details))
	for k := range e.Details {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := e.Details[k]
		s, ok := v.(string)
		if !ok {
			b, _ := json.Marshal(v)
			s = string(b)
		}
		h.Details = append(h.Details, evalDetail{k, s})
	}
	return h
}

//go:embed replay.html.tmpl
var htmlTemplateText string

// replayScript is the page's one script (thumbnails, arrow keys).
//
//go:embed replay.js
var replayScript string

// replayCSP keeps the replay to itself wherever it is opened: no request
// of any kind (images are data: URLs), and no script but its own, named by
// its hash, so text from a recorded page can never run even if it got
// past the escaping.
var replayCSP = func() string {
	sum := sha256.Sum256([]byte(replayScript))
	return "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-" +
		base64.StdEncoding.EncodeToString(sum[:]) + "'; base-uri 'none'; form-action 'none'"
}()

var htmlTemplate = template.Must(template.New("recording").Parse(htmlTemplateText))

// exportHTML renders one self-contained page. An action's x, y are
// screenshot pixels of the observation it was chosen from, which is the
// previous step's screenshot, so the marker for step n+1's action is drawn
// over step n's screenshot, labelled with step n+1.
func (r *Recording) exportHTML(ctx context.Context, w io.Writer) error {
	page := htmlPage{CSP: replayCSP, Script: template.JS(replayScript), M: r.m, Reward: "—", Evaluation: evaluationOf(r.m.Evaluation)}
	if r.m.Reward != nil {
		page.Reward = strconv.FormatFloat(*r.m.Reward, 'g', -1, 64)
	}
	if r.m.FinishedAt != nil {
		page.Duration = r.m.FinishedAt.Sub(r.m.CreatedAt).Round(1e6).String()
	}
	for i, st := range r.steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		hs := htmlStep{Step: st, Action: indentJSON(st.Action), Result: indentJSON(st.Result), Shell: shellOf(st), Settle: settleOf(st.Result)}
		if len(st.Action) > 0 {
			hs.ActionType = actionType(st.Action)
		}
		hs.Attributed = r.m.Attribution != nil && r.m.AttributionStep == st.N && st.N > 0
		if st.Screenshot != "" {
			b, err := r.readImage(st)
			if err != nil {
				return fmt.Errorf("export %s as html: %w", r.m.ID, err)
			}
			// Safe unescaped: a fixed content type and base64 hold no quote or '<'.
			hs.ImageSrc = template.HTMLAttr(`src="data:` + contentTypeOf(st.Screenshot) + ";base64," + base64.StdEncoding.EncodeToString(b) + `"`)
			if i+1 < len(r.steps) {
				next := r.steps[i+1]
				// The policy saw the screenshot at the size the observation
				// reports; the stored file's own size is the fallback.
				wpx, hpx := st.Width, st.Height
				if wpx <= 0 || hpx <= 0 {
					if cfg, _, err := image.DecodeConfig(bytes.NewReader(b)); err == nil {
						wpx, hpx = cfg.Width, cfg.Height
					}
				}
				if p, ok := actionPoint(next.Action); ok && wpx > 0 && hpx > 0 {
					hs.Marker = true
					hs.MarkerLeft = strconv.FormatFloat(100*p.X/float64(wpx), 'f', 3, 64)
					hs.MarkerTop = strconv.FormatFloat(100*p.Y/float64(hpx), 'f', 3, 64)
					hs.MarkerLabel = fmt.Sprintf("step %d: %s (%g, %g)", next.N, actionType(next.Action), p.X, p.Y)
				}
				hs.Overlay = overlayOf(st, next, wpx, hpx)
			}
		}
		page.Steps = append(page.Steps, hs)
	}
	if err := htmlTemplate.Execute(w, page); err != nil {
		return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform, "render recording html")
	}
	return nil
}

func indentJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if json.Indent(&buf, raw, "", "  ") != nil {
		return string(raw)
	}
	return buf.String()
}

func actionType(raw json.RawMessage) string {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil && len(list) > 0 {
		raw = list[0]
	}
	var a struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(raw, &a) != nil || a.Type == "" {
		return "action"
	}
	return a.Type
}
