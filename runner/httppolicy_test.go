package runner

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/tasks"
)

// A policy endpoint's failures are the policy's, classified: what a retry
// may fix is retried and then policy.endpoint_failed, an answer that is not
// an action is policy.bad_response at once; stop ends the episode.
func TestHTTPPolicyFailures(t *testing.T) {
	t.Parallel()
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close()
	cases := []struct {
		name     string
		handler  http.HandlerFunc // nil: the endpoint is down
		code     string
		category faults.Category
		requests int32
		stop     bool
	}{
		{"5xx is retried", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", 502) },
			faults.CodePolicyEndpointFailed, faults.Unavailable, 3, false},
		{"down", nil, faults.CodePolicyEndpointFailed, faults.Unavailable, 0, false},
		{"slow", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(time.Second): // longer than the policy timeout
			}
		}, faults.CodePolicyEndpointFailed, faults.Timeout, 3, false},
		{"4xx is not retried", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", 400) },
			faults.CodePolicyBadResponse, faults.InvalidRequest, 1, false},
		{"not JSON", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>")) },
			faults.CodePolicyBadResponse, faults.InvalidRequest, 1, false},
		{"no action", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"thought":"hm"}`)) },
			faults.CodePolicyBadResponse, faults.InvalidRequest, 1, false},
		{"stop", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"stop":true}`)) }, "", "", 1, true},
		{"null action", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"action":null}`)) }, "", "", 1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var n atomic.Int32
			url := downURL
			if c.handler != nil {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n.Add(1)
					c.handler(w, r)
				}))
				defer srv.Close()
				url = srv.URL
			}
			pol, err := HTTP(url, HTTPOptions{Timeout: 200 * time.Millisecond, Backoff: 10 * time.Millisecond})(tasks.Task{ID: "t"}, 1)
			if err != nil {
				t.Fatal(err)
			}
			_, err = pol.Next(context.Background(), Input{Task: tasks.Task{ID: "t"}, Step: 1, MaxSteps: 5, Observation: json.RawMessage(`{}`)})
			if c.stop {
				if !errors.Is(err, ErrStop) {
					t.Fatalf("err = %v, want ErrStop", err)
				}
			} else {
				f := faults.Of(err)
				if f == nil || f.Code != c.code || f.Category != c.category || f.Source != faults.Policy {
					t.Fatalf("err = %#v, want %s/%s from the policy", f, c.code, c.category)
				}
				if envError(f) {
					t.Errorf("%s counts as env_error", f.Code)
				}
			}
			if got := n.Load(); got != c.requests {
				t.Errorf("%d requests, want %d", got, c.requests)
			}
		})
	}
}
