package dataset

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/recordings"
)

// Layouts of a built dataset.
const (
	// LayoutGUI is the row of the single-recording Parquet export
	// (recordings.ParquetRow) with each image as the struct of Hugging
	// Face's Image feature: browser and desktop episodes.
	LayoutGUI = "gui"
	// LayoutShell is ShellRow: shell and SWE episodes as chat messages
	// with tool calls and a resolved label.
	LayoutShell = "shell"
)

// DefaultShardBytes bounds a shard's row payload: Hugging Face's own
// uploads cut shards at 500 MB; half that keeps a shard quick to fetch
// and what a writer buffers small.
const DefaultShardBytes = 256 << 20

// flushBytes is how much row payload a shard writer buffers before it
// writes a row group: it bounds a build's memory, and at this size a row
// group still compresses and reads well.
const flushBytes = 16 << 20

// ManifestVersion is written to every manifest.json.
const ManifestVersion = 1

// Options describe a build.
type Options struct {
	// Name is the dataset's name on its card; default "orchard-episodes".
	Name string `json:"name,omitempty"`
	// Layout is LayoutGUI (default) or LayoutShell.
	Layout    string    `json:"layout,omitempty"`
	Selection Selection `json:"select"`
	Splits    Splits    `json:"splits"`
	// ShardBytes bounds a shard's row payload (uncompressed text and
	// image bytes); 0 is DefaultShardBytes. A row larger than the bound
	// makes a shard of its own.
	ShardBytes int64 `json:"shard_bytes,omitempty"`
}

func (o *Options) defaults() error {
	if o.Name == "" {
		o.Name = "orchard-episodes"
	}
	if o.Layout == "" {
		o.Layout = LayoutGUI
	}
	if o.Layout != LayoutGUI && o.Layout != LayoutShell {
		return invalid("unknown layout %q (want gui or shell)", o.Layout)
	}
	if o.ShardBytes < 0 {
		return invalid("shard_bytes %d is negative", o.ShardBytes)
	}
	if o.ShardBytes == 0 {
		o.ShardBytes = DefaultShardBytes
	}
	if err := o.Splits.validate(); err != nil {
		return err
	}
	return o.Selection.Validate()
}

// Manifest is manifest.json: what went into a build and what was left out.
type Manifest struct {
	Version   int       `json:"version"`
	Name      string    `json:"name"`
	Layout    string    `json:"layout"`
	CreatedAt time.Time `json:"created_at"`
	Selection Selection `json:"select"`
	Splits    Splits    `json:"splits"`
	// Considered counts the recordings the selection names; Included
	// those in the dataset; Excluded the rest by reason.
	Considered int            `json:"considered"`
	Included   int            `json:"included"`
	Excluded   map[string]int `json:"excluded"`
	// Outcomes counts the included recordings by outcome.
	Outcomes map[string]int `json:"outcomes"`
	// SplitFiles describes each split that has rows.
	SplitFiles map[string]*SplitInfo `json:"split_files"`
	Recordings []Entry               `json:"recordings"`
	Left       []Left                `json:"excluded_recordings"`
}

// SplitInfo is one split of a build.
type SplitInfo struct {
	Rows  int      `json:"rows"`
	Tasks int      `json:"tasks"`
	Bytes int64    `json:"bytes"` // row payload, before compression
	Files []string `json:"files"` // relative to the dataset folder
	tasks map[string]bool
}

// Entry is one recording in a build.
type Entry struct {
	ID      string `json:"id"`
	TaskID  string `json:"task_id"`
	Kind    string `json:"kind,omitempty"`
	Outcome string `json:"outcome"`
	Steps   int    `json:"steps"`
	Split   string `json:"split,omitempty"`
	Dir     string `json:"dir,omitempty"` // the folder of an Online-Mind2Web export
}

// Left is a recording the selection names that is not in the build.
type Left struct {
	ID     string `json:"id"`
	TaskID string `json:"task_id,omitempty"`
	Reason string `json:"reason"`
}

func newManifest(name, layout string, sel Selection, sp Splits) *Manifest {
	return &Manifest{Version: ManifestVersion, Name: name, Layout: layout, CreatedAt: time.Now().UTC(),
		Selection: sel, Splits: sp, Excluded: map[string]int{}, Outcomes: map[string]int{},
		SplitFiles: map[string]*SplitInfo{}, Recordings: []Entry{}, Left: []Left{}}
}

