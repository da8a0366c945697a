package dataset

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/parquet-go/parquet-go"

	"github.com/orchard/orchard/recordings"
)

// Image is one image as Hugging Face's Image feature stores it: the
// encoded bytes and a name (datasets decodes the bytes; the path only
// says where the image came from).
type Image struct {
	Bytes []byte `parquet:"bytes"`
	Path  string `parquet:"path"`
}

// GUIRow is a row of the gui layout: recordings.ParquetRow with its
// images as Image structs.
type GUIRow struct {
	Messages string   `parquet:"messages"`
	Images   []Image  `parquet:"images,list"`
	Reward   *float64 `parquet:"reward,optional"`
	Status   string   `parquet:"status"`
	Metadata string   `parquet:"metadata"`
}

// ShellRow is a row of the shell layout: a shell or SWE episode as a chat
// with tool calls, the way tool-using models are trained.
type ShellRow struct {
	// Messages: the task as the user's message; per step an assistant
	// message with one tool call (exec, write_file, apply_patch, submit)
	// and the tool's answer; the final answer as an assistant message.
	Messages []Message `parquet:"messages,list"`
	// Resolved is true when the episode's outcome is success.
	Resolved bool     `parquet:"resolved"`
	Reward   *float64 `parquet:"reward,optional"`
	Status   string   `parquet:"status"`
	TaskID   string   `parquet:"task_id"`
	// Metadata is recordings.ParquetMetadata as JSON.
	Metadata string `parquet:"metadata"`
}

// Message is one chat message of ShellRow.
type Message struct {
	Role       string     `parquet:"role" json:"role"` // user | assistant | tool
	Content    string     `parquet:"content" json:"content"`
	ToolCalls  []ToolCall `parquet:"tool_calls,list" json:"tool_calls,omitempty"`
	ToolCallID string     `parquet:"tool_call_id" json:"tool_call_id,omitempty"`
	Name       string     `parquet:"name" json:"name,omitempty"` // the tool's, on a tool message
}

// ToolCall is one tool call of an assistant message: Arguments is the
// recorded action without its type, as JSON.
type ToolCall struct {
	ID        string `parquet:"id" json:"id"`
	Name      string `parquet:"name" json:"name"`
	Arguments string `parquet:"arguments" json:"arguments"`
}

