package recordings

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

func testImage(t *testing.T, w, h int, c color.Color, format string) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, c)
		}
	}
	var buf bytes.Buffer
	var err error
	if format == "png" {
		err = png.Encode(&buf, img)
	} else {
		err = jpeg.Encode(&buf, img, &jpeg.Options{Quality: 80})
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// record writes a finished 3-step recording (reset + 2 actions) and
// returns the store and the screenshots.
func record(t *testing.T, id string) (*Store, [][]byte) {
	t.Helper()
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(Manifest{ID: id, EpisodeID: "ep1", TaskID: "task-7", Question: "Find the price", StartURL: "https://example.com", Kind: "browser"})
	if err != nil {
		t.Fatal(err)
	}
	shots := [][]byte{
		testImage(t, 800, 600, color.RGBA{255, 0, 0, 255}, "jpg"),
		testImage(t, 800, 600, color.RGBA{0, 255, 0, 255}, "png"),
		testImage(t, 800, 600, color.RGBA{0, 0, 255, 255}, "jpg"),
	}
	exts := []string{"jpg", "png", ".jpg"}
	steps := []Step{
		{N: 0, URL: "https://example.com", Title: "Example", Width: 800, Height: 600, Scale: 1},
		{N: 1, Action: json.RawMessage(`{"type":"click","x":400,"y":300}`), Result: json.RawMessage(`{"ok":true}`), URL: "https://example.com/a", Title: "A", Width: 800, Height: 600, Scale: 1},
		{N: 2, Action: json.RawMessage(`{"type":"type","text":"hi"}`), URL: "https://example.com/b", Title: "B",
			Error: &faults.Info{Category: faults.Unavailable, Source: faults.Site, Code: "site.http_503", Message: "site returned 503"}},
	}
	for i, st := range steps {
		if err := w.Append(st, shots[i], exts[i]); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	reward := 0.0
	if err := w.Finish(func(m *Manifest) {
		m.Outcome = OutcomeEnvError
		m.Reward = &reward
		m.Attribution = steps[2].Error
		m.AttributionStep = 2
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.Append(Step{N: 3}, nil, ""); faults.Of(err).Category != faults.Conflict {
		t.Fatalf("append after finish: %v", err)
	}
	return s, shots
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	s, shots := record(t, "rec1")
	r, err := s.Open("rec1")
	if err != nil {
		t.Fatal(err)
	}
	m := r.Manifest()
	if m.Version != Version || m.Steps != 3 || m.Outcome != OutcomeEnvError || m.FinishedAt == nil || m.Reward == nil || m.Attribution.Code != "site.http_503" {
		t.Fatalf("manifest: %+v", m)
	}
	if len(r.Steps()) != 3 || r.Steps()[1].Screenshot != "images/000001.png" || r.Steps()[2].Screenshot != "images/000002.jpg" {
		t.Fatalf("steps: %+v", r.Steps())
	}
	for i, want := range shots {
		b, ct, err := r.Image(i)
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("image %d: %v", i, err)
		}
		if wantCT := map[int]string{0: "image/jpeg", 1: "image/png", 2: "image/jpeg"}[i]; ct != wantCT {
			t.Errorf("image %d type %q, want %q", i, ct, wantCT)
		}
	}
	if _, _, err := r.Image(9); faults.Of(err).Category != faults.NotFound {
		t.Errorf("image 9: %v", err)
	}
	// The on-disk manifest agrees with the reconciled one.
	b, err := os.ReadFile(filepath.Join(s.Root(), "rec1", "manifest.json"))
	if err != nil || !strings.Contains(string(b), `"steps": 3`) {
		t.Errorf("manifest.json: %s %v", b, err)
	}
}

func TestExport(t *testing.T) {
	t.Parallel()
	s, shots := record(t, "rec2")
	r, err := s.Open("rec2")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		format, contentType string
		check               func(t *testing.T, b []byte)
	}{
		{FormatJSONL, "application/x-ndjson", func(t *testing.T, b []byte) {
			sc := bufio.NewScanner(bytes.NewReader(b))
			sc.Buffer(nil, 1<<24)
			var lines []JSONLLine
			for sc.Scan() {
				var l JSONLLine
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
					t.Fatal(err)
				}
				lines = append(lines, l)
			}
			if len(lines) != 4 || lines[0].Type != "manifest" || lines[0].Manifest.ID != "rec2" {
				t.Fatalf("got %d lines, first %+v", len(lines), lines[0])
			}
			for i, l := range lines[1:] {
				img, err := base64.StdEncoding.DecodeString(l.Image)
				if l.Type != "step" || l.Step.N != i || err != nil || !bytes.Equal(img, shots[i]) {
					t.Errorf("line %d: type %q step %+v err %v", i+1, l.Type, l.Step, err)
				}
			}
		}},
		{FormatHTML, "text/html; charset=utf-8", func(t *testing.T, b []byte) {
			h := string(b)
			first := "data:image/jpeg;base64," + base64.StdEncoding.EncodeToString(shots[0])
			for _, want := range []string{first, "site.http_503", "Find the price", "env_error",
				// step 1 clicks (400,300) on step 0's 800x600 screenshot.
				"left:50.000%;top:50.000%", `class="step err attr"`} {
				if !strings.Contains(h, want) {
					t.Errorf("html lacks %.80q", want)
				}
			}
			if strings.Contains(h, "ZgotmplZ") {
				t.Error("html template rejected a value")
			}
		}},
		{FormatGIF, "image/gif", func(t *testing.T, b []byte) {
			g, err := gif.DecodeAll(bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			if len(g.Image) != 3 || g.Config.Width != maxGIFWidth || g.Config.Height != 480 {
				t.Fatalf("gif: %d frames, %dx%d", len(g.Image), g.Config.Width, g.Config.Height)
			}
			for i, d := range g.Delay {
				if d != 100 {
					t.Errorf("frame %d delay %d", i, d)
				}
			}
		}},
		{FormatParquet, "application/vnd.apache.parquet", func(t *testing.T, b []byte) {
			checkParquet(t, b, shots)
		}},
		{FormatMP4, "video/mp4", func(t *testing.T, b []byte) {
			if len(b) < 12 || string(b[4:8]) != "ftyp" {
				t.Fatalf("not an mp4: % x", b[:min(len(b), 12)])
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			t.Parallel()
			if tt.format == FormatMP4 {
				if _, err := exec.LookPath("ffmpeg"); err != nil {
					var buf bytes.Buffer
					_, err := r.Export(context.Background(), tt.format, &buf)
					if f := faults.Of(err); f.Code != faults.CodeKindUnsupported || f.Category != faults.NotImplemented || buf.Len() != 0 {
						t.Fatalf("mp4 without ffmpeg: %v", err)
					}
					testenv.Require(t, "ffmpeg", false, "mp4 export needs ffmpeg (apt-get install ffmpeg)")
				}
			}
			var buf bytes.Buffer
			ct, err := r.Export(context.Background(), tt.format, &buf)
			if err != nil {
				t.Fatal(err)
			}
			if ct != tt.contentType {
				t.Errorf("content type %q, want %q", ct, tt.contentType)
			}
			tt.check(t, buf.Bytes())
		})
	}
}

func checkParquet(t *testing.T, b []byte, shots [][]byte) {
	t.Helper()
	f, err := parquet.OpenFile(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if f.NumRows() != 1 {
		t.Fatalf("rows %d", f.NumRows())
	}
	// Column names and physical/logical types, as pyarrow sees them.
	want := map[string]string{
		"messages": "STRING",
		"images":   "LIST<BYTE_ARRAY>",
		"reward":   "DOUBLE",
		"status":   "STRING",
		"metadata": "STRING",
	}
	fields := f.Schema().Fields()
	if len(fields) != len(want) {
		t.Fatalf("columns %v", fields)
	}
	for _, fld := range fields {
		got := fld.Type().String()
		if lt := fld.Type().LogicalType(); lt != nil && strings.HasPrefix(lt.String(), "LIST") {
			got = "LIST<" + fld.Fields()[0].Fields()[0].Type().String() + ">"
		}
		if want[fld.Name()] != got {
			t.Errorf("column %s: %s, want %q", fld.Name(), got, want[fld.Name()])
		}
	}
	rows, err := parquet.Read[ParquetRow](bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	row := rows[0]
	if row.Status != OutcomeEnvError || row.Reward == nil || *row.Reward != 0 || len(row.Images) != 3 || !bytes.Equal(row.Images[2], shots[2]) {
		t.Fatalf("row: status %q reward %v images %d", row.Status, row.Reward, len(row.Images))
	}
	var msgs []ChatMessage
	if err := json.Unmarshal([]byte(row.Messages), &msgs); err != nil {
		t.Fatal(err)
	}
	// question, obs0, action1, obs1, action2, obs2
	if len(msgs) != 6 || msgs[0].Content != "Find the price" || msgs[2].Role != "assistant" || !strings.HasPrefix(msgs[1].Content, "<image>\nURL: https://example.com") {
		t.Fatalf("messages: %+v", msgs)
	}
	if n := strings.Count(row.Messages, "<image>"); n != len(row.Images) {
		t.Errorf("%d <image> placeholders for %d images", n, len(row.Images))
	}
	var meta ParquetMetadata
	if err := json.Unmarshal([]byte(row.Metadata), &meta); err != nil || meta.TaskID != "task-7" || meta.EpisodeID != "ep1" || meta.Steps != 3 || meta.Attribution == nil {
		t.Fatalf("metadata %s: %v", row.Metadata, err)
	}
	checkPyarrow(t, b)
}

// checkPyarrow loads the file with pyarrow when it is installed.
func checkPyarrow(t *testing.T, b []byte) {
	py, err := exec.LookPath("python3")
	if err != nil || exec.Command(py, "-c", "import pyarrow.parquet").Run() != nil {
		t.Log("pyarrow not installed; skipping the pyarrow load")
		return
	}
	name := filepath.Join(t.TempDir(), "r.parquet")
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "-c", `
import sys, json, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
assert t.column_names == ["messages", "images", "reward", "status", "metadata"], t.column_names
r = t.to_pylist()[0]
assert len(r["images"]) == 3 and r["status"] == "env_error" and json.loads(r["metadata"])["steps"] == 3
print(t.schema)
`, name).CombinedOutput()
	if err != nil {
		t.Fatalf("pyarrow: %v\n%s", err, out)
	}
}

func TestExportUnknownFormat(t *testing.T) {
	t.Parallel()
	s, _ := record(t, "rec3")
	r, err := s.Open("rec3")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_, err = r.Export(context.Background(), "avi", &buf)
	if f := faults.Of(err); f.Code != faults.CodeValidation || f.Category != faults.InvalidRequest || f.Source != faults.Client {
		t.Fatalf("got %v", err)
	}
}

func TestCrashLeavesCompleteSteps(t *testing.T) {
	t.Parallel()
	for _, garbage := range []string{`{"n":3,"time":"2026-`, "\x00\x00\x00", `{"n":3}garbage` + "\n"} {
		t.Run(fmt.Sprintf("%q", garbage), func(t *testing.T) {
			t.Parallel()
			s, err := NewStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			w, err := s.Create(Manifest{ID: "crash"})
			if err != nil {
				t.Fatal(err)
			}
			for n := 0; n < 3; n++ {
				if err := w.Append(Step{N: n}, testImage(t, 8, 8, color.White, "png"), "png"); err != nil {
					t.Fatal(err)
				}
			}
			// The process dies here: no Finish, a torn line at the end.
			f, err := os.OpenFile(filepath.Join(s.Root(), "crash", "steps.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteString(garbage); err != nil {
				t.Fatal(err)
			}
			f.Close()
			r, err := s.Open("crash")
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Steps()) != 3 || r.Manifest().Steps != 3 || r.Manifest().Outcome != "" {
				t.Fatalf("steps %d manifest %+v", len(r.Steps()), r.Manifest())
			}
			if _, _, err := r.Image(2); err != nil {
				t.Fatal(err)
			}
			w.Close()
		})
	}
}

func TestCorruptMiddleLine(t *testing.T) {
	t.Parallel()
	s, _ := record(t, "mid")
	name := filepath.Join(s.Root(), "mid", "steps.jsonl")
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	lines[0] = "not json\n"
	if err := os.WriteFile(name, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open("mid"); err == nil {
		t.Fatal("a bad line before the last one was accepted")
	}
}

func TestInvalidIDs(t *testing.T) {
	t.Parallel()
	s, _ := record(t, "ok_id-1")
	for _, id := range []string{"../ok_id-1", "..", "a/b", "", "a.b", strings.Repeat("a", 65), "/etc", `a\b`} {
		if _, err := s.Open(id); faults.Of(err).Category != faults.InvalidRequest {
			t.Errorf("Open(%q): %v", id, err)
		}
		if id == "" {
			continue // Create picks a random id
		}
		if _, err := s.Create(Manifest{ID: id}); faults.Of(err).Category != faults.InvalidRequest {
			t.Errorf("Create(%q): %v", id, err)
		}
	}
	if _, err := s.Open("missing"); faults.Of(err).Code != CodeRecordingNotFound {
		t.Errorf("Open(missing): %v", err)
	}
	if _, err := s.Create(Manifest{ID: "ok_id-1"}); faults.Of(err).Category != faults.Conflict {
		t.Errorf("Create(existing): %v", err)
	}
	w, err := s.Create(Manifest{})
	if err != nil || !ValidID(w.ID()) {
		t.Fatalf("Create with empty id: %v", err)
	}
	if err := w.Append(Step{N: 1}, []byte("x"), "exe"); faults.Of(err).Category != faults.InvalidRequest {
		t.Errorf("append .exe: %v", err)
	}
	if err := w.Append(Step{N: 1, Screenshot: "../../etc/passwd"}, nil, ""); faults.Of(err).Category != faults.InvalidRequest {
		t.Errorf("append escaping screenshot: %v", err)
	}
	w.Close()
}

func TestListNewestFirst(t *testing.T) {
	t.Parallel()
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	for i, id := range []string{"b", "c", "a"} {
		w, err := s.Create(Manifest{ID: id, CreatedAt: base.Add(time.Duration(i) * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	// A directory without a manifest (a create cut short) is skipped.
	if err := os.Mkdir(filepath.Join(s.Root(), "partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	ms, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.ID)
	}
	if strings.Join(got, ",") != "a,c,b" {
		t.Fatalf("List order %v, want a,c,b", got)
	}
}

func TestEmptyRecordingExports(t *testing.T) {
	t.Parallel()
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Create(Manifest{ID: "empty", Question: "q"})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	r, err := s.Open("empty")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{FormatJSONL, FormatHTML, FormatParquet} {
		var buf bytes.Buffer
		if _, err := r.Export(context.Background(), f, &buf); err != nil || buf.Len() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	var buf bytes.Buffer
	if _, err := r.Export(context.Background(), FormatGIF, &buf); faults.Of(err).Category != faults.InvalidRequest {
		t.Errorf("gif of no screenshots: %v", err)
	}
}

// Not parallel: it empties PATH for the process.
func TestMP4WithoutFFmpeg(t *testing.T) {
	s, _ := record(t, "noff")
	r, err := s.Open("noff")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir())
	var buf bytes.Buffer
	_, err = r.Export(context.Background(), FormatMP4, &buf)
	if f := faults.Of(err); f.Code != faults.CodeKindUnsupported || f.Category != faults.NotImplemented || f.Source != faults.Platform || buf.Len() != 0 {
		t.Fatalf("got %v", err)
	}
}

// A recording resumed after a crash (or by another server process) keeps
// every complete step and continues after them.
func TestResume(t *testing.T) {
	t.Parallel()
	for _, garbage := range []string{"", `{"n":2,"time":"2026-`, `{"n":2}garbage` + "\n"} {
		t.Run(fmt.Sprintf("%q", garbage), func(t *testing.T) {
			t.Parallel()
			s, err := NewStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			w, err := s.Create(Manifest{ID: "resumed", TaskID: "t1"})
			if err != nil {
				t.Fatal(err)
			}
			for n := 0; n < 2; n++ {
				if err := w.Append(Step{N: n}, testImage(t, 8, 8, color.White, "png"), "png"); err != nil {
					t.Fatal(err)
				}
			}
			w.Close()
			f, err := os.OpenFile(filepath.Join(s.Root(), "resumed", "steps.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteString(garbage); err != nil {
				t.Fatal(err)
			}
			f.Close()

			w2, err := s.Resume("resumed")
			if err != nil {
				t.Fatal(err)
			}
			if got := w2.Manifest().Steps; got != 2 {
				t.Fatalf("resumed at step count %d, want 2", got)
			}
			for n := 2; n < 4; n++ {
				if err := w2.Append(Step{N: n, URL: fmt.Sprintf("https://example.com/%d", n)}, testImage(t, 8, 8, color.Black, "jpg"), "jpg"); err != nil {
					t.Fatal(err)
				}
			}
			if err := w2.Finish(func(m *Manifest) { m.Outcome = OutcomeSuccess }); err != nil {
				t.Fatal(err)
			}
			r, err := s.Open("resumed")
			if err != nil {
				t.Fatal(err)
			}
			if m := r.Manifest(); m.Steps != 4 || m.Outcome != OutcomeSuccess || m.TaskID != "t1" {
				t.Fatalf("manifest %+v", m)
			}
			for i, st := range r.Steps() {
				if st.N != i {
					t.Fatalf("step %d has n %d", i, st.N)
				}
				if _, _, err := r.Image(i); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Resume("resumed"); faults.Of(err).Category != faults.Conflict {
				t.Fatalf("resume of a finished recording: %v", err)
			}
		})
	}
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resume("missing"); !faults.Is(err, CodeRecordingNotFound) {
		t.Fatalf("resume of a missing recording: %v", err)
	}
}
