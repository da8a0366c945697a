package client

import (
	"context"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// ServiceInfo is the banner of GET /.
type ServiceInfo struct {
	Service string `json:"service"`
	Version string `json:"version"`
	Status  string `json:"status"`
}

// Quantity is an amount of CPU (cores) and memory (bytes).
type Quantity struct {
	CPU         float64 `json:"cpu"`
	MemoryBytes int64   `json:"memory_bytes"`
}

// Node is one machine sandboxes run on.
type Node struct {
	Name        string   `json:"name"`
	Capacity    Quantity `json:"capacity"`
	Allocatable Quantity `json:"allocatable"`
}

// SandboxUsage is what one sandbox requests of its node.
type SandboxUsage struct {
	Name               string  `json:"name"`
	Namespace          string  `json:"namespace"`
	Phase              string  `json:"phase"`
	CPURequest         float64 `json:"cpu_request"`
	MemoryRequestBytes int64   `json:"memory_request_bytes"`
}

// Resources is the body of GET /resources (ORCHARD_COMPAT §3.3).
type Resources struct {
	Status           string         `json:"status"`
	Nodes            []Node         `json:"nodes"`
	TotalCapacity    Quantity       `json:"total_capacity"`
	TotalAllocatable Quantity       `json:"total_allocatable"`
	TotalRequested   Quantity       `json:"total_requested"`
	Available        Quantity       `json:"available"`
	SandboxPods      []SandboxUsage `json:"sandbox_pods"`
}

// ListOptions filters ListSandboxes. Empty fields do not filter.
type ListOptions struct {
	// Labels must all match. Keys and values must not contain commas.
	Labels map[string]string
	Kind   string // api.KindShell, api.KindBrowser, api.KindDesktop
	Status string // api.StatusReady, ...
}

// Root returns the service banner (GET /, no API key needed).
func (c *Client) Root(ctx context.Context) (ServiceInfo, error) {
	var out ServiceInfo
	err := c.do(ctx, call{method: http.MethodGet, path: "/", out: &out, idempotent: true})
	return out, err
}

// Health returns nil when the server answers GET /health as healthy.
func (c *Client) Health(ctx context.Context) error {
	var out struct {
		Status string `json:"status"`
	}
	if err := c.do(ctx, call{method: http.MethodGet, path: "/health", out: &out, idempotent: true}); err != nil {
		return err
	}
	if out.Status != "healthy" {
		return faults.Newf(faults.CodeUnreachable, faults.Unavailable, faults.Platform, "server reports status %q", out.Status)
	}
	return nil
}

// Resources returns the host's capacity and what sandboxes use of it.
func (c *Client) Resources(ctx context.Context) (Resources, error) {
	var out Resources
	err := c.do(ctx, call{method: http.MethodGet, path: "/resources", out: &out, idempotent: true})
	return out, err
}

// CreateSandbox asks for a sandbox. It returns as soon as the server has
// accepted the request (status pending); WaitSandbox waits for it to be
// ready. It is not retried: a retry could create a second sandbox.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandboxRequest) (api.CreateSandboxResponse, error) {
	var out api.CreateSandboxResponse
	err := c.do(ctx, call{method: http.MethodPost, path: "/sandboxes", body: req, out: &out})
	return out, err
}

// GetSandbox returns a sandbox's record.
func (c *Client) GetSandbox(ctx context.Context, id string) (api.Sandbox, error) {
	var out api.Sandbox
	err := c.do(ctx, call{method: http.MethodGet, path: sandboxPath(id), out: &out, idempotent: true})
	return out, err
}

// ListSandboxes returns the sandboxes that match opts.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) ([]api.Sandbox, error) {
	q := url.Values{}
	if len(opts.Labels) > 0 {
		pairs := make([]string, 0, len(opts.Labels))
		for _, k := range slices.Sorted(maps.Keys(opts.Labels)) {
			pairs = append(pairs, k+"="+opts.Labels[k])
		}
		q.Set("labels", strings.Join(pairs, ","))
	}
	if opts.Kind != "" {
		q.Set("kind", opts.Kind)
	}
	if opts.Status != "" {
		q.Set("status", opts.Status)
	}
	var out api.SandboxList
	err := c.do(ctx, call{method: http.MethodGet, path: "/sandboxes", query: q, out: &out, idempotent: true})
	return out.Sandboxes, err
}

// WaitSandbox blocks until the sandbox is ready, has failed or is gone, and
// returns its record; the caller checks Status (api.StatusReady,
// api.StatusFailed, api.StatusNotFound). timeout is rounded up to whole
// seconds; zero or less means the server's default (3600 s). When the
// sandbox is not ready in time the error has code sandbox.wait_timeout.
func (c *Client) WaitSandbox(ctx context.Context, id string, timeout time.Duration) (api.Sandbox, error) {
	q, poll := waitQuery(timeout, time.Hour)
	var out api.Sandbox
	err := c.do(ctx, call{method: http.MethodGet, path: sandboxPath(id) + "/wait", query: q, out: &out,
		idempotent: true, longPoll: poll})
	return out, err
}

// DeleteSandbox deletes a sandbox. Deleting an unknown sandbox succeeds.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	var out api.DeleteResponse
	return c.do(ctx, call{method: http.MethodDelete, path: sandboxPath(id), out: &out, idempotent: true})
}

// Heartbeat records that the sandbox is still in use, which opts it into
// heartbeat-based cleanup on the server.
func (c *Client) Heartbeat(ctx context.Context, id string) error {
	var out api.StatusOK
	return c.do(ctx, call{method: http.MethodPost, path: sandboxPath(id) + "/heartbeat", out: &out, idempotent: true})
}

func sandboxPath(id string) string { return "/sandboxes/" + url.PathEscape(id) }

// waitQuery is the timeout query of a wait endpoint and how long the server
// may block on it (def when the server's default applies).
func waitQuery(timeout, def time.Duration) (url.Values, time.Duration) {
	if timeout <= 0 {
		return nil, def
	}
	secs := int64(math.Ceil(timeout.Seconds()))
	return url.Values{"timeout": {strconv.FormatInt(secs, 10)}}, time.Duration(secs) * time.Second
}

// CreatePool defines a warm pool. A CreateSandbox whose request names it
// (Pool) or matches its spec is then served by a ready sandbox.
func (c *Client) CreatePool(ctx context.Context, req api.PoolRequest) (api.Pool, error) {
	var out api.Pool
	err := c.do(ctx, call{method: http.MethodPost, path: "/pools", body: req, out: &out})
	return out, err
}

// ListPools returns every warm pool with its counts.
func (c *Client) ListPools(ctx context.Context) ([]api.Pool, error) {
	var out api.PoolList
	err := c.do(ctx, call{method: http.MethodGet, path: "/pools", out: &out, idempotent: true})
	return out.Pools, err
}

// GetPool returns one warm pool with its counts.
func (c *Client) GetPool(ctx context.Context, name string) (api.Pool, error) {
	var out api.Pool
	err := c.do(ctx, call{method: http.MethodGet, path: "/pools/" + url.PathEscape(name), out: &out, idempotent: true})
	return out, err
}

// DeletePool deletes a warm pool and its unclaimed sandboxes (claimed
// ones stay) and returns how many it deleted.
func (c *Client) DeletePool(ctx context.Context, name string) (int, error) {
	var out api.DeletePoolResponse
	err := c.do(ctx, call{method: http.MethodDelete, path: "/pools/" + url.PathEscape(name), out: &out, idempotent: true})
	return out.Drained, err
}
