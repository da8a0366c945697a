package dataset

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/goccy/go-yaml"
)

// Card is the YAML header of a dataset card (README.md) as the Hugging
// Face Hub and datasets.load_dataset read it.
type Card struct {
	Configs     []CardConfig `yaml:"configs"`
	DatasetInfo CardInfo     `yaml:"dataset_info"`
	Tags        []string     `yaml:"tags,omitempty"`
}

// CardConfig is one config: the files of each split.
type CardConfig struct {
	ConfigName string      `yaml:"config_name"`
	DataFiles  []DataFiles `yaml:"data_files"`
}

// DataFiles names a split's files by a glob relative to the card.
type DataFiles struct {
	Split string `yaml:"split"`
	Path  string `yaml:"path"`
}

// CardInfo is the dataset_info block: features and split sizes.
type CardInfo struct {
	Features []Feature   `yaml:"features"`
	Splits   []CardSplit `yaml:"splits"`
}

// Feature is a column in the datasets library's YAML form: a dtype
// (string, float64, bool, image), a list of a dtype or of fields.
type Feature struct {
	Name  string `yaml:"name,omitempty"`
	Dtype string `yaml:"dtype,omitempty"`
	// List is a dtype name or a []Feature (a list of structs).
	List any `yaml:"list,omitempty"`
}

// CardSplit is a split's size; datasets checks NumExamples when it loads.
type CardSplit struct {
	Name        string `yaml:"name"`
	NumBytes    int64  `yaml:"num_bytes"`
	NumExamples int    `yaml:"num_examples"`
}

// features are the columns of each layout, in the Parquet files' order.
func features(layout string) []Feature {
	if layout == LayoutShell {
		return []Feature{
			{Name: "messages", List: []Feature{
				{Name: "role", Dtype: "string"},
				{Name: "content", Dtype: "string"},
				{Name: "tool_calls", List: []Feature{
					{Name: "id", Dtype: "string"},
					{Name: "name", Dtype: "string"},
					{Name: "arguments", Dtype: "string"},
				}},
				{Name: "tool_call_id", Dtype: "string"},
				{Name: "name", Dtype: "string"},
			}},
			{Name: "resolved", Dtype: "bool"},
			{Name: "reward", Dtype: "float64"},
			{Name: "status", Dtype: "string"},
			{Name: "task_id", Dtype: "string"},
			{Name: "metadata", Dtype: "string"},
		}
	}
	return []Feature{
		{Name: "messages", Dtype: "string"},
		{Name: "images", List: "image"},
		{Name: "reward", Dtype: "float64"},
		{Name: "status", Dtype: "string"},
		{Name: "metadata", Dtype: "string"},
	}
}

// CardOf is the card header of a build.
func CardOf(m *Manifest) Card {
	c := Card{Configs: []CardConfig{{ConfigName: "default"}}, Tags: []string{"orchard", "agents", "trajectories", m.Layout}}
	c.DatasetInfo.Features = features(m.Layout)
	for _, split := range m.splitNames() {
		si := m.SplitFiles[split]
		c.Configs[0].DataFiles = append(c.Configs[0].DataFiles, DataFiles{Split: split, Path: "data/" + split + "-*"})
		c.DatasetInfo.Splits = append(c.DatasetInfo.Splits, CardSplit{Name: split, NumBytes: si.Bytes, NumExamples: si.Rows})
	}
	return c
}

// ParseCard reads the YAML header of a dataset card.
func ParseCard(readme []byte) (Card, error) {
	var c Card
	text := string(readme)
	if !strings.HasPrefix(text, "---\n") {
		return c, fmt.Errorf("dataset card: no YAML header")
	}
	head, _, ok := strings.Cut(text[4:], "\n---\n")
	if !ok {
		return c, fmt.Errorf("dataset card: YAML header not closed")
	}
	if err := yaml.Unmarshal([]byte(head), &c); err != nil {
		return c, fmt.Errorf("dataset card: %w", err)
	}
	return c, nil
}

func writeCard(dir string, m *Manifest) error {
	head, err := yaml.Marshal(CardOf(m))
	if err != nil {
		return err
	}
	var b bytes.Buffer
	b.WriteString("---\n")
	b.Write(head)
	b.WriteString("---\n\n")
	fmt.Fprintf(&b, "# %s\n\n", m.Name)
	fmt.Fprintf(&b, "Episodes recorded by Orchard, built %s in the `%s` layout: %d episodes",
		m.CreatedAt.Format("2006-01-02 15:04 UTC"), m.Layout, m.Included)
	if n := sum(m.Excluded); n > 0 {
		fmt.Fprintf(&b, " (%d left out: %s)", n, reasons(m.Excluded))
	}
	b.WriteString(". Splits are by task — a hash of the task id — so no task is in two splits:\n\n")
	b.WriteString("| split | episodes | tasks | files |\n| --- | --- | --- | --- |\n")
	for _, split := range m.splitNames() {
		si := m.SplitFiles[split]
		fmt.Fprintf(&b, "| %s | %d | %d | %d |\n", split, si.Rows, si.Tasks, len(si.Files))
	}
	b.WriteString("\n```python\nfrom datasets import load_dataset\nds = load_dataset(\"path/to/this/folder\")\n```\n\n")
	if m.Layout == LayoutShell {
		b.WriteString("Columns: `messages` (the task, then per step an assistant tool call — exec, write_file, " +
			"apply_patch, submit — with the action's fields as JSON `arguments`, and the tool's answer: exit code, " +
			"stdout and stderr, truncation marked), `resolved` (the episode's outcome is success), `reward`, " +
			"`status` (success, failure or env_error), `task_id` and `metadata` (JSON: recording id, " +
			"attribution, evaluation).\n")
	} else {
		b.WriteString("Columns: `messages` (JSON chat: the question, then per step the action as the assistant's " +
			"message and `<image>` with URL and title as the user's; each `<image>` is the next entry of `images`), " +
			"`images` (the screenshots), `reward`, `status` (success, failure or env_error) and `metadata` " +
			"(JSON: recording, task and episode ids, attribution, evaluation).\n")
	}
	b.WriteString("\n`manifest.json` lists every recording in the build and every one left out, with the reason.\n")
	return os.WriteFile(filepath.Join(dir, "README.md"), b.Bytes(), 0o644)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func reasons(m map[string]int) string {
	var parts []string
	for _, r := range []string{ReasonEnvError, ReasonUnfinished, ReasonKind, ReasonNoTask, ReasonUnreadable} {
		if m[r] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[r], r))
		}
	}
	return strings.Join(parts, ", ")
}
