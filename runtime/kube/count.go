package kube

import (
	"net/http"
	"strconv"
	"strings"
)

// CountRequests wraps a client transport so that observe sees every API
// call: its verb (get, list, watch, create, update, patch, delete), the
// resource and the answer's status (0 when none came). The server counts
// them in orchard_kube_api_requests_total: what the hot path costs the API
// server is visible in production, not only in a benchmark.
func CountRequests(rt http.RoundTripper, observe func(verb, resource string, code int)) http.RoundTripper {
	return countingRT{rt: rt, observe: observe}
}

type countingRT struct {
	rt      http.RoundTripper
	observe func(verb, resource string, code int)
}

func (c countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(r)
	code := 0
	if resp != nil {
		code = resp.StatusCode
	}
	verb, res := describeRequest(r)
	c.observe(verb, res, code)
	return resp, err
}

// describeRequest names an API request as Kubernetes's audit log does.
func describeRequest(r *http.Request) (verb, resource string) {
	// /api/v1/namespaces/NS/RES[/NAME[/SUB]] or /apis/G/V/namespaces/...,
	// or cluster-scoped /api/v1/RES[/NAME].
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		parts = nil
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	named := len(parts) >= 2
	if len(parts) > 0 {
		resource = parts[0]
		if len(parts) >= 3 {
			resource += "/" + parts[2]
		}
	} else {
		resource = "other"
	}
	switch r.Method {
	case http.MethodGet:
		switch {
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = strings.ToLower(r.Method)
	}
	return verb, resource
}

// StatusClass is code as a bounded label: "2xx", "4xx", ..., "error".
func StatusClass(code int) string {
	if code < 100 || code > 599 {
		return "error"
	}
	return strconv.Itoa(code/100) + "xx"
}
