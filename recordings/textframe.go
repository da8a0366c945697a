package recordings

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"strings"
	"unicode/utf8"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// A shell recording's steps have no screenshots. The GIF and MP4 exports
// show each as a text frame instead, a terminal's view of the step: the
// action (the command after "$"), the output's last lines (stderr in
// red) and the exit code and duration (FORMAT.md "Shell recordings").

// KindShell is the manifest kind of a shell episode's recording.
const KindShell = "shell"

// Text frame geometry: basicfont's 7×13 cells, 100 columns by 30 rows
// with a margin, about the size of a small terminal window.
const (
	textCols    = 100
	textRows    = 30
	textMargin  = 8
	textFrameW  = textCols*7 + 2*textMargin
	textFrameH  = textRows*13 + 2*textMargin
	textAscent  = 11
	textLineGap = 13
)

var (
	textBackground = color.RGBA{0x1e, 0x1e, 0x1e, 0xff}
	textPlain      = color.RGBA{0xdc, 0xdc, 0xdc, 0xff}
	textHeader     = color.RGBA{0x7c, 0xd9, 0x7c, 0xff}
	textError      = color.RGBA{0xf2, 0x70, 0x70, 0xff}
	textDim        = color.RGBA{0x9a, 0x9a, 0x9a, 0xff}
)

// textFrames reports whether r's screenshot-less steps are drawn as text
// frames.
func (r *Recording) textFrames() bool { return r.m.Kind == KindShell }

// shellResult is a shell step's result (api.ShellObservation).
type shellResult struct {
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	ExitCode        int     `json:"exit_code"`
	DurationMS      float64 `json:"duration_ms"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
}

// shellAction is the part of a shell action a frame shows.
type shellAction struct {
	Type    string `json:"type"`
	Command string `json:"command"`
	Path    string `json:"path"`
	Content string `json:"content"`
	Patch   string `json:"patch"`
	Text    string `json:"text"`
	Cwd     string `json:"cwd"`
}

type textLine struct {
	text string
	c    color.Color
}

// shellLines are the lines of st's frame, at most textRows of at most
// textCols characters: the action's first, then the output's last.
func shellLines(st Step) []textLine {
	var head []textLine
	add := func(c color.Color, s string) {
		for _, l := range wrap(s, textCols) {
			head = append(head, textLine{l, c})
		}
	}
	add(textDim, fmt.Sprintf("step %d", st.N))
	var actions []shellAction
	if len(st.Action) > 0 && st.Action[0] == '[' {
		_ = json.Unmarshal(st.Action, &actions)
	} else if len(st.Action) > 0 {
		var a shellAction
		_ = json.Unmarshal(st.Action, &a)
		actions = []shellAction{a}
	}
	if len(actions) == 0 {
		add(textDim, "(start)")
	}
	for _, a := range actions {
		switch a.Type {
		case "exec":
			prefix := "$ "
			if a.Cwd != "" {
				prefix = a.Cwd + " $ "
			}
			add(textHeader, prefix+a.Command)
		case "write_file":
			add(textHeader, fmt.Sprintf("write_file %s (%d bytes)", a.Path, len(a.Content)))
		case "apply_patch":
			add(textHeader, fmt.Sprintf("apply_patch (%d lines)", strings.Count(a.Patch, "\n")))
		case "answer":
			add(textHeader, "answer: "+a.Text)
		default:
			add(textHeader, a.Type)
		}
	}
	var res shellResult
	_ = json.Unmarshal(st.Result, &res)
	var out []textLine
	for _, s := range []struct {
		text string
		c    color.Color
	}{{res.Stdout, textPlain}, {res.Stderr, textError}} {
		for _, l := range wrap(strings.TrimRight(s.text, "\n"), textCols) {
			out = append(out, textLine{l, s.c})
		}
	}
	foot := fmt.Sprintf("exit %d · %.0f ms", res.ExitCode, res.DurationMS)
	if res.StdoutTruncated || res.StderrTruncated {
		foot += " · output truncated"
	}
	if st.Error != nil {
		foot += " · " + st.Error.Code
	}
	room := textRows - 1 - len(head)
	if room < 1 {
		head, room = head[:textRows-2], 1
	}
	if len(out) > room {
		out = append([]textLine{{"…", textDim}}, out[len(out)-room+1:]...)
	}
	return append(append(head, out...), textLine{foot, textDim})
}

// wrap cuts s into lines of at most n characters, tabs as spaces.
func wrap(s string, n int) []string {
	var lines []string
	for _, l := range strings.Split(strings.ReplaceAll(s, "\t", "    "), "\n") {
		for utf8.RuneCountInString(l) > n {
			r := []rune(l)
			lines = append(lines, string(r[:n]))
			l = string(r[n:])
		}
		lines = append(lines, l)
	}
	return lines
}

// shellFrame draws st as a text frame.
func shellFrame(st Step) image.Image {
	img := image.NewRGBA(image.Rect(0, 0, textFrameW, textFrameH))
	draw.Draw(img, img.Bounds(), image.NewUniform(textBackground), image.Point{}, draw.Src)
	d := font.Drawer{Dst: img, Face: basicfont.Face7x13}
	for i, l := range shellLines(st) {
		d.Src = image.NewUniform(l.c)
		d.Dot = fixed.P(textMargin, textMargin+textAscent+i*textLineGap)
		d.DrawString(l.text)
	}
	return img
}
