package recordings

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// overlay is what the HTML replay draws over a screenshot to show the
// action chosen from it: coordinates are pixels of that screenshot, which
// the SVG's viewBox maps onto the image however large it is rendered.
type overlay struct {
	W, H    int
	Kind    string      // the action's type
	Box     *[4]float64 // x, y, w, h: the set-of-marks element or selector target
	Path    string      // SVG points of a drag
	Arrow   *[4]float64 // x1, y1, x2, y2: a scroll
	Text    string      // typed text or keys, shown as a caption
	StrokeW float64     // stroke width in viewBox units, ~2 CSS px at 800 px
}

// browserLikeAction holds the fields of browser and desktop actions the
// replay draws; unknown fields are ignored.
type browserLikeAction struct {
	Type    string          `json:"type"`
	X       *float64        `json:"x"`
	Y       *float64        `json:"y"`
	DX      float64         `json:"dx"`
	DY      float64         `json:"dy"`
	Element *int            `json:"element"`
	Text    string          `json:"text"`
	Keys    string          `json:"keys"`
	Path    json.RawMessage `json:"path"`
}

// firstActions are the actions of a step: one, or a list.
func firstActions(raw json.RawMessage) []browserLikeAction {
	if len(raw) == 0 {
		return nil
	}
	var list []json.RawMessage
	if raw[0] != '[' {
		list = []json.RawMessage{raw}
	} else if json.Unmarshal(raw, &list) != nil {
		return nil
	}
	out := make([]browserLikeAction, 0, len(list))
	for _, r := range list {
		var a browserLikeAction
		if json.Unmarshal(r, &a) == nil {
			out = append(out, a)
		}
	}
	return out
}

// overlayOf builds the overlay of next's action over prev's screenshot
// (w×h pixels). The box of an element comes from prev's observation (the
// set-of-marks list the policy chose from) or from next's result when the
// browser reports the target's bounding box.
func overlayOf(prev, next Step, w, h int) *overlay {
	acts := firstActions(next.Action)
	if len(acts) == 0 || w <= 0 || h <= 0 {
		return nil
	}
	o := &overlay{W: w, H: h, Kind: acts[0].Type, StrokeW: float64(w) / 400}
	var texts []string
	for i, a := range acts {
		if o.Box == nil {
			if a.Element != nil {
				o.Box = elementBox(prev.Result, *a.Element)
			}
			if o.Box == nil {
				o.Box = resultBox(next.Result, i)
			}
		}
		switch {
		case a.Text != "":
			texts = append(texts, fmt.Sprintf("%s %q", a.Type, a.Text))
		case a.Keys != "":
			texts = append(texts, "key "+a.Keys)
		}
		if a.Type == "scroll" && (a.DX != 0 || a.DY != 0) && o.Arrow == nil {
			x, y := float64(w)/2, float64(h)/2
			if a.X != nil && a.Y != nil {
				x, y = *a.X, *a.Y
			}
			o.Arrow = &[4]float64{x, y, x + a.DX, y + a.DY}
		}
		if pts := dragPoints(a.Path); len(pts) > 1 && o.Path == "" {
			o.Path = strings.Join(pts, " ")
		}
	}
	o.Text = strings.Join(texts, " · ")
	if _, ok := actionPoint(next.Action); !ok && o.Box == nil && o.Path == "" && o.Arrow == nil && o.Text == "" {
		return nil // nothing to draw (a shell action, back, reload, ...)
	}
	return o
}

func dragPoints(raw json.RawMessage) []string {
	var pairs [][2]float64
	if len(raw) == 0 || json.Unmarshal(raw, &pairs) != nil {
		return nil
	}
	out := make([]string, len(pairs))
	for i, p := range pairs {
		out[i] = fmt.Sprintf("%g,%g", p[0], p[1])
	}
	return out
}

// elementBox finds set-of-marks element id in a step's recorded result
// (the browser's response, whose observation lists the elements).
func elementBox(result json.RawMessage, id int) *[4]float64 {
	var r struct {
		Observation struct {
			Elements []struct {
				ID   int        `json:"id"`
				BBox [4]float64 `json:"bbox"`
			} `json:"elements"`
		} `json:"observation"`
		Elements []struct {
			ID   int        `json:"id"`
			BBox [4]float64 `json:"bbox"`
		} `json:"elements"`
	}
	if len(result) == 0 || json.Unmarshal(result, &r) != nil {
		return nil
	}
	for _, e := range append(r.Observation.Elements, r.Elements...) {
		if e.ID == id && e.BBox[2] > 0 && e.BBox[3] > 0 {
			b := e.BBox
			return &b
		}
	}
	return nil
}

