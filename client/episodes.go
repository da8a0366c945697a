package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/tasks"
)

// EpisodeRequest is the body of POST /episodes (API.md "Episodes"). Give
// TaskID (a loaded task, "id" or "suite/id") or Task (inline).
type EpisodeRequest struct {
	TaskID string      `json:"task_id,omitempty"`
	Task   *tasks.Task `json:"task,omitempty"`
	// Sandbox is a fragment of a POST /sandboxes body (browser, memory,
	// faults, block_network, egress) merged over the task's setup.sandbox.
	Sandbox json.RawMessage `json:"sandbox,omitempty"`
	// Observe chooses the parts of each observation; nil means the
	// server's default (a JPEG screenshot and the set-of-marks elements).
	Observe          map[string]any `json:"observe,omitempty"`
	MaxSteps         int            `json:"max_steps,omitempty"`
	StepTimeoutMS    int            `json:"step_timeout_ms,omitempty"`
	EpisodeTimeoutMS int            `json:"episode_timeout_ms,omitempty"`
	// Record is whether the episode is recorded; nil means yes.
	Record *bool `json:"record,omitempty"`
}

// StepInfo is the info of a step: its number, the classified error of its
// action, the fault a fault plan injected, and its time on the server.
type StepInfo struct {
	Step     int           `json:"step"`
	Error    *faults.Info  `json:"error,omitempty"`
	Injected *faults.Truth `json:"injected,omitempty"`
	StepMS   float64       `json:"step_ms"`
}

// Episode is the answer of POST /episodes: the first observation.
type Episode struct {
	EpisodeID   string          `json:"episode_id"`
	SandboxID   string          `json:"sandbox_id"`
	Observation json.RawMessage `json:"observation"`
	Done        bool            `json:"done"`
	Info        StepInfo        `json:"info"`
}

// StepResult is the answer of POST /episodes/{id}/step.
type StepResult struct {
	Observation json.RawMessage `json:"observation"`
	Done        bool            `json:"done"`
	Info        StepInfo        `json:"info"`
}

// Attribution names the fault that ended an episode env_error and the step
// it happened at.
type Attribution struct {
	faults.Info
	Step int `json:"step"`
}

// EpisodeResult is the answer of POST /episodes/{id}/finish.
type EpisodeResult struct {
	EpisodeID   string          `json:"episode_id"`
	Outcome     string          `json:"outcome"` // success, failure, env_error
	Reward      *float64        `json:"reward"`
	Evaluation  json.RawMessage `json:"evaluation,omitempty"`
	Attribution *Attribution    `json:"attribution"`
	Steps       int             `json:"steps"`
	Answer      string          `json:"answer"`
	RecordingID string          `json:"recording_id,omitempty"`
}

// EpisodeStatus is the answer of GET /episodes/{id}.
type EpisodeStatus struct {
	EpisodeID   string          `json:"episode_id"`
	SandboxID   string          `json:"sandbox_id"`
	TaskID      string          `json:"task_id"`
	Status      string          `json:"status"` // running, done, finished, aborted
	Steps       int             `json:"steps"`
	Outcome     string          `json:"outcome,omitempty"`
	Reward      *float64        `json:"reward,omitempty"`
	Answer      string          `json:"answer,omitempty"`
	Attribution *Attribution    `json:"attribution,omitempty"`
	Evaluation  json.RawMessage `json:"evaluation,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
	RecordingID string          `json:"recording_id,omitempty"`
}

// CreateEpisode starts an episode: a browser sandbox set up for the task
// and opened on its start URL. It is not retried: a retry could start a
// second episode.
func (c *Client) CreateEpisode(ctx context.Context, req EpisodeRequest) (Episode, error) {
	var out Episode
	err := c.do(ctx, call{method: http.MethodPost, path: "/episodes", body: req, out: &out})
	return out, err
}

// StepEpisode runs one action (a JSON action object) and returns the next
// observation. It is not retried: the action would run twice.
func (c *Client) StepEpisode(ctx context.Context, id string, action json.RawMessage) (StepResult, error) {
	var out StepResult
	err := c.do(ctx, call{method: http.MethodPost, path: episodePath(id) + "/step",
		body: map[string]json.RawMessage{"action": action}, out: &out})
	return out, err
}

// FinishEpisode evaluates the episode and releases its sandbox. answer,
// when not nil, replaces the answer an `answer` action gave. Finishing a
// finished episode returns its result again, so the call is retried.
func (c *Client) FinishEpisode(ctx context.Context, id string, answer *string) (EpisodeResult, error) {
	body := map[string]any{}
	if answer != nil {
		body["answer"] = *answer
	}
	var out EpisodeResult
	err := c.do(ctx, call{method: http.MethodPost, path: episodePath(id) + "/finish", body: body, out: &out, idempotent: true})
	return out, err
}

// GetEpisode returns an episode's status.
func (c *Client) GetEpisode(ctx context.Context, id string) (EpisodeStatus, error) {
	var out EpisodeStatus
	err := c.do(ctx, call{method: http.MethodGet, path: episodePath(id), out: &out, idempotent: true})
	return out, err
}

// DeleteEpisode aborts an episode and releases its sandbox; a finished
// episode stays finished.
func (c *Client) DeleteEpisode(ctx context.Context, id string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: episodePath(id), idempotent: true})
}

// LoadTasks loads a task file into the server as suite. name is the file's
// name: its extension picks the format (.jsonl, .json, .yaml). It returns
// the number of tasks loaded. Loading replaces a suite of the same name,
// so the call is retried.
func (c *Client) LoadTasks(ctx context.Context, suite, name string, data []byte) (int, error) {
	var out struct {
		Tasks int `json:"tasks"`
	}
	q := url.Values{"suite": {suite}}
	if name != "" {
		q.Set("name", name)
	}
	err := c.do(ctx, call{method: http.MethodPost, path: "/tasks", query: q, rawBody: data,
		contentType: "application/octet-stream", out: &out, idempotent: true})
	return out.Tasks, err
}

// ListTaskSuites returns the loaded suites and their sizes.
func (c *Client) ListTaskSuites(ctx context.Context) ([]tasks.SuiteInfo, error) {
	var out struct {
		Suites []tasks.SuiteInfo `json:"suites"`
	}
	err := c.do(ctx, call{method: http.MethodGet, path: "/tasks", out: &out, idempotent: true})
	return out.Suites, err
}

// SuiteTasks returns the tasks of a loaded suite; an unknown suite has none.
func (c *Client) SuiteTasks(ctx context.Context, suite string) ([]tasks.Task, error) {
	var out struct {
		Tasks []tasks.Task `json:"tasks"`
	}
	err := c.do(ctx, call{method: http.MethodGet, path: "/tasks/" + url.PathEscape(suite), out: &out, idempotent: true})
	return out.Tasks, err
}

// ExportRecording returns a recording exported in format: jsonl, parquet,
// gif, mp4 or html (a self-contained replay).
func (c *Client) ExportRecording(ctx context.Context, id, format string) ([]byte, error) {
	var out []byte
	err := c.do(ctx, call{method: http.MethodGet, path: "/recordings/" + url.PathEscape(id) + "/export",
		query: url.Values{"format": {format}}, rawOut: &out, idempotent: true})
	return out, err
}

func episodePath(id string) string { return "/episodes/" + url.PathEscape(id) }