// shellResult is the result of a recorded shell step.
type shellResult struct {
	Stdout          *string `json:"stdout"`
	Stderr          string  `json:"stderr"`
	ExitCode        *int    `json:"exit_code"`
	DurationMS      float64 `json:"duration_ms"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
}

// guiRow is the gui row of r and its payload size.
func guiRow(ctx context.Context, r *recordings.Recording) (GUIRow, int64, error) {
	pr, err := r.ParquetRow(ctx)
	if err != nil {
		return GUIRow{}, 0, err
	}
	row := GUIRow{Messages: pr.Messages, Reward: pr.Reward, Status: pr.Status, Metadata: pr.Metadata, Images: make([]Image, 0, len(pr.Images))}
	var names []string
	for _, st := range r.Steps() {
		if st.Screenshot != "" {
			names = append(names, path.Base(st.Screenshot))
		}
	}
	id := r.Manifest().ID
	size := int64(len(row.Messages) + len(row.Metadata))
	for i, b := range pr.Images {
		name := fmt.Sprintf("%06d", i)
		if i < len(names) {
			name = names[i]
		}
		row.Images = append(row.Images, Image{Bytes: b, Path: id + "/" + name})
		size += int64(len(b))
	}
	return row, size, nil
}

// shellRow is the shell row of r and its payload size.
func shellRow(ctx context.Context, r *recordings.Recording) (ShellRow, int64, error) {
	m := r.Manifest()
	msgs := []Message{{Role: "user", Content: m.Question}}
	answered := false
	for _, st := range r.Steps() {
		if err := ctx.Err(); err != nil {
			return ShellRow{}, 0, err
		}
		if len(st.Action) == 0 {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(st.Action, &fields); err != nil {
			fields = map[string]json.RawMessage{}
		}
		var typ string
		_ = json.Unmarshal(fields["type"], &typ)
		if typ == "answer" {
			var text string
			_ = json.Unmarshal(fields["text"], &text)
			msgs = append(msgs, Message{Role: "assistant", Content: text})
			answered = true
			continue
		}
		delete(fields, "type")
		args, _ := json.Marshal(fields)
		if typ == "" {
			typ = "action"
		}
		id := fmt.Sprintf("call_%d", st.N)
		msgs = append(msgs,
			Message{Role: "assistant", ToolCalls: []ToolCall{{ID: id, Name: typ, Arguments: string(args)}}},
			Message{Role: "tool", ToolCallID: id, Name: typ, Content: toolContent(st)})
	}
	if m.Answer != "" && !answered {
		msgs = append(msgs, Message{Role: "assistant", Content: m.Answer})
	}
	meta, err := json.Marshal(recordings.ParquetMetadata{
		RecordingID: m.ID, Version: m.Version, TaskID: m.TaskID, EpisodeID: m.EpisodeID, Kind: m.Kind,
		StartURL: m.StartURL, Answer: m.Answer, Steps: len(r.Steps()), Attribution: m.Attribution,
		AttributionStep: m.AttributionStep, Evaluation: m.Evaluation,
	})
	if err != nil {
		return ShellRow{}, 0, err
	}
	row := ShellRow{Messages: msgs, Resolved: m.Outcome == recordings.OutcomeSuccess, Reward: m.Reward,
		Status: m.Outcome, TaskID: m.TaskID, Metadata: string(meta)}
	size := int64(len(row.Metadata))
	for _, msg := range msgs {
		size += int64(len(msg.Content))
		for _, tc := range msg.ToolCalls {
			size += int64(len(tc.Arguments))
		}
	}
	return row, size, nil
}

// toolContent is what a tool message says of a step's result: exit code,
// stdout and stderr with truncation marked, or the classified error.
func toolContent(st recordings.Step) string {
	var b strings.Builder
	if st.Error != nil {
		fmt.Fprintf(&b, "error: %s: %s\n", st.Error.Code, st.Error.Message)
	}
	var res shellResult
	if len(st.Result) > 0 && json.Unmarshal(st.Result, &res) == nil && (res.ExitCode != nil || res.Stdout != nil) {
		if res.ExitCode != nil {
			fmt.Fprintf(&b, "exit_code: %d\n", *res.ExitCode)
		}
		if res.Stdout != nil && *res.Stdout != "" {
			b.WriteString("stdout:\n" + *res.Stdout)
			if !strings.HasSuffix(*res.Stdout, "\n") {
				b.WriteByte('\n')
			}
			if res.StdoutTruncated {
				b.WriteString("[stdout truncated]\n")
			}
		}
		if res.Stderr != "" {
			b.WriteString("stderr:\n" + res.Stderr)
			if !strings.HasSuffix(res.Stderr, "\n") {
				b.WriteByte('\n')
			}
			if res.StderrTruncated {
				b.WriteString("[stderr truncated]\n")
			}
		}
	} else if len(st.Result) > 0 {
		b.Write(st.Result)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// shardSet writes rows of one layout into per-split shards.
type shardSet interface {
	add(ctx context.Context, split string, r *recordings.Recording) (int64, error)
	// finish closes the shards and names them <split>-NNNNN-of-MMMMM.parquet,
	// returning the relative paths per split.
	finish() (map[string][]string, error)
	// abort removes whatever an unfinished build wrote.
	abort()
}

// blobColumns are the columns of images and long text. Their page bounds
// (the min and max value of every page, in the footer's column index) say
// nothing of use, and the writer would keep a copy of each until the shard
// closes: a build's memory would grow with the shard, not stay at a row
// group's.
var blobColumns = [][]string{
	{"messages"}, {"metadata"},
	{"images", "list", "element", "bytes"},
	{"messages", "list", "element", "content"},
	{"messages", "list", "element", "tool_calls", "list", "element", "arguments"},
}

type rowFunc[T any] func(context.Context, *recordings.Recording) (T, int64, error)

type shards[T any] struct {
	dir     string
	max     int64
	rowOf   rowFunc[T]
	open    map[string]*shard[T]
	written map[string][]string // split -> temporary file names, in order
	done    bool
}

type shard[T any] struct {
	f        *os.File
	w        *parquet.GenericWriter[T]
	size     int64
	buffered int64
}

func newShards[T GUIRow | ShellRow](dir string, max int64) *shards[T] {
	var rowOf any
	var zero T
	switch any(zero).(type) {
	case GUIRow:
		rowOf = rowFunc[GUIRow](guiRow)
	case ShellRow:
		rowOf = rowFunc[ShellRow](shellRow)
	}
	return &shards[T]{dir: filepath.Join(dir, "data"), max: max, rowOf: rowOf.(rowFunc[T]),
		open: map[string]*shard[T]{}, written: map[string][]string{}}
}

func (s *shards[T]) add(ctx context.Context, split string, r *recordings.Recording) (int64, error) {
	row, size, err := s.rowOf(ctx, r)
	if err != nil {
		return 0, err
	}
	sh := s.open[split]
	if sh != nil && sh.size > 0 && sh.size+size > s.max {
		if err := sh.close(); err != nil {
			return 0, err
		}
		sh = nil
	}
	if sh == nil {
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			return 0, err
		}
		name := filepath.Join(s.dir, fmt.Sprintf(".%s-%05d.parquet.tmp", split, len(s.written[split])))
		f, err := os.Create(name)
		if err != nil {
			return 0, err
		}
		// Screenshots are already compressed; Snappy is cheap and pays
		// off on the text columns, and every Parquet reader has it.
		opts := []parquet.WriterOption{parquet.Compression(&parquet.Snappy)}
		for _, p := range blobColumns {
			opts = append(opts, parquet.SkipPageBounds(p...))
		}
		sh = &shard[T]{f: f, w: parquet.NewGenericWriter[T](f, opts...)}
		s.open[split] = sh
		s.written[split] = append(s.written[split], name)
	}
	if _, err := sh.w.Write([]T{row}); err != nil {
		return 0, err
	}
	sh.size += size
	sh.buffered += size
	if sh.buffered >= flushBytes {
		if err := sh.w.Flush(); err != nil {
			return 0, err
		}
		sh.buffered = 0
	}
	return size, nil
}

func (sh *shard[T]) close() error {
	if err := sh.w.Close(); err != nil {
		sh.f.Close()
		return err
	}
	if err := sh.f.Sync(); err != nil {
		sh.f.Close()
		return err
	}
	return sh.f.Close()
}

func (s *shards[T]) finish() (map[string][]string, error) {
	for split, sh := range s.open {
		delete(s.open, split)
		if err := sh.close(); err != nil {
			return nil, err
		}
	}
	out := map[string][]string{}
	for split, names := range s.written {
		for i, tmp := range names {
			rel := fmt.Sprintf("data/%s-%05d-of-%05d.parquet", split, i, len(names))
			if err := os.Rename(tmp, filepath.Join(filepath.Dir(s.dir), filepath.FromSlash(rel))); err != nil {
				return nil, err
			}
			out[split] = append(out[split], rel)
		}
	}
	s.done = true
	return out, nil
}

func (s *shards[T]) abort() {
	if s.done {
		return
	}
	for _, sh := range s.open {
		sh.w.Close()
		sh.f.Close()
	}
	for _, names := range s.written {
		for _, n := range names {
			os.Remove(n)
		}
	}
}

func writeJSON(name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(name, append(b, '\n'), 0o644)
}
