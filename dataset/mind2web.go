package dataset

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"

	"github.com/orchard/orchard/recordings"
)

// LayoutMind2Web is the Online-Mind2Web evaluation layout.
const LayoutMind2Web = "mind2web"

// Mind2WebResult is result.json of a task folder in Online-Mind2Web's
// evaluation layout (its first schema, which WebJudge's run script reads
// when schema_version is absent): the task, the actions taken and the
// final answer. The screenshots are trajectory/<n>_screenshot.<ext>, in
// step order by the number their name starts with.
type Mind2WebResult struct {
	TaskID              string   `json:"task_id"`
	Task                string   `json:"task"`
	ActionHistory       []string `json:"action_history"`
	FinalResultResponse string   `json:"final_result_response"`
	// Orchard's own: what the episode was and how it ended.
	RecordingID string   `json:"recording_id"`
	StartURL    string   `json:"start_url,omitempty"`
	Outcome     string   `json:"outcome"`
	Reward      *float64 `json:"reward,omitempty"`
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// folderName is a task's folder: its id with anything but [A-Za-z0-9._-]
// replaced, so that a "suite/id" stays one path element.
func folderName(task string) string {
	n := unsafeName.ReplaceAllString(task, "_")
	if n == "" || n == "." || n == ".." {
		n = "_" + n
	}
	return n
}

// ExportMind2Web writes the browser and desktop recordings sel picks into
// dir (created; it must be empty) in Online-Mind2Web's evaluation layout:
// <dir>/<task>/result.json and <dir>/<task>/trajectory/, so that its
// WebJudge scripts (--trajectories_dir dir) run on Orchard's episodes.
// The folder is the task id; a task run more than once gets one folder
// per episode, <task>_<recording id>. manifest.json lists what went in.
func ExportMind2Web(ctx context.Context, store *recordings.Store, dir string, sel Selection) (*Manifest, error) {
	if err := sel.Validate(); err != nil {
		return nil, err
	}
	if err := prepareDir(dir); err != nil {
		return nil, err
	}
	ms, reasons, err := candidates(store, sel, LayoutGUI)
	if err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	runs := map[string]int{}
	for i, m := range ms {
		if reasons[i] == "" {
			runs[m.TaskID]++
		}
	}
	man := newManifest("online-mind2web", LayoutMind2Web, sel, Splits{})
	// The manifest goes next to the task folders: WebJudge lists only
	// folders, so a file there is not taken for a task.
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
		name := folderName(m.TaskID)
		if runs[m.TaskID] > 1 {
			name += "_" + m.ID
		}
		if err := writeMind2WebTask(filepath.Join(dir, name), r); err != nil {
			return nil, fmt.Errorf("dataset: recording %s: %w", m.ID, err)
		}
		man.Included++
		man.Outcomes[m.Outcome]++
		man.Recordings = append(man.Recordings, Entry{ID: m.ID, TaskID: m.TaskID, Kind: m.Kind, Outcome: m.Outcome, Steps: len(r.Steps()), Dir: name})
	}
	if man.Included == 0 {
		return nil, errNothing(man.Excluded)
	}
	if err := writeJSON(filepath.Join(dir, "manifest.json"), man); err != nil {
		return nil, fmt.Errorf("dataset: %w", err)
	}
	return man, nil
}

func writeMind2WebTask(dir string, r *recordings.Recording) error {
	m := r.Manifest()
	traj := filepath.Join(dir, "trajectory")
	if err := os.MkdirAll(traj, 0o755); err != nil {
		return err
	}
	res := Mind2WebResult{TaskID: m.TaskID, Task: m.Question, ActionHistory: []string{}, FinalResultResponse: m.Answer,
		RecordingID: m.ID, StartURL: m.StartURL, Outcome: m.Outcome, Reward: m.Reward}
	shot := 0
	for _, st := range r.Steps() {
		if len(st.Action) > 0 {
			var a struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			_ = json.Unmarshal(st.Action, &a)
			if a.Type == "answer" {
				if res.FinalResultResponse == "" {
					res.FinalResultResponse = a.Text
				}
			} else {
				res.ActionHistory = append(res.ActionHistory, string(st.Action))
			}
		}
		if st.Screenshot == "" {
			continue
		}
		b, _, err := r.Image(st.N)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%d_screenshot%s", shot, path.Ext(st.Screenshot))
		if err := os.WriteFile(filepath.Join(traj, name), b, 0o644); err != nil {
			return err
		}
		shot++
	}
	return writeJSON(filepath.Join(dir, "result.json"), res)
}
