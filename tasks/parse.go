package tasks

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml"

	"github.com/orchard/orchard/faults"
)

// maxFile bounds a task file read into memory: the largest published
// suites are a few hundred kilobytes.
const maxFile = 64 << 20

// Parse reads the tasks of one file. name (a path or label) picks YAML by
// its extension (.yaml, .yml) and names the file in errors. Otherwise the
// content decides: a JSON array is Online-Mind2Web's file (or an array of
// Orchard tasks), anything else is JSONL whose lines are Orchard tasks or
// WebVoyager tasks ({web_name, id, ques, web}). In JSONL, blank lines and
// lines starting with // are skipped. Every error is a task.invalid fault
// naming the file and the line (JSONL) or index (arrays, YAML).
func Parse(r io.Reader, name string) ([]Task, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxFile+1))
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, fmt.Sprintf("%s: read failed", name))
	}
	if len(data) > maxFile {
		return nil, invalid("%s: larger than %d bytes", name, maxFile)
	}
	// A UTF-8 byte order mark (Windows editors, utf-8-sig writers) is no
	// part of the content.
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	var ts []Task
	switch ext := strings.ToLower(filepath.Ext(name)); {
	case ext == ".yaml" || ext == ".yml":
		ts, err = parseYAML(data, name)
	case bytes.HasPrefix(bytes.TrimSpace(data), []byte("[")):
		ts, err = parseArray(data, name)
	default:
		ts, err = parseJSONL(data, name)
	}
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, invalid("%s: no tasks", name)
	}
	return ts, nil
}

// LoadFile parses the task file at path.
func LoadFile(path string) ([]Task, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, fmt.Sprintf("open task file %s", path))
	}
	defer f.Close()
	return Parse(f, path)
}

func parseJSONL(data []byte, name string) ([]Task, error) {
	var ts []Task
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), maxFile)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || bytes.HasPrefix(line, []byte("//")) {
			continue
		}
		t, err := decodeTask(line)
		if err != nil {
			return nil, invalid("%s: line %d: %v", name, n, err)
		}
		if first, dup := seen[t.ID]; dup {
			return nil, invalid("%s: line %d: duplicate id %q (first on line %d)", name, n, t.ID, first)
		}
		seen[t.ID] = n
		ts = append(ts, t)
	}
	if err := sc.Err(); err != nil {
		return nil, invalid("%s: %v", name, err)
	}
	return ts, nil
}

func parseArray(data []byte, name string) ([]Task, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal(data, &raws); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, invalid("%s: line %d: %v", name, lineAt(data, se.Offset), err)
		}
		return nil, invalid("%s: %v", name, err)
	}
	return decodeAll(raws, name)
}

func parseYAML(data []byte, name string) ([]Task, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, invalid("%s: %v", name, err)
	}
	js = bytes.TrimSpace(js)
	var raws []json.RawMessage
	suite := ""
	if bytes.HasPrefix(js, []byte("[")) {
		if err := json.Unmarshal(js, &raws); err != nil {
			return nil, invalid("%s: %v", name, err)
		}
	} else {
		var doc struct {
			Suite string            `json:"suite"`
			Tasks []json.RawMessage `json:"tasks"`
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&doc); err != nil {
			return nil, invalid("%s: want a list of tasks or {suite, tasks}: %v", name, err)
		}
		suite, raws = doc.Suite, doc.Tasks
	}
	ts, err := decodeAll(raws, name)
	if err != nil {
		return nil, err
	}
	for i := range ts {
		if ts[i].Suite == "" {
			ts[i].Suite = suite
		}
	}
	return ts, nil
}

func decodeAll(raws []json.RawMessage, name string) ([]Task, error) {
	ts := make([]Task, 0, len(raws))
	seen := map[string]int{}
	for i, raw := range raws {
		t, err := decodeTask(raw)
		if err != nil {
			return nil, invalid("%s: index %d: %v", name, i, err)
		}
		if first, dup := seen[t.ID]; dup {
			return nil, invalid("%s: index %d: duplicate id %q (first at index %d)", name, i, t.ID, first)
		}
		seen[t.ID] = i
		ts = append(ts, t)
	}
	return ts, nil
}

// ParseInline decodes one task given inline (an episode's "task") as
// strictly as a task file's: an unknown field anywhere in it, or an
// evaluator without what it needs, is task.invalid naming it. A task of
// Orchard's format without an id gets id.
func ParseInline(raw []byte, id string) (Task, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil || keys == nil {
		return Task{}, invalid("task: not a JSON object")
	}
	if !has(keys, "id") && !has(keys, "ques") && !has(keys, "confirmed_task") && !has(keys, "task_description") {
		keys["id"], _ = json.Marshal(id)
		raw, _ = json.Marshal(keys)
	}
	t, err := decodeTask(raw)
	if err != nil {
		return Task{}, invalid("task: %v", err)
	}
	return t, nil
}

