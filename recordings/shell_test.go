package recordings

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/gif"
	"os/exec"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// recordShell writes a shell episode's recording: step 0 and three
// steps, none with a screenshot.
func recordShell(t *testing.T) *Recording {
	t.Helper()
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(Manifest{ID: "sh", TaskID: "py-add", Question: "Fix add.", Kind: KindShell})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct{ action, result string }{
		{"", `{"stdout":"","stderr":"","exit_code":0,"duration_ms":0,"stdout_truncated":false,"stderr_truncated":false}`},
		{`{"type":"exec","command":"python3 -m unittest","timeout":60}`, `{"stdout":"","stderr":"F.\nFAIL: test_add\n` + strings.Repeat("line\\n", 60) + `","exit_code":1,"duration_ms":85.5,"stdout_truncated":false,"stderr_truncated":true}`},
		{`{"type":"apply_patch","patch":"--- a/m.py\n+++ b/m.py\n"}`, `{"stdout":"","stderr":"","exit_code":0,"duration_ms":3,"stdout_truncated":false,"stderr_truncated":false}`},
		{`{"type":"submit"}`, `{"stdout":"","stderr":"","exit_code":0,"duration_ms":0,"stdout_truncated":false,"stderr_truncated":false}`},
	}
	for i, st := range steps {
		if err := w.Append(Step{N: i, Action: json.RawMessage(st.action), Result: json.RawMessage(st.result)}, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(nil); err != nil {
		t.Fatal(err)
	}
	r, err := s.Open("sh")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A shell recording exports in every format: JSONL lines with the step's
// action and result and no image, a Parquet row whose messages carry the
// results and whose images are empty, and GIF and MP4 with one text frame
// per step.
func TestShellRecordingExports(t *testing.T) {
	t.Parallel()
	r := recordShell(t)
	export := func(format string) []byte {
		t.Helper()
		var b bytes.Buffer
		if _, err := r.Export(context.Background(), format, &b); err != nil {
			t.Fatalf("export %s: %v", format, err)
		}
		return b.Bytes()
	}

	sc := bufio.NewScanner(bytes.NewReader(export(FormatJSONL)))
	sc.Buffer(nil, 1<<20)
	var lines []JSONLLine
	for sc.Scan() {
		var l JSONLLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if len(lines) != 5 || lines[0].Manifest.Kind != KindShell {
		t.Fatalf("jsonl: %d lines", len(lines))
	}
	var res shellResult
	if err := json.Unmarshal(lines[2].Step.Result, &res); err != nil || res.ExitCode != 1 || !res.StderrTruncated || lines[2].Image != "" {
		t.Errorf("jsonl step 1: %+v %v", res, err)
	}

	pq := export(FormatParquet)
	pf, err := file.NewParquetReader(bytes.NewReader(pq))
	if err != nil {
		t.Fatal(err)
	}
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := fr.ReadTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Release()
	msgs := tbl.Column(0).Data().Chunk(0).(*array.String).Value(0)
	if !strings.Contains(msgs, `\"exit_code\":1`) || !strings.Contains(msgs, "python3 -m unittest") || strings.Contains(msgs, "<image>") {
		t.Errorf("parquet messages: %.300s", msgs)
	}
	if imgs := tbl.Column(1).Data().Chunk(0).(*array.List); imgs.ListValues().Len() != 0 {
		t.Errorf("parquet images: %d", imgs.ListValues().Len())
	}

	g, err := gif.DecodeAll(bytes.NewReader(export(FormatGIF)))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Image) != 4 || g.Config.Width != min(textFrameW, maxGIFWidth) {
		t.Errorf("gif: %d frames, %dx%d", len(g.Image), g.Config.Width, g.Config.Height)
	}
	// The frame of the failing run shows text: more than the background.
	colours := map[uint8]bool{}
	f := g.Image[1]
	for y := f.Rect.Min.Y; y < f.Rect.Max.Y; y += 2 {
		for x := f.Rect.Min.X; x < f.Rect.Max.X; x += 2 {
			colours[f.ColorIndexAt(x, y)] = true
		}
	}
	if len(colours) < 3 {
		t.Errorf("gif frame 1 has %d colours: no text drawn", len(colours))
	}

	if _, err := exec.LookPath("ffmpeg"); err == nil {
		if mp4 := export(FormatMP4); len(mp4) < 12 || string(mp4[4:8]) != "ftyp" {
			t.Errorf("mp4: %d bytes", len(mp4))
		}
	}
}

// A text frame keeps the action's lines and the output's last ones,
// within the frame's rows.
func TestShellFrameLines(t *testing.T) {
	t.Parallel()
	st := Step{N: 3, Action: json.RawMessage(`{"type":"exec","command":"make test","cwd":"/w"}`),
		Result: json.RawMessage(`{"stdout":"` + strings.Repeat("x\\n", 100) + `last\n","stderr":"boom\n","exit_code":2,"duration_ms":12}`)}
	lines := shellLines(st)
	if len(lines) != textRows {
		t.Fatalf("%d lines", len(lines))
	}
	if lines[1].text != "/w $ make test" || lines[2].text != "…" || lines[len(lines)-2].text != "boom" || lines[len(lines)-1].text != "exit 2 · 12 ms" {
		t.Errorf("lines: %q %q %q %q", lines[1].text, lines[2].text, lines[len(lines)-2].text, lines[len(lines)-1].text)
	}
	if img := shellFrame(st); img.Bounds() != image.Rect(0, 0, textFrameW, textFrameH) {
		t.Errorf("frame %v", img.Bounds())
	}
}
