// Package client is a Go client for Orchard's REST API: sandboxes, jobs,
// files, patches and interactive PTY sessions. It speaks the Orchard Env
// wire contract (ORCHARD_COMPAT.md), so it works against Orchard Env's own
// server as well as against Orchard.
//
// Every failure is a *faults.Error: error bodies decode into the server's
// classification, bodies without one are classified from the HTTP status,
// and a server that cannot be reached is unavailable, source platform, code
// platform.unreachable, retryable. Idempotent calls (GET, DELETE, heartbeat)
// are retried on retryable failures under a RetryPolicy; calls that start
// work (create, exec, upload, apply_patch) are never retried, so a command
// cannot run twice because of the client.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/orchard/orchard/faults"
)

// DefaultUserAgent is the User-Agent header sent unless WithUserAgent
// changes it.
const DefaultUserAgent = "orchard-go-client"

// DefaultMaxResponseBytes bounds a response body. Downloads arrive whole,
// base64 inside JSON (ORCHARD_COMPAT §3.15), so the bound must fit the
// largest file a caller downloads; 1 GiB of JSON is a 768 MiB file.
const DefaultMaxResponseBytes = 1 << 30

// maxErrorBytes bounds an error body: error envelopes are small, and a
// proxy's HTML error page need not be read whole.
const maxErrorBytes = 1 << 20

// Client calls one Orchard server. It is safe for concurrent use.
type Client struct {
	base     string // scheme://host[/prefix], no trailing slash
	key      string
	http     *http.Client
	retry    RetryPolicy
	ua       string
	maxBytes int64
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send its requests through hc (for
// transports, proxies or TLS settings). A Timeout on hc bounds every
// attempt, long polls included; prefer RetryPolicy.AttemptTimeout.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.http = hc
		}
	}
}

// WithRetryPolicy replaces DefaultRetryPolicy.
func WithRetryPolicy(p RetryPolicy) Option { return func(c *Client) { c.retry = p } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.ua = ua } }

// WithMaxResponseBytes bounds response bodies (DefaultMaxResponseBytes
// unless set); a larger body fails with code client.response_too_large.
func WithMaxResponseBytes(n int64) Option {
	return func(c *Client) {
		if n > 0 {
			c.maxBytes = n
		}
	}
}

// New returns a client for the server at baseURL (for example
// "http://127.0.0.1:8000"; a path prefix is kept). apiKey may be empty for
// a server that does not require one.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		base:     strings.TrimRight(baseURL, "/"),
		key:      apiKey,
		http:     &http.Client{Transport: http.DefaultTransport},
		retry:    DefaultRetryPolicy(),
		ua:       DefaultUserAgent,
		maxBytes: DefaultMaxResponseBytes,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// BaseURL returns the server URL the client talks to, without a trailing
// slash.
func (c *Client) BaseURL() string { return c.base }

// RetryPolicy says how idempotent calls are retried. Only failures that
// faults classifies as retryable are retried, and only for calls that are
// safe to repeat.
type RetryPolicy struct {
	// Attempts is the total number of attempts, the first included; 1 or
	// less disables retries.
	Attempts int
	// BaseDelay is the backoff before the second attempt; it doubles for
	// each further attempt and is jittered down by up to half.
	BaseDelay time.Duration
	// MaxDelay caps one backoff. A server that asks, with Retry-After, for
	// a longer pause than this is not retried: the call fails at once
	// rather than retry sooner than the server asked.
	MaxDelay time.Duration
	// AttemptTimeout bounds one attempt, on top of the time a long poll
	// (wait, exec with wait) is asked to block on the server. Zero means
	// no bound beyond the caller's context.
	AttemptTimeout time.Duration
}

// DefaultRetryPolicy returns the policy clients use unless told otherwise:
// three attempts, as Orchard Env's SDK makes, with 0.5 s then 1 s of
// backoff. Retry-After up to 10 s is honoured, which covers the server's
// own 5 s. An attempt may take 5 minutes beyond its long poll: room for a
// large upload on a slow link, while a hung connection still ends.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{Attempts: 3, BaseDelay: 500 * time.Millisecond, MaxDelay: 10 * time.Second, AttemptTimeout: 5 * time.Minute}
}

// backoff is the pause before attempt n+1 (n ≥ 1) given the server's
// Retry-After (zero when absent); ok is false when the policy forbids the
// pause the server asked for.
func (p RetryPolicy) backoff(n int, retryAfter time.Duration) (d time.Duration, ok bool) {
	d = p.BaseDelay << (n - 1)
	if d <= 0 || (p.BaseDelay > 0 && d < p.BaseDelay) { // overflow
		d = p.MaxDelay
	}
	if p.MaxDelay > 0 && d > p.MaxDelay {
		d = p.MaxDelay
	}
	if d > 0 {
		d -= rand.N(d/2 + 1)
	}
	if retryAfter > 0 {
		if p.MaxDelay > 0 && retryAfter > p.MaxDelay {
			return 0, false
		}
		d = max(d, retryAfter)
	}
	return d, true
}

