package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/tasks"
)

// CreateEpisode starts an episode: a browser sandbox set up for the task
// and opened on its start URL. It is not retried: a retry could start a
// second episode.
func (c *Client) CreateEpisode(ctx context.Context, req api.CreateEpisodeRequest) (api.EpisodeStart, error) {
	var out api.EpisodeStart
	err := c.do(ctx, call{method: http.MethodPost, path: "/episodes", body: req, out: &out})
	return out, err
}

// StepEpisode runs one action (a JSON action object) and returns the next
// observation. It is not retried: the action would run twice.
func (c *Client) StepEpisode(ctx context.Context, id string, action json.RawMessage) (api.StepResult, error) {
	var out api.StepResult
	err := c.do(ctx, call{method: http.MethodPost, path: episodePath(id) + "/step",
		body: api.StepRequest{Action: action}, out: &out})
	return out, err
}

// FinishEpisode evaluates the episode and releases its sandbox. answer,
// when not nil, replaces the answer an `answer` action gave. Finishing a
// finished episode returns its result again, so the call is retried.
func (c *Client) FinishEpisode(ctx context.Context, id string, answer *string) (api.EpisodeResult, error) {
	var out api.EpisodeResult
	err := c.do(ctx, call{method: http.MethodPost, path: episodePath(id) + "/finish", body: api.FinishEpisodeRequest{Answer: answer},
		out: &out, idempotent: true})
	return out, err
}

// GetEpisode returns an episode's status.
func (c *Client) GetEpisode(ctx context.Context, id string) (api.EpisodeStatus, error) {
	var out api.EpisodeStatus
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
