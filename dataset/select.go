// Package dataset builds training datasets out of episode recordings: a
// folder that Hugging Face's datasets.load_dataset opens as it is (Parquet
// shards of bounded size, a dataset card with the YAML header, a manifest
// of what went in), in the "gui" layout of the single-recording Parquet
// export or the "shell" layout of shell and SWE trajectories, and a folder
// in Online-Mind2Web's evaluation layout for its WebJudge scripts.
//
// A build reads one recording at a time and writes its row before the
// next: memory depends on the largest recording and the shard size, not on
// how many recordings go in.
package dataset

import (
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/recordings"
)

// Selection picks the recordings that go into a build. Empty fields select
// everything; env_error episodes are left out unless IncludeEnvError.
type Selection struct {
	// RecordingIDs, when set, are the only recordings considered.
	RecordingIDs []string `json:"recording_ids,omitempty"`
	// Suite is the task suite the episodes ran.
	Suite string `json:"suite,omitempty"`
	// TaskIDs are the tasks, by id.
	TaskIDs []string `json:"task_ids,omitempty"`
	// Outcomes are success, failure and env_error.
	Outcomes []string `json:"outcomes,omitempty"`
	// Since and Until bound the recordings' start: Since <= created < Until.
	Since *time.Time `json:"since,omitempty"`
	Until *time.Time `json:"until,omitempty"`
	// IncludeEnvError keeps the episodes that ended in an environment
	// fault, which a trainer should not learn from.
	IncludeEnvError bool `json:"include_env_error,omitempty"`
}

// Reasons a recording is left out, as the manifest names them.
const (
	ReasonNotSelected = "not_selected" // not counted in the manifest
	ReasonEnvError    = "env_error"
	ReasonUnfinished  = "unfinished"
	ReasonKind        = "kind"    // its kind does not fit the layout
	ReasonNoTask      = "no_task" // splits are by task; it has none
	ReasonUnreadable  = "unreadable"
)

// Validate checks the selection's values.
func (s Selection) Validate() error {
	for _, o := range s.Outcomes {
		switch o {
		case recordings.OutcomeSuccess, recordings.OutcomeFailure, recordings.OutcomeEnvError:
		default:
			return invalid("unknown outcome %q (want success, failure or env_error)", o)
		}
	}
	if s.Since != nil && s.Until != nil && !s.Since.Before(*s.Until) {
		return invalid("since %s is not before until %s", s.Since.Format(time.RFC3339), s.Until.Format(time.RFC3339))
	}
	for _, id := range s.RecordingIDs {
		if !recordings.ValidID(id) {
			return invalid("invalid recording id %q", id)
		}
	}
	return nil
}

// reason is why m is left out, or "" when it goes in. ReasonNotSelected
// means the selection does not ask for it at all.
func (s Selection) reason(m recordings.Manifest) string {
	switch {
	case len(s.RecordingIDs) > 0 && !slices.Contains(s.RecordingIDs, m.ID),
		s.Suite != "" && m.Suite != s.Suite,
		len(s.TaskIDs) > 0 && !slices.Contains(s.TaskIDs, m.TaskID),
		s.Since != nil && m.CreatedAt.Before(*s.Since),
		s.Until != nil && !m.CreatedAt.Before(*s.Until):
		return ReasonNotSelected
	case m.FinishedAt == nil || m.Outcome == "":
		return ReasonUnfinished
	case len(s.Outcomes) > 0 && !slices.Contains(s.Outcomes, m.Outcome):
		return ReasonNotSelected
	case m.Outcome == recordings.OutcomeEnvError && !s.IncludeEnvError && !slices.Contains(s.Outcomes, recordings.OutcomeEnvError):
		return ReasonEnvError
	}
	return ""
}

// Splits assigns tasks to splits by a hash of the task id, so that every
// episode of a task lands in the same split and a build of the same
// recordings is the same dataset.
type Splits struct {
	// TestPercent and ValidationPercent are the shares of tasks (not
	// episodes) in the test and validation splits; the rest is train.
	TestPercent       int `json:"test_percent"`
	ValidationPercent int `json:"validation_percent,omitempty"`
}

// Split names.
const (
	SplitTrain      = "train"
	SplitValidation = "validation"
	SplitTest       = "test"
)

func (s Splits) validate() error {
	if s.TestPercent < 0 || s.ValidationPercent < 0 || s.TestPercent+s.ValidationPercent > 100 {
		return invalid("split percentages %d (test) and %d (validation): want each >= 0 and a sum <= 100", s.TestPercent, s.ValidationPercent)
	}
	return nil
}

// Of is the split of task.
func (s Splits) Of(task string) string {
	h := fnv.New64a()
	h.Write([]byte(task))
	b := int(h.Sum64() % 100)
	switch {
	case b < s.TestPercent:
		return SplitTest
	case b < s.TestPercent+s.ValidationPercent:
		return SplitValidation
	}
	return SplitTrain
}

func invalid(format string, args ...any) error {
	return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "dataset: "+format, args...)
}

// errNothing is a build whose selection leaves no recording.
func errNothing(excluded map[string]int) error {
	return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
		"dataset: no recording matches the selection (left out: %v)", fmt.Sprint(excluded))
}
