// Package episodes is the episode engine without its transport: the state
// of an episode (API.md "Episodes"), the rules that move it from step to
// step to its outcome, and its persistence over the store's documents and
// locks. The server drives the sandbox and renders HTTP; this package
// decides what a step's answer means for the episode.
package episodes

import (
	"encoding/json"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/evaluate"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/tasks"
)

// Episode defaults, each with its reason.
const (
	// DefaultMaxSteps: WebVoyager's budget for a task.
	DefaultMaxSteps = 30
	// DefaultStepTimeout bounds one step: a page load with its retries.
	DefaultStepTimeout = 90 * time.Second
	// DefaultTimeout bounds an episode that a trainer abandons.
	DefaultTimeout = 30 * time.Minute
	// judgeScreenshots are the last screenshots kept for a judge.
	judgeScreenshots = 3
)

// Episode is the stored state of an episode: what GET /episodes/{id} shows
// and what the next call needs.
type Episode struct {
	api.EpisodeStatus
	Task        tasks.Task      `json:"task"`
	Observe     *api.Observe    `json:"observe"`
	MaxSteps    int             `json:"max_steps"`
	StepTimeout time.Duration   `json:"step_timeout"`
	Deadline    time.Time       `json:"deadline"`
	LastURL     string          `json:"last_url,omitempty"`
	History     []evaluate.Step `json:"history,omitempty"`
	// Children are the episodes forked from this one, in fork order.
	Children []string `json:"children,omitempty"`

	// screens are the last screenshots, for a judge; stored apart.
	screens      [][]byte
	screensDirty bool
}

// Limits are an episode's budgets as a create asks for them; zero is the
// default (for MaxSteps, the task's, then the default).
type Limits struct {
	MaxSteps    int
	StepTimeout time.Duration
	Total       time.Duration
}

// New is a running episode id of task, with no sandbox yet, created at now.
// observe nil is the default for the kind (api.KindBrowser,
// api.KindDesktop): a JPEG screenshot, and in a browser the set-of-marks
// elements; a shell episode (api.KindShell) observes its commands' output
// and takes no observe settings.
func New(id string, task tasks.Task, kind string, observe *api.Observe, lim Limits, now time.Time) *Episode {
	ep := &Episode{
		EpisodeStatus: api.EpisodeStatus{EpisodeID: id, TaskID: task.ID, Kind: kind, Status: api.EpisodeRunning, CreatedAt: now.UTC()},
		Task:          task, Observe: observe, MaxSteps: lim.MaxSteps, StepTimeout: lim.StepTimeout,
	}
	if ep.MaxSteps <= 0 {
		ep.MaxSteps = task.MaxSteps
	}
	if ep.MaxSteps <= 0 {
		ep.MaxSteps = DefaultMaxSteps
	}
	if ep.StepTimeout <= 0 {
		ep.StepTimeout = DefaultStepTimeout
	}
	total := lim.Total
	if total <= 0 {
		total = DefaultTimeout
	}
	ep.Deadline = now.Add(total)
	if ep.Observe == nil {
		ep.Observe = &api.Observe{Screenshot: "jpeg", SOM: true}
		if ep.Desktop() {
			ep.Observe = &api.Observe{Screenshot: "jpeg"}
		}
		if ep.Shell() {
			ep.Observe = nil
		}
	}
	return ep
}

// Ended reports whether ep was finished or aborted.
func (ep *Episode) Ended() bool {
	return ep.Status == api.EpisodeFinished || ep.Status == api.EpisodeAborted
}

// Desktop reports whether ep runs in a desktop sandbox. Episodes stored
// before episodes had kinds have none: they are browser episodes.
func (ep *Episode) Desktop() bool { return ep.Kind == api.KindDesktop }

// Shell reports whether ep runs in a shell sandbox: its steps are
// commands, files and patches, and it has no page or screen.
func (ep *Episode) Shell() bool { return ep.Kind == api.KindShell }

