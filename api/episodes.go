package api

import (
	"encoding/json"
	"time"

	"github.com/orchard/orchard/faults"
)

// Episode wire types (API.md "Episodes"): the bodies of /episodes, shared
// by the server, the Go client and — by their JSON — the Python SDK. A
// field here is API: add, never rename, and keep each omitempty as it is.

// Outcomes of a finished episode: the policy succeeded, the policy failed,
// or the environment failed under it (a trainer must not learn from that).
const (
	OutcomeSuccess  = "success"
	OutcomeFailure  = "failure"
	OutcomeEnvError = "env_error"
)

// Episode statuses.
const (
	EpisodeRunning  = "running"
	EpisodeDone     = "done" // no more steps: finish it
	EpisodeFinished = "finished"
	EpisodeAborted  = "aborted"
)

// CreateEpisodeRequest is the body of POST /episodes. Give TaskID (a
// loaded task, "id" or "suite/id") or Task (inline).
type CreateEpisodeRequest struct {
	TaskID string `json:"task_id,omitempty"`
	// Task is an inline task in the task format (tasks.Task); api does not
	// depend on the task package.
	Task json.RawMessage `json:"task,omitempty"`
	// Sandbox is a fragment of a POST /sandboxes body (kind, browser,
	// desktop, memory, faults, block_network, egress) merged over the
	// task's setup.sandbox.
	Sandbox json.RawMessage `json:"sandbox,omitempty"`
	// Observe chooses the parts of each observation; nil means the
	// server's default (a JPEG screenshot, and in a browser the set-of-marks
	// elements).
	Observe          *Observe `json:"observe,omitempty"`
	MaxSteps         int      `json:"max_steps,omitempty" openapi:"minimum=0" doc:"0: the task's, else the default"`
	StepTimeoutMS    int      `json:"step_timeout_ms,omitempty" openapi:"minimum=0" doc:"milliseconds; 0: the default"`
	EpisodeTimeoutMS int      `json:"episode_timeout_ms,omitempty" openapi:"minimum=0" doc:"milliseconds; 0: the default"`
	// Record is whether the episode is recorded; nil means yes.
	Record *bool `json:"record,omitempty"`
}

// StepRequest is the body of POST /episodes/{id}/step: one action, or a
// list run in order, and optionally other observation settings than the
// episode's. The actions are the episode's kind's action objects
// (BrowserAction; DesktopAction in any of its dialects; ShellAction),
// passed to the sandbox as the policy sent them: the sandbox reads and
// validates them (the server, for a shell episode's).
type StepRequest struct {
	Action  json.RawMessage   `json:"action" doc:"one action object of the episode's kind (BrowserAction, DesktopAction or ShellAction)"`
	Actions []json.RawMessage `json:"actions,omitempty" doc:"action objects of the episode's kind (BrowserAction, DesktopAction or ShellAction), run in order"`
	Observe *Observe          `json:"observe,omitempty"`
}

// StepInfo is the info of a step: its number, the classified error of its
// action, the fault a fault plan injected, and its time on the server.
type StepInfo struct {
	Step     int           `json:"step"`
	Error    *faults.Info  `json:"error,omitempty"`
	Injected *faults.Truth `json:"injected,omitempty"`
	StepMS   float64       `json:"step_ms"`
}

// StepResult is the answer of POST /episodes/{id}/step. Observation is the
// browser's or desktop's observation as its daemon gave it, or a shell
// episode's ShellObservation.
type StepResult struct {
	Observation StepObservation `json:"observation"`
	Done        bool            `json:"done"`
	Info        StepInfo        `json:"info"`
}

// EpisodeStart is the answer of POST /episodes: the episode, its sandbox
// and the first observation (step 0).
type EpisodeStart struct {
	EpisodeID string `json:"episode_id"`
	SandboxID string `json:"sandbox_id"`
	StepResult
}

// FinishEpisodeRequest is the body of POST /episodes/{id}/finish. Answer,
// when not nil, replaces the answer an `answer` action gave.
type FinishEpisodeRequest struct {
	Answer *string `json:"answer,omitempty"`
}

// Attribution names the fault that ended an episode env_error and the step
// it happened at (0: before the first action).
type Attribution struct {
	faults.Info
	Step int `json:"step"`
}

// Evaluation is the evaluator's score of an episode (evaluate.Result).
type Evaluation struct {
	Success bool    `json:"success"`
	Reward  float64 `json:"reward"`
	// Type is the task's eval type (answer_match, url_match, ...).
	Type string `json:"type"`
	// Details are what the eval compared; their fields depend on its type.
	Details map[string]any `json:"details,omitempty"`
	Judge   *JudgeVerdict  `json:"judge,omitempty"`
}

// JudgeVerdict is what a judge eval's model decided, with its raw replies
// kept for audit.
type JudgeVerdict struct {
	KeyPoints []string `json:"key_points"`
	Verdict   string   `json:"verdict" doc:"success or failure"`
	Raw       []string `json:"raw"`
}

// EpisodeResult is the answer of POST /episodes/{id}/finish. Evaluation is
// the evaluator's verdict, or null when none was reached.
type EpisodeResult struct {
	EpisodeID   string       `json:"episode_id"`
	Outcome     string       `json:"outcome"` // success, failure, env_error
	Reward      *float64     `json:"reward"`
	Evaluation  *Evaluation  `json:"evaluation"`
	Attribution *Attribution `json:"attribution"`
	Steps       int          `json:"steps"`
	Answer      string       `json:"answer"`
	RecordingID string       `json:"recording_id"`
}