func (m *Manifest) leave(man recordings.Manifest, reason string) {
	m.Excluded[reason]++
	m.Left = append(m.Left, Left{ID: man.ID, TaskID: man.TaskID, Reason: reason})
}

// kindFits reports whether a recording of kind goes into layout.
func kindFits(layout, kind string) bool {
	if layout == LayoutShell {
		return kind == "shell"
	}
	return kind != "shell"
}

// candidates lists the recordings sel names, oldest first so that a build
// of the same recordings is the same dataset, each with the reason it is
// left out ("" when it goes in).
func candidates(store *recordings.Store, sel Selection, layout string) ([]recordings.Manifest, []string, error) {
	all, err := store.List()
	if err != nil {
		return nil, nil, err
	}
	slices.Reverse(all)
	var ms []recordings.Manifest
	var reasons []string
	for _, m := range all {
		r := sel.reason(m)
		switch {
		case r == ReasonNotSelected:
			continue
		case r == "" && !kindFits(layout, m.Kind):
			r = ReasonKind
		case r == "" && m.TaskID == "":
			r = ReasonNoTask
		}
		ms = append(ms, m)
		reasons = append(reasons, r)
	}
	return ms, reasons, nil
}

// prepareDir makes dir, which must not exist or be empty.
func prepareDir(dir string) error {
	if dir == "" {
		return invalid("no output folder")
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return os.MkdirAll(dir, 0o755)
	case err != nil:
		return fmt.Errorf("dataset: %w", err)
	case len(entries) > 0:
		return faults.Newf(faults.CodeValidation, faults.Conflict, faults.Client, "dataset: output folder %s is not empty", dir)
	}
	return nil
}

// Build writes the recordings opt selects from store into dir (created;
// it must be empty): data/<split>-NNNNN-of-MMMMM.parquet, README.md (the
// dataset card) and manifest.json. Recordings left out are listed in the
// manifest with the reason; a selection that leaves nothing is an error.
func Build(ctx context.Context, store *recordings.Store, dir string, opt Options) (*Manifest, error) {
	if err := opt.defaults(); err != nil {
		return nil, err
	}
	if err := prepareDir(dir); err != nil {
		return nil, err
	}
	ms, reasons, err := candidates(store, opt.Selection, opt.Layout)
	if err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	man := newManifest(opt.Name, opt.Layout, opt.Selection, opt.Splits)
	var shards shardSet
	switch opt.Layout {
	case LayoutShell:
		shards = newShards[ShellRow](dir, opt.ShardBytes)
	default:
		shards = newShards[GUIRow](dir, opt.ShardBytes)
	}
	defer shards.abort()
	for i, m := range ms {
		if err := ctx.Err(); err != nil {
			return nil, context.Cause(ctx)
		}
		man.Considered++
		if reasons[i] != "" {
			man.leave(m, reasons[i])
			continue
		}
		r, err := store.OpenResolved(m.ID)
		if err != nil {
			man.leave(m, ReasonUnreadable)
			continue
		}
		split := opt.Splits.Of(m.TaskID)
		size, err := shards.add(ctx, split, r)
		if err != nil {
			return nil, fmt.Errorf("dataset: recording %s: %w", m.ID, err)
		}
		man.Included++
		man.Outcomes[m.Outcome]++
		man.Recordings = append(man.Recordings, Entry{ID: m.ID, TaskID: m.TaskID, Kind: m.Kind, Outcome: m.Outcome, Steps: len(r.Steps()), Split: split})
		si := man.SplitFiles[split]
		if si == nil {
			si = &SplitInfo{tasks: map[string]bool{}}
			man.SplitFiles[split] = si
		}
		si.Rows++
		si.Bytes += size
		si.tasks[m.TaskID] = true
		si.Tasks = len(si.tasks)
	}
	if man.Included == 0 {
		return nil, errNothing(man.Excluded)
	}
	files, err := shards.finish()
	if err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	for split, names := range files {
		man.SplitFiles[split].Files = names
	}
	if err := writeCard(dir, man); err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	if err := writeJSON(filepath.Join(dir, "manifest.json"), man); err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	return man, nil
}

// splitNames are the splits of m in the card's order.
func (m *Manifest) splitNames() []string {
	order := map[string]int{SplitTrain: 0, SplitValidation: 1, SplitTest: 2}
	var names []string
	for n := range m.SplitFiles {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return order[names[i]] < order[names[j]] })
	return names
}