// Browser reports whether ep has a browser page (an evaluator may look at
// it); episodes stored before kinds are browser episodes.
func (ep *Episode) Browser() bool { return ep.Kind == "" || ep.Kind == api.KindBrowser }

// Screens are the last screenshots of ep, oldest first, when it was
// loaded with them.
func (ep *Episode) Screens() [][]byte { return ep.screens }

// CheckRunning refuses a step on an episode that takes no more.
func (ep *Episode) CheckRunning() error {
	if ep.Status != api.EpisodeRunning {
		return faults.Newf(faults.CodeEpisodeDone, faults.Conflict, faults.Client, "episode %s is %s: finish it or start another", ep.EpisodeID, ep.Status)
	}
	return nil
}

// IsEnvFault reports whether a step's error ends the episode as the
// environment's fault rather than the policy's.
func IsEnvFault(f *faults.Info) bool {
	if f == nil {
		return false
	}
	switch f.Source {
	case faults.Policy, faults.Client, faults.Task:
		return false
	}
	info, ok := faults.Lookup(f.Code)
	if !ok {
		return f.Category != faults.ActionFailed && f.Category != faults.InvalidRequest
	}
	return info.EnvError
}

// EndEnvError ends ep as the environment's fault f at step, unless it
// already has an outcome.
func (ep *Episode) EndEnvError(f faults.Info, step int) {
	if ep.Outcome != "" {
		return
	}
	zero := 0.0
	ep.Outcome, ep.Attribution, ep.Reward = api.OutcomeEnvError, &api.Attribution{Info: f, Step: step}, &zero
}

// Finish concludes ep: answer, when not nil, replaces the policy's
// answer; then, unless a fault already ended ep env_error, evaluate scores
// its trajectory. An error of the client or the policy (a task without an
// eval block, a bad one) is returned and ep is not finished; any other
// evaluation error ends ep env_error, as the environment's fault.
func (ep *Episode) Finish(answer *string, evaluate func(evaluate.Trajectory) (evaluate.Result, error)) error {
	if answer != nil {
		ep.Answer = *answer
	}
	if ep.Outcome == "" {
		if ep.Task.Eval == nil {
			return faults.Newf(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, "task %s has no eval block", ep.Task.ID)
		}
		res, err := evaluate(ep.Trajectory())
		if err != nil {
			f := faults.Of(err)
			if f.Source == faults.Client || f.Source == faults.Policy {
				return err
			}
			ep.EndEnvError(f.Info(), ep.Steps)
		} else {
			// Refused here, not when the state is saved or rendered.
			if _, err := json.Marshal(res); err != nil {
				return err
			}
			ep.Evaluation = &res
			ep.Outcome = api.OutcomeFailure
			if res.Success {
				ep.Outcome = api.OutcomeSuccess
			}
			r := res.Reward
			ep.Reward = &r
		}
	}
	ep.Status = api.EpisodeFinished
	return nil
}

// Trajectory is what an evaluator scores: the task's question, the
// answer and the steps so far.
func (ep *Episode) Trajectory() evaluate.Trajectory {
	return evaluate.Trajectory{Question: ep.Task.Question, Answer: ep.Answer, StartURL: ep.Task.StartURL, Steps: ep.History, Screenshots: ep.screens}
}

// Abort ends a running episode without an outcome; an ended one stays as
// it is. It reports whether ep changed.
func (ep *Episode) Abort() bool {
	if ep.Ended() {
		return false
	}
	ep.Status = api.EpisodeAborted
	return true
}

// Result is the answer of a finish.
func (ep *Episode) Result() api.EpisodeResult {
	return api.EpisodeResult{EpisodeID: ep.EpisodeID, Outcome: ep.Outcome, Reward: ep.Reward, Evaluation: ep.Evaluation,
		Attribution: ep.Attribution, Steps: ep.Steps, Answer: ep.Answer, RecordingID: ep.RecordingID}
}
