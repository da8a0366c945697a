package recordings

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"image"
	_ "image/jpeg" // screenshot sizes for the action markers
	_ "image/png"
	"io"
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
	Attributed  bool // the manifest attributes the episode's failure to this step
}

type htmlPage struct {
	M        Manifest
	Reward   string
	Duration string
	Steps    []htmlStep
}

var htmlTemplate = template.Must(template.New("recording").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Recording {{.M.ID}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
table.m td{padding:2px 10px 2px 0;vertical-align:top}
.step{background:#fff;border:1px solid #ddd;border-radius:6px;margin:1em 0;padding:.8em}
.step.err{border-color:#d33;background:#fff5f5}
.step.attr{border:3px solid #d33}
.shot{position:relative;display:inline-block;max-width:100%}
.shot img{display:block;max-width:100%;height:auto;border:1px solid #ccc}
.mark{position:absolute;width:18px;height:18px;margin:-11px 0 0 -11px;border:3px solid #f0f;border-radius:50%;box-shadow:0 0 0 2px #fff;pointer-events:none}
.mark span{position:absolute;left:22px;top:-4px;white-space:nowrap;background:#f0f;color:#fff;font-size:11px;padding:0 3px;border-radius:3px}
pre{background:#f3f3f3;padding:.5em;overflow:auto;max-height:20em;margin:.3em 0}
.error{color:#b00;font-weight:600}
.outcome-success{color:#080;font-weight:600}.outcome-failure,.outcome-env_error{color:#b00;font-weight:600}
</style></head><body>
<h1>Recording {{.M.ID}}</h1>
<table class="m">
<tr><td>Question</td><td>{{.M.Question}}</td></tr>
{{if .M.StartURL}}<tr><td>Start URL</td><td>{{.M.StartURL}}</td></tr>{{end}}
{{if .M.TaskID}}<tr><td>Task</td><td>{{.M.TaskID}}</td></tr>{{end}}
{{if .M.EpisodeID}}<tr><td>Episode</td><td>{{.M.EpisodeID}}</td></tr>{{end}}
{{if .M.Kind}}<tr><td>Kind</td><td>{{.M.Kind}}</td></tr>{{end}}
<tr><td>Outcome</td><td class="outcome-{{.M.Outcome}}">{{if .M.Outcome}}{{.M.Outcome}}{{else}}running{{end}}</td></tr>
<tr><td>Reward</td><td>{{.Reward}}</td></tr>
{{if .M.Answer}}<tr><td>Answer</td><td>{{.M.Answer}}</td></tr>{{end}}
<tr><td>Steps</td><td>{{.M.Steps}}</td></tr>
<tr><td>Created</td><td>{{.M.CreatedAt.Format "2006-01-02 15:04:05Z07:00"}}{{if .Duration}} ({{.Duration}}){{end}}</td></tr>
{{with .M.Attribution}}<tr><td>Attribution</td><td class="error">{{.Code}} ({{.Category}}, source {{.Source}}) at step {{$.M.AttributionStep}}: {{.Message}}</td></tr>{{end}}
</table>
{{range .Steps}}
<div class="step{{if .Error}} err{{end}}{{if .Attributed}} attr{{end}}" id="step-{{.N}}">
<h3>Step {{.N}}{{if .URL}} — {{.URL}}{{end}}</h3>
{{if .Title}}<div>{{.Title}}</div>{{end}}
{{if .Error}}<div class="error">error {{.Error.Code}} ({{.Error.Category}}, source {{.Error.Source}}): {{.Error.Message}}</div>{{end}}
{{if .Attributed}}<div class="error">attributed: {{$.M.Attribution.Code}}</div>{{end}}
{{with .Injected}}<div class="error">injected fault {{.Kind}}: {{.Code}} ({{.Source}})</div>{{end}}
{{if .Action}}<div>Action{{if .StepMS}} ({{printf "%.0f" .StepMS}} ms){{end}}:</div><pre>{{.Action}}</pre>{{end}}
{{if .Result}}<details><summary>Result</summary><pre>{{.Result}}</pre></details>{{end}}
{{if .ImageSrc}}<div class="shot"><img {{.ImageSrc}} alt="step {{.N}} screenshot">{{if .Marker}}<div class="mark" style="left:{{.MarkerLeft}}%;top:{{.MarkerTop}}%"><span>{{.MarkerLabel}}</span></div>{{end}}</div>{{end}}
</div>
{{end}}
</body></html>
`))

// exportHTML renders one self-contained page. An action's x, y are
// screenshot pixels of the observation it was chosen from, which is the
// previous step's screenshot, so the marker for step n+1's action is drawn
// over step n's screenshot, labelled with step n+1.
func (r *Recording) exportHTML(ctx context.Context, w io.Writer) error {
	page := htmlPage{M: r.m, Reward: "—"}
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
		hs := htmlStep{Step: st, Action: indentJSON(st.Action), Result: indentJSON(st.Result)}
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
				if p, ok := actionPoint(next.Action); ok {
					wpx, hpx := st.Width, st.Height
					if cfg, _, err := image.DecodeConfig(bytes.NewReader(b)); err == nil {
						wpx, hpx = cfg.Width, cfg.Height
					}
					if wpx > 0 && hpx > 0 {
						hs.Marker = true
						hs.MarkerLeft = strconv.FormatFloat(100*p.X/float64(wpx), 'f', 3, 64)
						hs.MarkerTop = strconv.FormatFloat(100*p.Y/float64(hpx), 'f', 3, 64)
						hs.MarkerLabel = fmt.Sprintf("step %d: %s (%g, %g)", next.N, actionType(next.Action), p.X, p.Y)
					}
				}
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
