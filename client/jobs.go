package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// defaultExecTimeout is the server's command timeout when a request names
// none (ORCHARD_COMPAT §3.9).
const defaultExecTimeout = 300 * time.Second

// execWaitSlack is how much longer than the command's timeout a waiting
// exec may block on the server (ORCHARD_COMPAT §3.9: timeout + 30 s).
const execWaitSlack = 30 * time.Second

// jobWaitChunk is how long each server-side job wait blocks while Exec
// keeps waiting for a job that outlived the server's own wait. Short enough
// that a dropped connection is noticed, long enough to cost few requests.
const jobWaitChunk = 60 * time.Second

// Command returns cmd as the exec endpoint takes it, for ExecRequest.
func Command(cmd string) *api.Command {
	c := api.Command(cmd)
	return &c
}

// Exec runs a command in the sandbox as a job. With req.Wait it returns the
// finished job: when the server's own wait gives up first, Exec keeps
// waiting (GetJob's wait endpoint) until the job ends or ctx does. Without
// req.Wait it returns at once with only JobID and Status set.
//
// A command that exits non-zero is a job with Status api.JobFailed, not an
// error. Exec is never retried, so a command cannot run twice.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest) (api.Job, error) {
	if req.Command == nil {
		return api.Job{}, faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "exec: no command")
	}
	var poll time.Duration
	if req.Wait {
		poll = defaultExecTimeout
		if req.TimeoutSeconds != nil && *req.TimeoutSeconds > 0 {
			poll = api.Seconds(*req.TimeoutSeconds)
		}
		poll += execWaitSlack
	}
	var job api.Job
	err := c.do(ctx, call{method: http.MethodPost, path: sandboxPath(id) + "/exec", body: req, out: &job, longPoll: poll})
	if err != nil || !req.Wait {
		return job, err
	}
	for !job.Terminal() {
		if job.JobID == "" {
			return job, faults.New(faults.CodeBadResponse, faults.Internal, faults.Platform, "exec: response carries no job_id")
		}
		next, err := c.WaitJob(ctx, job.JobID, jobWaitChunk)
		if err != nil {
			return job, err
		}
		job = next
	}
	return job, nil
}

// ExecNoWait starts a command and returns its job id at once.
func (c *Client) ExecNoWait(ctx context.Context, id string, req api.ExecRequest) (string, error) {
	req.Wait = false
	job, err := c.Exec(ctx, id, req)
	if err == nil && job.JobID == "" {
		err = faults.New(faults.CodeBadResponse, faults.Internal, faults.Platform, "exec: response carries no job_id")
	}
	return job.JobID, err
}

// GetJob returns a job's current state, with the output so far while it
// runs.
func (c *Client) GetJob(ctx context.Context, jobID string) (api.Job, error) {
	var out api.Job
	err := c.do(ctx, call{method: http.MethodGet, path: jobPath(jobID), out: &out, idempotent: true})
	return out, err
}

// WaitJob blocks until the job ends or timeout passes, and returns its
// state either way: a job that is still running is not an error. timeout is
// rounded up to whole seconds; zero or less means the server's default
// (300 s).
func (c *Client) WaitJob(ctx context.Context, jobID string, timeout time.Duration) (api.Job, error) {
	q, poll := waitQuery(timeout, defaultExecTimeout)
	var out api.Job
	err := c.do(ctx, call{method: http.MethodGet, path: jobPath(jobID) + "/wait", query: q, out: &out,
		idempotent: true, longPoll: poll})
	return out, err
}

// CancelJob kills a job's command and returns the job once it has ended
// (failed, code job.canceled), or as it stands if its runner has not ended
// it within the server's bound. A finished job comes back unchanged, so
// the call is safe to repeat.
func (c *Client) CancelJob(ctx context.Context, jobID string) (api.Job, error) {
	var out api.Job
	err := c.do(ctx, call{method: http.MethodPost, path: jobPath(jobID) + "/cancel", out: &out, idempotent: true})
	return out, err
}

func jobPath(id string) string { return "/jobs/" + url.PathEscape(id) }
