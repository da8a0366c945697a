package episodes

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/orchard/orchard/api"
)

// MaxFamilyDepth bounds how far a family's parent links are followed (to
// its root, or in a recording to its first steps): deeper is a loop or
// a bug, not a policy's search.
const MaxFamilyDepth = 64

// Branch is a new running episode id that continues ep from its current
// step in sandbox sandboxID: same task, budgets, deadline, step count,
// history and answer so far. Its last screenshot is left out: the branch
// takes step Steps' observation again in its own sandbox (RetakeStep),
// which puts its own in its place. Its recording is its own to open.
func (ep *Episode) Branch(id, sandboxID string, now time.Time) *Episode {
	b := &Episode{
		EpisodeStatus: api.EpisodeStatus{EpisodeID: id, SandboxID: sandboxID, TaskID: ep.TaskID, Kind: ep.Kind, Status: api.EpisodeRunning,
			Steps: ep.Steps, Answer: ep.Answer, CreatedAt: now.UTC(), Parent: ep.EpisodeID},
		Task: ep.Task, Observe: ep.Observe, MaxSteps: ep.MaxSteps, StepTimeout: ep.StepTimeout, Deadline: ep.Deadline,
		LastURL: ep.LastURL, History: slices.Clone(ep.History),
	}
	k := ep.Steps
	b.BranchStep = &k
	if n := len(ep.screens); n > 0 {
		b.screens = slices.Clone(ep.screens[:n-1])
		b.screensDirty = true
	}
	return b
}

// RetakeStep is the step that takes ep's current observation again
// without acting: the first step of a branch in its own sandbox. It is
// not counted (it is step Steps again) and carries, for the recording,
// the action that led to it.
func (ep *Episode) RetakeStep() Step {
	st := Step{Observe: ep.Observe, Reset: true}
	if n := len(ep.History); n > 0 && ep.Steps > 0 {
		st.Action = json.RawMessage(ep.History[n-1].Action)
	}
	return st
}