// resultBox is the bounding box ("bbox", [x, y, w, h] in screenshot
// pixels) the i-th action result reports for its target, if any.
func resultBox(result json.RawMessage, i int) *[4]float64 {
	var r struct {
		Results []struct {
			BBox *[4]float64 `json:"bbox"`
		} `json:"results"`
	}
	if len(result) == 0 || json.Unmarshal(result, &r) != nil || i >= len(r.Results) {
		return nil
	}
	if b := r.Results[i].BBox; b != nil && b[2] > 0 && b[3] > 0 {
		return b
	}
	return nil
}

// shellStep is a shell action and its result, shown as a terminal
// transcript (the action has no screen to draw on).
type shellStep struct {
	Prompt  string // "$ command", "write_file path", ...
	Body    string // the file's content or patch, trimmed for display
	Stdout  string
	Stderr  string
	Exit    string // the exit code, "" when the result has none
	ExitBad bool
	MS      float64
	Trunc   bool
}

// shellOf reads a shell action (exec, write_file, apply_patch, answer).
func shellOf(st Step) *shellStep {
	var a struct {
		Type    string `json:"type"`
		Command string `json:"command"`
		Path    string `json:"path"`
		Content string `json:"content"`
		Patch   string `json:"patch"`
		Text    string `json:"text"`
	}
	if len(st.Action) == 0 || st.Action[0] != '{' || json.Unmarshal(st.Action, &a) != nil {
		return nil
	}
	s := &shellStep{}
	switch a.Type {
	case "exec":
		s.Prompt = "$ " + a.Command
	case "write_file":
		s.Prompt, s.Body = "write_file "+a.Path, a.Content
	case "apply_patch":
		s.Prompt, s.Body = "apply_patch", a.Patch
	case "answer":
		if st.Screenshot != "" {
			return nil // a GUI episode's answer: the screenshot shows the page
		}
		s.Prompt = "answer: " + a.Text
	default:
		return nil
	}
	var r struct {
		Stdout     string  `json:"stdout"`
		Stderr     string  `json:"stderr"`
		ExitCode   *int    `json:"exit_code"`
		DurationMS float64 `json:"duration_ms"`
		OutTrunc   bool    `json:"stdout_truncated"`
		ErrTrunc   bool    `json:"stderr_truncated"`
	}
	if len(st.Result) > 0 && json.Unmarshal(st.Result, &r) == nil {
		s.Stdout, s.Stderr, s.MS, s.Trunc = r.Stdout, r.Stderr, r.DurationMS, r.OutTrunc || r.ErrTrunc
		if r.ExitCode != nil {
			s.Exit, s.ExitBad = strconv.Itoa(*r.ExitCode), *r.ExitCode != 0
		}
	}
	const maxBody = 4000 // a patch or file is context, not the point of the transcript
	if len(s.Body) > maxBody {
		s.Body = s.Body[:maxBody] + "\n…"
	}
	return s
}

// settleOf is the reason the browser stopped waiting for the page after
// the step's actions ("settle" or "settle_reason" of a result), if given.
func settleOf(result json.RawMessage) string {
	var r struct {
		Settle  any `json:"settle"`
		Reason  any `json:"settle_reason"`
		Results []struct {
			Settle any `json:"settle"`
			Reason any `json:"settle_reason"`
		} `json:"results"`
	}
	if len(result) == 0 || json.Unmarshal(result, &r) != nil {
		return ""
	}
	var out []string
	add := func(v any) {
		switch v := v.(type) {
		case string:
			out = append(out, v)
		case map[string]any:
			if s, ok := v["reason"].(string); ok {
				out = append(out, s)
			}
		}
	}
	add(r.Settle)
	add(r.Reason)
	for _, x := range r.Results {
		add(x.Settle)
		add(x.Reason)
	}
	return strings.Join(out, ", ")
}
