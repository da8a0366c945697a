package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/retry"
	"github.com/orchard/orchard/tasks"
)

// HTTPOptions tune a policy served at a URL. Zero fields take defaults.
type HTTPOptions struct {
	// Client sends the requests; nil means a client of its own.
	Client *http.Client
	// Timeout bounds one request: 2 minutes by default, room for a large
	// model to read a screenshot and answer on a loaded GPU.
	Timeout time.Duration
	// Attempts is how often a request is tried when the endpoint is
	// unreachable, times out or answers 5xx: 3 by default.
	Attempts int
	// Backoff caps the first pause between attempts (doubling after):
	// 500 ms by default, enough for a restarting server to come back.
	Backoff time.Duration
	// Header is added to every request (an Authorization, say).
	Header http.Header
}

// Defaults of HTTPOptions, each explained on its field.
const (
	defaultPolicyTimeout  = 2 * time.Minute
	defaultPolicyAttempts = 3
	defaultPolicyBackoff  = 500 * time.Millisecond
	// maxPolicyResponse bounds a policy's answer: an action is small.
	maxPolicyResponse = 1 << 20
)

// httpRequest is the body the runner posts to a policy endpoint.
type httpRequest struct {
	Task        tasks.Task      `json:"task"`
	Observation json.RawMessage `json:"observation"`
	Step        int             `json:"step"`
	MaxSteps    int             `json:"max_steps"`
	History     []Turn          `json:"history"`
}

// HTTP is a policy served at url: before each step it POSTs
// {"task", "observation", "step", "max_steps", "history"} as JSON and
// expects {"action": {...}} back; {"stop": true} or a null action ends the
// episode. An endpoint that cannot be reached, times out or answers 5xx is
// retried, then fails the episode with policy.endpoint_failed; an answer
// without an action fails it with policy.bad_response. Both are the
// policy's failures: the episode's outcome is error, never env_error, so
// it is not re-queued.
func HTTP(url string, opts HTTPOptions) Factory {
	if opts.Client == nil {
		opts.Client = &http.Client{}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = defaultPolicyTimeout
	}
	if opts.Attempts <= 0 {
		opts.Attempts = defaultPolicyAttempts
	}
	if opts.Backoff <= 0 {
		opts.Backoff = defaultPolicyBackoff
	}
	rp := retry.Policy{Attempts: opts.Attempts, PerAttempt: opts.Timeout, Initial: opts.Backoff}
	return func(tasks.Task, int) (Policy, error) {
		return PolicyFunc(func(ctx context.Context, in Input) (json.RawMessage, error) {
			body, err := json.Marshal(httpRequest{Task: in.Task, Observation: in.Observation, Step: in.Step, MaxSteps: in.MaxSteps, History: in.History})
			if err != nil {
				return nil, faults.Wrap(err, faults.CodePolicyFailed, faults.Internal, faults.Policy, "encode the policy request")
			}
			action, res, err := retry.DoValue(ctx, rp, func(ctx context.Context, _ int) (json.RawMessage, error) {
				return postPolicy(ctx, opts, url, body)
			})
			if errors.Is(err, ErrStop) {
				return nil, ErrStop
			}
			if err != nil && ctx.Err() == nil {
				f := faults.Of(err)
				return nil, faults.Wrap(err, f.Code, f.Category, f.Source,
					fmt.Sprintf("%s (%d %s)", f.Message, len(res.Attempts), plural(len(res.Attempts), "attempt")))
			}
			return action, err
		}), nil
	}
}

// postPolicy makes one request to a policy endpoint and classifies its
// failure: retryable endpoint_failed for what a retry may fix, bad_response
// for an answer that is not an action.
func postPolicy(ctx context.Context, opts HTTPOptions, url string, body []byte) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, faults.Wrap(err, faults.CodePolicyBadResponse, faults.InvalidRequest, faults.Policy, "policy URL "+url+" is invalid")
	}
	for k, v := range opts.Header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := opts.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, faults.Wrap(err, faults.CodePolicyEndpointFailed, faults.Timeout, faults.Policy,
				fmt.Sprintf("policy %s did not answer within %s", url, opts.Timeout)).WithRetryable(true)
		}
		return nil, faults.Wrap(err, faults.CodePolicyEndpointFailed, faults.Unavailable, faults.Policy,
			fmt.Sprintf("policy %s is unreachable", url))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxPolicyResponse+1))
	switch {
	case err != nil:
		return nil, faults.Wrap(err, faults.CodePolicyEndpointFailed, faults.Unavailable, faults.Policy,
			fmt.Sprintf("policy %s: the connection broke while it answered", url))
	case resp.StatusCode >= 500:
		return nil, faults.Newf(faults.CodePolicyEndpointFailed, faults.Unavailable, faults.Policy,
			"policy %s answered HTTP %d", url, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return nil, faults.Newf(faults.CodePolicyBadResponse, faults.InvalidRequest, faults.Policy,
			"policy %s answered HTTP %d: %s", url, resp.StatusCode, snippet(raw))
	case len(raw) > maxPolicyResponse:
		return nil, faults.Newf(faults.CodePolicyBadResponse, faults.InvalidRequest, faults.Policy,
			"policy %s answered more than %d bytes", url, maxPolicyResponse)
	}
	var out struct {
		Action json.RawMessage `json:"action"`
		Stop   bool            `json:"stop"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, faults.Wrap(err, faults.CodePolicyBadResponse, faults.InvalidRequest, faults.Policy,
			fmt.Sprintf("policy %s answered something other than JSON: %s", url, snippet(raw)))
	}
	if out.Stop || string(out.Action) == "null" {
		return nil, ErrStop
	}
	if len(out.Action) == 0 || out.Action[0] != '{' {
		return nil, faults.Newf(faults.CodePolicyBadResponse, faults.InvalidRequest, faults.Policy,
			"policy %s answered without an action object: %s", url, snippet(raw))
	}
	return out.Action, nil
}

// snippet is the start of a body, for messages.
func snippet(b []byte) string {
	const n = 200
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