// EpisodeStatus is the answer of GET /episodes/{id}.
type EpisodeStatus struct {
	EpisodeID   string       `json:"episode_id"`
	SandboxID   string       `json:"sandbox_id"`
	TaskID      string       `json:"task_id"`
	Kind        string       `json:"kind"`   // KindBrowser, KindDesktop or KindShell
	Status      string       `json:"status"` // running, done, finished, aborted
	Steps       int          `json:"steps"`
	Outcome     string       `json:"outcome,omitempty"`
	Reward      *float64     `json:"reward,omitempty"`
	Answer      string       `json:"answer,omitempty"`
	Attribution *Attribution `json:"attribution,omitempty"`
	Evaluation  *Evaluation  `json:"evaluation,omitempty"`
	CreatedAt   time.Time    `json:"created_at"`
	RecordingID string       `json:"recording_id,omitempty"`
	// Parent is the episode this one was forked from (POST
	// /episodes/{id}/fork) and BranchStep the parent's step count at the
	// fork: this episode's steps 1..BranchStep are the parent's. Both are
	// absent on an episode that was not forked.
	Parent     string `json:"parent,omitempty"`
	BranchStep *int   `json:"branch_step,omitempty"`
}

// EpisodeSummary is one episode of GET /episodes.
type EpisodeSummary struct {
	EpisodeID string    `json:"episode_id"`
	TaskID    string    `json:"task_id"`
	SandboxID string    `json:"sandbox_id"`
	Kind      string    `json:"kind"`
	Status    string    `json:"status"`
	Steps     int       `json:"steps"`
	Outcome   string    `json:"outcome"`
	CreatedAt time.Time `json:"created_at"`
}

// EpisodeList is the answer of GET /episodes, newest first.
type EpisodeList struct {
	Episodes []EpisodeSummary `json:"episodes"`
}

// EpisodeDeleted is the answer of DELETE /episodes/{id}: a finished
// episode stays finished.
type EpisodeDeleted struct {
	EpisodeID string `json:"episode_id"`
	Status    string `json:"status"`
}

// ForkEpisodeRequest is the body of POST /episodes/{id}/fork.
type ForkEpisodeRequest struct {
	Count int `json:"count" openapi:"minimum=1" doc:"how many branches (1 to the server's fork cap, ORCHARD_FORK_MAX, default 32)"`
}

// EpisodeFork is the answer of POST /episodes/{id}/fork: the branches, in
// order, each a running episode at the parent's step count with its own
// sandbox forked off the parent's, and its observation of that step
// taken in its own sandbox.
type EpisodeFork struct {
	EpisodeID  string         `json:"episode_id"`
	BranchStep int            `json:"branch_step"`
	Branches   []EpisodeStart `json:"branches"`
	// ForkMS is how long the fork took, from the request to every branch
	// ready for its next step.
	ForkMS float64 `json:"fork_ms"`
}

// EpisodeNode is one episode of a family (GET /episodes/{id}/tree).
type EpisodeNode struct {
	EpisodeID string `json:"episode_id"`
	// Parent is "" for the root; BranchStep is the parent's step count
	// at the fork (0 for the root).
	Parent      string   `json:"parent,omitempty"`
	BranchStep  int      `json:"branch_step"`
	Steps       int      `json:"steps"`
	Status      string   `json:"status"`
	Outcome     string   `json:"outcome,omitempty"`
	Reward      *float64 `json:"reward,omitempty"`
	RecordingID string   `json:"recording_id,omitempty"`
	// Children are the ids of the episodes forked from this one, in the
	// order they were made.
	Children []string `json:"children"`
}

// EpisodeTree is the answer of GET /episodes/{id}/tree: the family of an
// episode, flat, with parent links. Episodes[0] is the root (the
// ancestor with no parent, or whose parent has expired); a parent comes
// before its children (breadth first, children in fork order).
type EpisodeTree struct {
	Root     string        `json:"root"`
	Episodes []EpisodeNode `json:"episodes"`
}

// ShellObservation is the observation of a shell episode's step: how its
// last action that ran something (not answer or submit) ended. For exec, the command's output, each stream capped
// (Stdout/StderrTruncated mark a cut), its exit code (124 after its
// timeout) and its wall time; for write_file and apply_patch, the same
// shape (git apply's output and exit code; a file that could not be
// written exits 1 with the reason on stderr). Step 0 observes nothing
// run: empty output, exit code 0. This is also the step's result in a
// recording (recordings/FORMAT.md).
type ShellObservation struct {
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	ExitCode        int     `json:"exit_code"`
	DurationMS      float64 `json:"duration_ms"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
}

// ShellAction is one action of a shell episode. Type selects it:
//
//	exec {command, timeout?, env?, cwd?}   timeout in seconds
//	write_file {path, content}             content is text
//	apply_patch {patch}                    a unified diff, git apply'd in the working directory
//	answer {text}, submit                  end the episode (submit with no answer)
type ShellAction struct {
	Type    string            `json:"type"`
	Command string            `json:"command,omitempty"`
	Timeout int               `json:"timeout,omitempty" openapi:"minimum=0" doc:"seconds; 0: 60, at most the step's budget"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	Path    string            `json:"path,omitempty"`
	Content string            `json:"content,omitempty"`
	Patch   string            `json:"patch,omitempty"`
	Text    string            `json:"text,omitempty"`
}