// call is one API request.
type call struct {
	method, path string
	query        url.Values
	body         any // JSON-encoded when not nil
	out          any // JSON-decoded from a 2xx body when not nil
	// rawBody is sent as is, with contentType, when body is nil.
	rawBody     []byte
	contentType string
	// rawOut receives a 2xx body undecoded (exports, images).
	rawOut *[]byte
	// stream receives a 2xx body as it arrives, with no size bound (a
	// dataset's tar). Only for calls that are not idempotent: a retry
	// after part of a body was copied would copy it again.
	stream io.Writer
	// header receives a 2xx response's headers (an image's frame and scale).
	header *http.Header
	// idempotent calls are retried on retryable failures.
	idempotent bool
	// longPoll is how long the server may block before answering: added
	// to the attempt timeout. A long poll that times out on the server is
	// the caller's budget running out, so it is not retried.
	longPoll time.Duration
}

// do runs c under the retry policy.
func (c *Client) do(ctx context.Context, cl call) error {
	var body []byte
	if cl.body != nil {
		b, err := json.Marshal(cl.body)
		if err != nil {
			return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "encode request body")
		}
		body = b
	} else if cl.rawBody != nil {
		body = cl.rawBody
	}
	rid := requestID()
	attempts := max(c.retry.Attempts, 1)
	if !cl.idempotent {
		attempts = 1
	}
	for n := 1; ; n++ {
		retryAfter, err := c.attempt(ctx, cl, body, rid)
		if err == nil {
			return nil
		}
		f := faults.Of(err)
		if n >= attempts || !f.Retryable || ctx.Err() != nil || (cl.longPoll > 0 && f.Category == faults.Timeout && f.Status != 0) {
			return err
		}
		d, ok := c.retry.backoff(n, retryAfter)
		if !ok {
			return err
		}
		if dl, has := ctx.Deadline(); has && time.Until(dl) < d {
			return err // the pause would outlast the caller's budget
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// attempt sends one request. It returns the server's Retry-After with a
// failure, when the server gave one.
func (c *Client) attempt(ctx context.Context, cl call, body []byte, rid string) (time.Duration, error) {
	actx := ctx
	if c.retry.AttemptTimeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeoutCause(ctx, c.retry.AttemptTimeout+cl.longPoll, errAttemptTimeout)
		defer cancel()
	}
	u := c.base + cl.path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, cl.method, u, rd)
	if err != nil {
		return 0, faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client,
			fmt.Sprintf("invalid server URL %q", c.base))
	}
	if body != nil {
		ct := "application/json"
		if cl.body == nil && cl.contentType != "" {
			ct = cl.contentType
		}
		req.Header.Set("Content-Type", ct)
	}
	if cl.rawOut == nil && cl.stream == nil {
		req.Header.Set("Accept", "application/json")
	}
	req.Header.Set("User-Agent", c.ua)
	req.Header.Set("X-Request-ID", rid)
	if c.key != "" {
		req.Header.Set("X-API-Key", c.key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, c.transportError(ctx, actx, cl, err)
	}
	defer resp.Body.Close()
	ok := resp.StatusCode >= 200 && resp.StatusCode < 300
	if ok && cl.stream != nil {
		if _, err := io.Copy(cl.stream, resp.Body); err != nil {
			return 0, c.transportError(ctx, actx, cl, err)
		}
		return 0, nil
	}
	limit := c.maxBytes
	if !ok {
		limit = maxErrorBytes
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return 0, c.transportError(ctx, actx, cl, err)
	}
	if !ok {
		return retryAfter(resp.Header.Get("Retry-After")), decodeError(resp.StatusCode, data)
	}
	if int64(len(data)) > limit {
		return 0, faults.Newf(faults.CodeResponseTooLarge, faults.TooLarge, faults.Client,
			"%s %s: response exceeds %d bytes", cl.method, cl.path, limit)
	}
	if cl.header != nil {
		*cl.header = resp.Header
	}
	if cl.rawOut != nil {
		*cl.rawOut = data
		return 0, nil
	}
	if cl.out == nil {
		return 0, nil
	}
	if err := json.Unmarshal(data, cl.out); err != nil {
		return 0, faults.Wrap(err, faults.CodeBadResponse, faults.Internal, faults.Platform,
			fmt.Sprintf("%s %s: undecodable response (HTTP %d, %s)", cl.method, cl.path, resp.StatusCode, snippet(data)))
	}
	return 0, nil
}

// errAttemptTimeout is the cause of an attempt cut by AttemptTimeout.
var errAttemptTimeout = errors.New("attempt timeout")

// transportError classifies a failure to get a response: the caller's
// context ending, the attempt's own timeout, or the server being
// unreachable.
func (c *Client) transportError(ctx, actx context.Context, cl call, err error) error {
	if ctx.Err() != nil {
		f := faults.Of(context.Cause(ctx))
		return faults.Wrap(err, f.Code, f.Category, f.Source, fmt.Sprintf("%s %s: %s", cl.method, cl.path, f.Message))
	}
	if errors.Is(context.Cause(actx), errAttemptTimeout) {
		return faults.Wrap(err, faults.CodeTimeout, faults.Timeout, faults.Platform,
			fmt.Sprintf("%s %s: no response within %s", cl.method, cl.path, c.retry.AttemptTimeout+cl.longPoll))
	}
	return unreachable(c.base, err)
}

// Ptr returns a pointer to v, for the optional fields of the api types.
func Ptr[T any](v T) *T { return &v }

// requestID is a fresh X-Request-ID, shared by the attempts of one call so
// that server logs tie retries together.
func requestID() string {
	return fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
}