// decodeTask decodes one task object, telling the formats apart by their
// keys, and validates it.
func decodeTask(raw []byte) (Task, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return Task{}, err
	}
	if keys == nil {
		return Task{}, fmt.Errorf("not a JSON object")
	}
	var t Task
	var err error
	switch {
	case has(keys, "ques"):
		t, err = decodeWebVoyager(raw)
	case has(keys, "confirmed_task") || has(keys, "task_description"):
		t, err = decodeMind2Web(raw)
	default:
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		err = dec.Decode(&t)
		if t.Source == "" {
			t.Source = SourceOrchard
		}
	}
	if err != nil {
		return Task{}, err
	}
	return t, t.Validate()
}

func has(m map[string]json.RawMessage, k string) bool { _, ok := m[k]; return ok }

// decodeWebVoyager reads a line of WebVoyager_data.jsonl, or of
// GAIA_web.jsonl, whose "Final answer" becomes an answer_match eval.
func decodeWebVoyager(raw []byte) (Task, error) {
	var w struct {
		WebName     string          `json:"web_name"`
		ID          json.RawMessage `json:"id"`
		Ques        string          `json:"ques"`
		Web         string          `json:"web"`
		FinalAnswer string          `json:"Final answer"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return Task{}, err
	}
	id, err := idString(w.ID)
	if err != nil {
		return Task{}, err
	}
	t := Task{ID: id, Source: SourceWebVoyager, StartURL: w.Web, Question: w.Ques, Website: w.WebName}
	if w.FinalAnswer != "" {
		t.Eval = &Eval{Type: EvalAnswerMatch, Mode: ModeContains, References: []string{w.FinalAnswer}}
	}
	return t, nil
}

// decodeMind2Web reads a task of Online_Mind2Web.json; older copies name
// the instruction task_description.
func decodeMind2Web(raw []byte) (Task, error) {
	var m struct {
		TaskID          string `json:"task_id"`
		ConfirmedTask   string `json:"confirmed_task"`
		TaskDescription string `json:"task_description"`
		Website         string `json:"website"`
		ReferenceLength int    `json:"reference_length"`
		Level           string `json:"level"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return Task{}, err
	}
	q := m.ConfirmedTask
	if q == "" {
		q = m.TaskDescription
	}
	if m.Website == "" {
		return Task{}, fmt.Errorf("task %s: missing website", m.TaskID)
	}
	return Task{
		ID: m.TaskID, Source: SourceMind2Web, StartURL: m.Website, Question: q, Website: m.Website,
		Level: m.Level, ReferenceLength: m.ReferenceLength,
	}, nil
}

// idString accepts a string or integer id.
func idString(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return "", fmt.Errorf("id: want a string or number")
	}
	return n.String(), nil
}

// lineAt is the 1-based line of byte offset off in data.
func lineAt(data []byte, off int64) int {
	off = min(max(off, 0), int64(len(data)))
	return bytes.Count(data[:off], []byte("\n")) + 1
}

// WithReferences reads WebVoyager's reference_answer.json ({web_name:
// {answers: [{id, type, ans}]}}) and gives every task that has no eval an
// answer_match eval (mode contains) whose references are the task's
// answers, golden and possible. Task ids are "<web_name>--<n>".
func WithReferences(tasks []Task, r io.Reader) error {
	var refs map[string]struct {
		Answers []struct {
			ID   json.RawMessage `json:"id"`
			Type string          `json:"type"`
			Ans  string          `json:"ans"`
		} `json:"answers"`
	}
	if err := json.NewDecoder(io.LimitReader(r, maxFile)).Decode(&refs); err != nil {
		return invalid("reference answers: %v", err)
	}
	answers := map[string][]string{}
	for site, ref := range refs {
		for i, a := range ref.Answers {
			n, err := idString(a.ID)
			if err != nil {
				return invalid("reference answers: %s answer %d: %v", site, i, err)
			}
			if strings.TrimSpace(a.Ans) == "" {
				continue
			}
			k := site + "--" + n
			answers[k] = append(answers[k], a.Ans)
		}
	}
	for i := range tasks {
		t := &tasks[i]
		if t.Eval != nil {
			continue
		}
		site, n, ok := cutLast(t.ID, "--")
		if !ok {
			continue
		}
		if t.Website != "" {
			site = t.Website
		}
		if _, err := strconv.Atoi(n); err != nil {
			continue
		}
		if refs := answers[site+"--"+n]; len(refs) > 0 {
			t.Eval = &Eval{Type: EvalAnswerMatch, Mode: ModeContains, References: refs}
		}
	}
	return nil
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}
