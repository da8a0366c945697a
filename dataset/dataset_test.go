package dataset

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/recordings"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// shot is a small PNG, different for each n.
func shot(t *testing.T, n int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, 8, 6))
	img.Set(n%8, 0, color.RGBA{R: uint8(n), G: 200, A: 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

type rec struct {
	id, task, suite, kind, outcome string
	at                             time.Duration // after t0
	steps                          int
	unfinished                     bool
}

// makeRecording writes a recording as an episode would: a reset step,
// then steps with actions; GUI steps carry screenshots, shell steps the
// exec result.
func makeRecording(t *testing.T, s *recordings.Store, r rec) [][]byte {
	t.Helper()
	w, err := s.Create(recordings.Manifest{ID: r.id, EpisodeID: r.id, TaskID: r.task, Suite: r.suite, Kind: r.kind,
		Question: "question of " + r.task, StartURL: "http://example.test/", CreatedAt: t0.Add(r.at)})
	if err != nil {
		t.Fatal(err)
	}
	var shots [][]byte
	for n := 0; n <= r.steps; n++ {
		st := recordings.Step{N: n, Time: t0.Add(r.at + time.Duration(n)*time.Second)}
		if r.kind == "shell" {
			if n > 0 {
				st.Action = json.RawMessage(fmt.Sprintf(`{"type":"exec","command":"echo %d","timeout":60}`, n))
				st.Result = json.RawMessage(fmt.Sprintf(`{"stdout":"%d\n","stderr":"warn","exit_code":%d,"duration_ms":3,"stdout_truncated":false,"stderr_truncated":true}`, n, n%2))
			}
			if err := w.Append(st, nil, ""); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if n > 0 {
			st.Action = json.RawMessage(fmt.Sprintf(`{"type":"click","element":%d}`, n))
		}
		st.URL, st.Title = "http://example.test/", "Page"
		b := shot(t, len(shots)+10*n)
		shots = append(shots, b)
		if err := w.Append(st, b, "png"); err != nil {
			t.Fatal(err)
		}
	}
	if r.kind == "shell" {
		if err := w.Append(recordings.Step{N: r.steps + 1, Action: json.RawMessage(`{"type":"write_file","path":"a.py","content":"x = 1\n"}`),
			Result: json.RawMessage(`{"ok":true}`)}, nil, ""); err != nil {
			t.Fatal(err)
		}
		if err := w.Append(recordings.Step{N: r.steps + 2, Action: json.RawMessage(`{"type":"answer","text":"done"}`)}, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	if r.unfinished {
		_ = w.Close()
		return shots
	}
	reward := 0.0
	if r.outcome == recordings.OutcomeSuccess {
		reward = 1
	}
	if err := w.Finish(func(m *recordings.Manifest) {
		m.Outcome, m.Reward = r.outcome, &reward
		if r.kind != "shell" {
			m.Answer = "answer of " + r.id
		}
	}); err != nil {
		t.Fatal(err)
	}
	return shots
}

func readTable(t *testing.T, name string) arrow.Table {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	pf, err := file.NewParquetReader(bytes.NewReader(b))
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
	t.Cleanup(tbl.Release)
	return tbl
}

// column returns the single chunk of column name of tbl.
func column(t *testing.T, tbl arrow.Table, name string) arrow.Array {
	t.Helper()
	idx := tbl.Schema().FieldIndices(name)
	if len(idx) != 1 {
		t.Fatalf("no column %s in %v", name, tbl.Schema())
	}
	ch := tbl.Column(idx[0]).Data()
	if len(ch.Chunks()) != 1 {
		t.Fatalf("column %s: %d chunks", name, len(ch.Chunks()))
	}
	return ch.Chunk(0)
}

var shardName = regexp.MustCompile(`^data/(train|validation|test)-(\d{5})-of-(\d{5})\.parquet$`)

// A mixed run built into a gui dataset: browser and desktop episodes go
// in, env_error, unfinished and shell episodes are left out and counted;
// the shards, read back by Arrow's reader, hold the recorded screenshots
// as Image structs; the card's YAML names every split with its exact row
// count and the features of the files; no task is in two splits.
func TestBuildGUIReadBack(t *testing.T) {
	t.Parallel()
	s, err := recordings.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	shots := map[string][][]byte{}
	outcomes := []string{recordings.OutcomeSuccess, recordings.OutcomeFailure}
	n := 0
	for task := 0; task < 12; task++ {
		for run := 0; run < 2; run++ {
			id := fmt.Sprintf("r%02d-%d", task, run)
			kind := "browser"
			if task%3 == 0 {
				kind = "desktop"
			}
			shots[id] = makeRecording(t, s, rec{id: id, task: fmt.Sprintf("task-%02d", task), suite: "web", kind: kind,
				outcome: outcomes[(task+run)%2], at: time.Duration(n) * time.Minute, steps: 1 + task%3})
			n++
		}
	}
	makeRecording(t, s, rec{id: "env", task: "task-00", suite: "web", kind: "browser", outcome: recordings.OutcomeEnvError, at: time.Hour, steps: 1})
	makeRecording(t, s, rec{id: "open", task: "task-01", suite: "web", kind: "browser", at: time.Hour, steps: 1, unfinished: true})
	makeRecording(t, s, rec{id: "sh", task: "swe-1", suite: "web", kind: "shell", outcome: recordings.OutcomeSuccess, at: time.Hour, steps: 1})
	makeRecording(t, s, rec{id: "other", task: "task-02", suite: "other", kind: "browser", outcome: recordings.OutcomeSuccess, at: time.Hour, steps: 1})

	dir := filepath.Join(t.TempDir(), "ds")
	// A shard bound below two recordings' size: every split is cut into
	// several shards.
	man, err := Build(context.Background(), s, dir, Options{Selection: Selection{Suite: "web"}, Splits: Splits{TestPercent: 30}, ShardBytes: 300})
	if err != nil {
		t.Fatal(err)
	}
	if man.Included != 24 || man.Considered != 27 || man.Excluded[ReasonEnvError] != 1 || man.Excluded[ReasonUnfinished] != 1 || man.Excluded[ReasonKind] != 1 {
		t.Fatalf("manifest counts: included %d considered %d excluded %v", man.Included, man.Considered, man.Excluded)
	}
	var disk Manifest
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil || json.Unmarshal(b, &disk) != nil || len(disk.Recordings) != 24 || len(disk.Left) != 3 {
		t.Fatalf("manifest.json: %v %s", err, b)
	}

	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	card, err := ParseCard(readme)
	if err != nil {
		t.Fatal(err)
	}
	if len(card.Configs) != 1 || card.Configs[0].ConfigName != "default" {
		t.Fatalf("configs %+v", card.Configs)
	}
	wantFeatures := []string{"messages", "images", "reward", "status", "metadata"}
	for i, f := range card.DatasetInfo.Features {
		if i >= len(wantFeatures) || f.Name != wantFeatures[i] {
			t.Fatalf("features %+v", card.DatasetInfo.Features)
		}
	}
	if card.DatasetInfo.Features[1].List != "image" {
		t.Errorf("images feature %+v, want list: image", card.DatasetInfo.Features[1])
	}

	taskSplit := map[string]string{}
	rowsPerSplit := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(dir, "data", "*"))
	if len(files) == 0 {
		t.Fatal("no shards")
	}
	perSplit := map[string][]string{}
	for _, f := range files {
		rel, _ := filepath.Rel(dir, f)
		m := shardName.FindStringSubmatch(filepath.ToSlash(rel))
		if m == nil {
			t.Fatalf("shard %s is not named <split>-NNNNN-of-MMMMM.parquet", rel)
		}
		perSplit[m[1]] = append(perSplit[m[1]], m[3])
		tbl := readTable(t, f)
		imgType := arrow.ListOfField(arrow.Field{Name: "element", Nullable: false, Type: arrow.StructOf(
			arrow.Field{Name: "bytes", Type: arrow.BinaryTypes.Binary},
			arrow.Field{Name: "path", Type: arrow.BinaryTypes.String})})
		if f := tbl.Schema().Field(1); f.Name != "images" || !arrow.TypeEqual(f.Type, imgType) {
			t.Fatalf("images column %v, want %v", f.Type, imgType)
		}
		metas := column(t, tbl, "metadata").(*array.String)
		images := column(t, tbl, "images").(*array.List)
		for i := 0; i < int(tbl.NumRows()); i++ {
			var meta recordings.ParquetMetadata
			if err := json.Unmarshal([]byte(metas.Value(i)), &meta); err != nil {
				t.Fatal(err)
			}
			if prev, ok := taskSplit[meta.TaskID]; ok && prev != m[1] {
				t.Errorf("task %s in splits %s and %s", meta.TaskID, prev, m[1])
			}
			taskSplit[meta.TaskID] = m[1]
			rowsPerSplit[m[1]]++
			start, end := images.ValueOffsets(i)
			want := shots[meta.RecordingID]
			if int(end-start) != len(want) {
				t.Fatalf("%s: %d images, want %d", meta.RecordingID, end-start, len(want))
			}
			st := images.ListValues().(*array.Struct)
			bs, paths := st.Field(0).(*array.Binary), st.Field(1).(*array.String)
			for k := range want {
				if !bytes.Equal(bs.Value(int(start)+k), want[k]) {
					t.Errorf("%s image %d differs from the recorded screenshot", meta.RecordingID, k)
				}
				if p := paths.Value(int(start) + k); !strings.HasPrefix(p, meta.RecordingID+"/") {
					t.Errorf("image path %q", p)
				}
			}
		}
	}
	for split, totals := range perSplit {
		sort.Strings(totals)
		if totals[0] != totals[len(totals)-1] || fmt.Sprintf("%05d", len(totals)) != totals[0] {
			t.Errorf("split %s: shard totals %v for %d shards", split, totals, len(totals))
		}
		if len(totals) < 2 {
			t.Errorf("split %s: one shard under a 300-byte bound", split)
		}
	}
	if len(rowsPerSplit) < 2 {
		t.Errorf("splits %v: want train and test", rowsPerSplit)
	}
	if len(card.DatasetInfo.Splits) != len(rowsPerSplit) || len(card.Configs[0].DataFiles) != len(rowsPerSplit) {
		t.Fatalf("card splits %+v data files %+v, want %v", card.DatasetInfo.Splits, card.Configs[0].DataFiles, rowsPerSplit)
	}
	for i, cs := range card.DatasetInfo.Splits {
		if rowsPerSplit[cs.Name] != cs.NumExamples {
			t.Errorf("card split %s: %d examples, files hold %d", cs.Name, cs.NumExamples, rowsPerSplit[cs.Name])
		}
		if df := card.Configs[0].DataFiles[i]; df.Split != cs.Name || df.Path != "data/"+cs.Name+"-*" {
			t.Errorf("data files %+v", df)
		}
	}

	// The same recordings build the same splits.
	again, err := Build(context.Background(), s, filepath.Join(t.TempDir(), "again"), Options{Selection: Selection{Suite: "web"}, Splits: Splits{TestPercent: 30}})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range again.Recordings {
		if taskSplit[e.TaskID] != e.Split {
			t.Errorf("task %s: split %s, was %s", e.TaskID, e.Split, taskSplit[e.TaskID])
		}
	}
}

// Shell recordings build the shell layout: chat messages with tool calls
// and the tools' answers, the resolved label from the outcome.
func TestBuildShell(t *testing.T) {
	t.Parallel()
	s, err := recordings.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	makeRecording(t, s, rec{id: "ok", task: "swe-a", kind: "shell", outcome: recordings.OutcomeSuccess, steps: 2})
	makeRecording(t, s, rec{id: "bad", task: "swe-b", kind: "shell", outcome: recordings.OutcomeFailure, at: time.Minute, steps: 1})
	makeRecording(t, s, rec{id: "web", task: "web-a", kind: "browser", outcome: recordings.OutcomeSuccess, at: 2 * time.Minute, steps: 1})
	dir := t.TempDir()
	man, err := Build(context.Background(), s, dir, Options{Layout: LayoutShell})
	if err != nil {
		t.Fatal(err)
	}
	if man.Included != 2 || man.Excluded[ReasonKind] != 1 {
		t.Fatalf("included %d excluded %v", man.Included, man.Excluded)
	}
	tbl := readTable(t, filepath.Join(dir, "data", "train-00000-of-00001.parquet"))
	wantCols := []string{"messages", "resolved", "reward", "status", "task_id", "metadata"}
	for i, c := range wantCols {
		if tbl.Schema().Field(i).Name != c {
			t.Fatalf("schema %v", tbl.Schema())
		}
	}
	readme, _ := os.ReadFile(filepath.Join(dir, "README.md"))
	card, err := ParseCard(readme)
	if err != nil {
		t.Fatal(err)
	}
	if f := card.DatasetInfo.Features[0]; f.Name != "messages" {
		t.Fatalf("features %+v", card.DatasetInfo.Features)
	}
	resolved := column(t, tbl, "resolved").(*array.Boolean)
	tasks := column(t, tbl, "task_id").(*array.String)
	msgs := column(t, tbl, "messages").(*array.List)
	if tbl.NumRows() != 2 || tasks.Value(0) != "swe-a" || !resolved.Value(0) || resolved.Value(1) {
		t.Fatalf("rows: tasks %v resolved %v", tasks, resolved)
	}
	st := msgs.ListValues().(*array.Struct)
	names := map[string]int{}
	for i := 0; i < st.NumField(); i++ {
		names[st.DataType().(*arrow.StructType).Field(i).Name] = i
	}
	role, content := st.Field(names["role"]).(*array.String), st.Field(names["content"]).(*array.String)
	calls := st.Field(names["tool_calls"]).(*array.List)
	start, end := msgs.ValueOffsets(0)
	var got []string
	for i := int(start); i < int(end); i++ {
		cs, ce := calls.ValueOffsets(i)
		got = append(got, fmt.Sprintf("%s/%d", role.Value(i), ce-cs))
	}
	// user; exec, tool; exec, tool; write_file, tool; final answer.
	want := "user/0 assistant/1 tool/0 assistant/1 tool/0 assistant/1 tool/0 assistant/0"
	if strings.Join(got, " ") != want {
		t.Fatalf("messages %v, want %s", got, want)
	}
	tool := content.Value(int(start) + 2)
	for _, w := range []string{"exit_code: 1", "stdout:\n1\n", "stderr:\nwarn", "[stderr truncated]"} {
		if !strings.Contains(tool, w) {
			t.Errorf("tool message %q lacks %q", tool, w)
		}
	}
	if last := content.Value(int(end) - 1); last != "done" {
		t.Errorf("last message %q", last)
	}
	cst := calls.ListValues().(*array.Struct)
	var args string
	for i := 0; i < cst.NumField(); i++ {
		if cst.DataType().(*arrow.StructType).Field(i).Name == "arguments" {
			args = cst.Field(i).(*array.String).Value(0)
		}
	}
	if args != `{"command":"echo 1","timeout":60}` {
		t.Errorf("arguments %s", args)
	}
}

// Selection by task, outcome and time; env_error kept when asked for; an
// empty selection is a classified error; the output folder must be empty.
func TestBuildSelection(t *testing.T) {
	t.Parallel()
	s, err := recordings.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range []string{recordings.OutcomeSuccess, recordings.OutcomeFailure, recordings.OutcomeEnvError, recordings.OutcomeSuccess} {
		makeRecording(t, s, rec{id: fmt.Sprintf("r%d", i), task: fmt.Sprintf("t%d", i%2), kind: "browser", outcome: o, at: time.Duration(i) * time.Hour, steps: 1})
	}
	since, until := t0.Add(time.Hour), t0.Add(3*time.Hour)
	cases := []struct {
		name string
		sel  Selection
		want []string
	}{
		{"all", Selection{}, []string{"r0", "r1", "r3"}},
		{"env_error too", Selection{IncludeEnvError: true}, []string{"r0", "r1", "r2", "r3"}},
		{"task", Selection{TaskIDs: []string{"t1"}}, []string{"r1", "r3"}},
		{"outcome", Selection{Outcomes: []string{"success"}}, []string{"r0", "r3"}},
		{"env_error by outcome", Selection{Outcomes: []string{"env_error"}}, []string{"r2"}},
		{"time", Selection{Since: &since, Until: &until, IncludeEnvError: true}, []string{"r1", "r2"}},
		{"ids", Selection{RecordingIDs: []string{"r3"}}, []string{"r3"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			man, err := Build(context.Background(), s, filepath.Join(t.TempDir(), "out"), Options{Selection: c.sel})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range man.Recordings {
				got = append(got, e.ID)
			}
			if strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
	_, err = Build(context.Background(), s, t.TempDir()+"/x", Options{Selection: Selection{TaskIDs: []string{"nope"}}})
	if f := faults.Of(err); f.Category != faults.InvalidRequest {
		t.Errorf("empty selection: %v", err)
	}
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "x"), nil, 0o644)
	if _, err := Build(context.Background(), s, full, Options{}); faults.Of(err).Category != faults.Conflict {
		t.Errorf("non-empty folder: %v", err)
	}
	if _, err := Build(context.Background(), s, t.TempDir(), Options{Selection: Selection{Outcomes: []string{"won"}}}); faults.Of(err).Category != faults.InvalidRequest {
		t.Errorf("bad outcome: %v", err)
	}
}

// The Online-Mind2Web layout, file by file, as WebJudge's run script
// reads it: a folder per task, result.json with task, action_history and
// final_result_response, and trajectory/ with the screenshots named so
// that sorting by the first number in the name is step order.
func TestExportMind2Web(t *testing.T) {
	t.Parallel()
	s, err := recordings.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	once := makeRecording(t, s, rec{id: "a", task: "web/once", kind: "browser", outcome: recordings.OutcomeSuccess, steps: 11})
	twice1 := makeRecording(t, s, rec{id: "b1", task: "twice", kind: "browser", outcome: recordings.OutcomeFailure, at: time.Minute, steps: 1})
	twice2 := makeRecording(t, s, rec{id: "b2", task: "twice", kind: "desktop", outcome: recordings.OutcomeSuccess, at: 2 * time.Minute, steps: 2})
	makeRecording(t, s, rec{id: "c", task: "broken", kind: "browser", outcome: recordings.OutcomeEnvError, at: 3 * time.Minute, steps: 1})
	makeRecording(t, s, rec{id: "d", task: "swe", kind: "shell", outcome: recordings.OutcomeSuccess, at: 4 * time.Minute, steps: 1})
	dir := filepath.Join(t.TempDir(), "m2w")
	man, err := ExportMind2Web(context.Background(), s, dir, Selection{})
	if err != nil {
		t.Fatal(err)
	}
	if man.Included != 3 || man.Excluded[ReasonEnvError] != 1 || man.Excluded[ReasonKind] != 1 {
		t.Fatalf("included %d excluded %v", man.Included, man.Excluded)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if want := "manifest.json twice_b1 twice_b2 web_once"; strings.Join(got, " ") != want {
		t.Fatalf("folder holds %v, want %s", got, want)
	}
	num := regexp.MustCompile(`\d+`)
	for folder, want := range map[string][][]byte{"web_once": once, "twice_b1": twice1, "twice_b2": twice2} {
		var res Mind2WebResult
		b, err := os.ReadFile(filepath.Join(dir, folder, "result.json"))
		if err != nil || json.Unmarshal(b, &res) != nil {
			t.Fatalf("%s/result.json: %v %s", folder, err, b)
		}
		var raw map[string]any
		_ = json.Unmarshal(b, &raw)
		for _, k := range []string{"task", "action_history", "final_result_response"} {
			if _, ok := raw[k]; !ok {
				t.Errorf("%s/result.json has no %s", folder, k)
			}
		}
		if res.Task != "question of "+res.TaskID || len(res.ActionHistory) != len(want)-1 || !strings.HasPrefix(res.FinalResultResponse, "answer of ") {
			t.Errorf("%s/result.json: %+v", folder, res)
		}
		shots, err := os.ReadDir(filepath.Join(dir, folder, "trajectory"))
		if err != nil {
			t.Fatal(err)
		}
		names := make([]string, 0, len(shots))
		for _, e := range shots {
			names = append(names, e.Name())
		}
		// WebJudge's order: by the first number in the name.
		sort.Slice(names, func(i, j int) bool {
			a, _ := strconv.Atoi(num.FindString(names[i]))
			b, _ := strconv.Atoi(num.FindString(names[j]))
			return a < b
		})
		if len(names) != len(want) {
			t.Fatalf("%s: %d screenshots, want %d", folder, len(names), len(want))
		}
		for i, n := range names {
			b, err := os.ReadFile(filepath.Join(dir, folder, "trajectory", n))
			if err != nil || !bytes.Equal(b, want[i]) {
				t.Errorf("%s/trajectory/%s is not step %d's screenshot", folder, n, i)
			}
		}
	}
}
