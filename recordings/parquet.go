package recordings

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/parquet-go/parquet-go"

	"github.com/orchard/orchard/faults"
)

// ParquetRow is the one row of the parquet export, shaped like the rows
// of microsoft/Orchard's "gui" dataset config.
type ParquetRow struct {
	// Messages is a JSON list of {"role","content"} chat messages: the
	// user's question, then per step an assistant message holding the
	// action JSON and a user message "<image>\nURL: ...\nTitle: ...". Each
	// "<image>" stands for the next entry of Images.
	Messages string `parquet:"messages"`
	// Images are the screenshots in step order, as stored (JPEG/PNG/WebP).
	Images [][]byte `parquet:"images,list"`
	// Reward is null while the episode has none.
	Reward *float64 `parquet:"reward,optional"`
	// Status is the manifest's outcome ("running" while unfinished).
	Status string `parquet:"status"`
	// Metadata is a JSON object: see ParquetMetadata.
	Metadata string `parquet:"metadata"`
}

// ChatMessage is one element of ParquetRow.Messages.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ParquetMetadata is the JSON held in ParquetRow.Metadata.
type ParquetMetadata struct {
	RecordingID     string          `json:"recording_id"`
	Version         int             `json:"version"`
	TaskID          string          `json:"task_id,omitempty"`
	EpisodeID       string          `json:"episode_id,omitempty"`
	Kind            string          `json:"kind,omitempty"`
	StartURL        string          `json:"start_url,omitempty"`
	Answer          string          `json:"answer,omitempty"`
	Steps           int             `json:"steps"`
	Attribution     *faults.Info    `json:"attribution,omitempty"`
	AttributionStep int             `json:"attribution_step,omitempty"`
	Evaluation      json.RawMessage `json:"evaluation,omitempty"`
}

// imagePlaceholder marks where a screenshot goes in a message, as in the
// dataset.
const imagePlaceholder = "<image>"

// literalPlaceholder is what a "<image>" inside recorded text (a page
// title, typed text, the question) becomes in the messages, so that every
// "<image>" left stands for an entry of images.
const literalPlaceholder = "< image>"

// literal returns text with any "<image>" in it defused.
func literal(text string) string {
	return strings.ReplaceAll(text, imagePlaceholder, literalPlaceholder)
}

// ParquetRow is the row the parquet export writes for r: what a dataset
// build writes per recording in its "gui" layout.
func (r *Recording) ParquetRow(ctx context.Context) (ParquetRow, error) { return r.parquetRow(ctx) }

// parquetRow builds the export row.
func (r *Recording) parquetRow(ctx context.Context) (ParquetRow, error) {
	msgs := []ChatMessage{{Role: "user", Content: literal(r.m.Question)}}
	row := ParquetRow{Reward: r.m.Reward, Status: r.m.Outcome, Images: [][]byte{}}
	if row.Status == "" {
		row.Status = "running"
	}
	for _, st := range r.steps {
		if err := ctx.Err(); err != nil {
			return row, err
		}
		if len(st.Action) > 0 {
			msgs = append(msgs, ChatMessage{Role: "assistant", Content: literal(string(st.Action))})
		}
		var content []string
		if st.Screenshot != "" {
			b, err := r.readImage(st)
			if err != nil {
				return row, err
			}
			row.Images = append(row.Images, b)
			content = append(content, imagePlaceholder)
		}
		if r.textFrames() && len(st.Result) > 0 {
			// A shell step's observation is its result: the output, exit
			// code and duration as the policy got them.
			content = append(content, literal(string(st.Result)))
		}
		if st.URL != "" {
			content = append(content, "URL: "+literal(st.URL))
		}
		if st.Title != "" {
			content = append(content, "Title: "+literal(st.Title))
		}
		if st.Error != nil {
			content = append(content, literal(fmt.Sprintf("Error: %s: %s", st.Error.Code, st.Error.Message)))
		}
		if len(content) > 0 {
			msgs = append(msgs, ChatMessage{Role: "user", Content: strings.Join(content, "\n")})
		}
	}
	if r.m.Answer != "" {
		msgs = append(msgs, ChatMessage{Role: "assistant", Content: literal(r.m.Answer)})
	}
	var err error
	if row.Messages, err = marshalText(msgs); err != nil {
		return row, err
	}
	row.Metadata, err = marshalText(ParquetMetadata{
		RecordingID: r.m.ID, Version: r.m.Version, TaskID: r.m.TaskID, EpisodeID: r.m.EpisodeID,
		Kind: r.m.Kind, StartURL: r.m.StartURL, Answer: r.m.Answer, Steps: len(r.steps),
		Attribution: r.m.Attribution, AttributionStep: r.m.AttributionStep, Evaluation: r.m.Evaluation,
	})
	return row, err
}

// marshalText is json.Marshal without HTML escaping, so "<image>" stays
// literal for readers that search the text for it.
func marshalText(v any) (string, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// exportParquet writes one row per episode. Screenshots are already
// compressed, so Snappy (cheap, read by every Parquet reader) only pays
// off on the text columns.
func (r *Recording) exportParquet(ctx context.Context, w io.Writer) error {
	row, err := r.parquetRow(ctx)
	if err != nil {
		return fmt.Errorf("export %s as parquet: %w", r.m.ID, err)
	}
	pw := parquet.NewGenericWriter[ParquetRow](w, parquet.Compression(&parquet.Snappy))
	if _, err := pw.Write([]ParquetRow{row}); err != nil {
		return fmt.Errorf("export %s as parquet: %w", r.m.ID, err)
	}
	if err := pw.Close(); err != nil {
		return fmt.Errorf("export %s as parquet: %w", r.m.ID, err)
	}
	return nil
}
