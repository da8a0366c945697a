package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/metrics"
)

// scrape serves GET /metrics from m and parses the text format.
func scrape(t *testing.T, m *metrics.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("scrape: Content-Type %q", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("scrape: parse: %v", err)
	}
	return fams
}

// value returns the value of the series of name with exactly labels.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, lp := range m.GetLabel() {
			if labels[lp.GetName()] != lp.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// labelValues returns every value label takes in the series of name.
func labelValues(fams map[string]*dto.MetricFamily, name, label string) map[string]bool {
	out := map[string]bool{}
	for _, m := range fams[name].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				out[lp.GetValue()] = true
			}
		}
	}
	return out
}

func TestRouteLabelIsTheTemplate(t *testing.T) {
	gin.SetMode(gin.TestMode)
	m := metrics.New()
	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.Use(m.Middleware())
	ok := func(c *gin.Context) { c.JSON(200, gin.H{}) }
	e.POST("/sandboxes/:id/exec", ok)
	e.GET("/jobs/:job_id", ok)
	e.GET("/files/*path", ok)

	raw := []struct{ method, path string }{
		{"POST", "/sandboxes/rawid-aaa/exec"},
		{"POST", "/sandboxes/rawid-bbb/exec"},
		{"GET", "/jobs/rawid-ccc"},
		{"GET", "/files/rawid-ddd/deep/er"},
		{"GET", "/rawid-eee/not/a/route"},
		{"PUT", "/jobs/rawid-fff"},
		{"BREW", "/jobs/rawid-ggg"},
	}
	for _, r := range raw {
		e.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(r.method, r.path, nil))
	}
	fams := scrape(t, m)

	for _, name := range []string{"orchard_http_requests_total", "orchard_http_request_duration_seconds"} {
		routes := labelValues(fams, name, "route")
		for r := range routes {
			switch r {
			case "/sandboxes/:id/exec", "/jobs/:job_id", "/files/*path", metrics.Unmatched:
			default:
				t.Errorf("%s: route label %q is not a template", name, r)
			}
		}
		if len(routes) != 4 {
			t.Errorf("%s: routes %v, want the three templates and %q", name, routes, metrics.Unmatched)
		}
		for meth := range labelValues(fams, name, "method") {
			if meth == "BREW" {
				t.Errorf("%s: a client's method token became a label", name)
			}
		}
	}
	var text strings.Builder
	for _, f := range fams {
		_, _ = expfmt.MetricFamilyToText(&text, f)
	}
	if strings.Contains(text.String(), "rawid") {
		t.Errorf("a raw path reached the metrics:\n%s", grepLines(text.String(), "rawid"))
	}

	cases := []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"route": "/sandboxes/:id/exec", "method": "POST", "status": "200"}, 2},
		{map[string]string{"route": "/jobs/:job_id", "method": "GET", "status": "200"}, 1},
		{map[string]string{"route": "/files/*path", "method": "GET", "status": "200"}, 1},
		{map[string]string{"route": metrics.Unmatched, "method": "GET", "status": "404"}, 1},
		{map[string]string{"route": metrics.Unmatched, "method": "PUT", "status": "405"}, 1},
		{map[string]string{"route": metrics.Unmatched, "method": metrics.Other, "status": "405"}, 1},
	}
	for _, tc := range cases {
		if got, _ := value(fams, "orchard_http_requests_total", tc.labels); got != tc.want {
			t.Errorf("orchard_http_requests_total%v = %v, want %v", tc.labels, got, tc.want)
		}
	}
	if got, _ := value(fams, "orchard_http_request_duration_seconds", map[string]string{"route": "/sandboxes/:id/exec", "method": "POST"}); got != 2 {
		t.Errorf("duration observations for exec = %v, want 2", got)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestErrorsAttachedToTheRequestAreCounted(t *testing.T) {
	gin.SetMode(gin.TestMode)
	m := metrics.New()
	e := gin.New()
	e.Use(m.Middleware())
	e.GET("/sandboxes/:id", func(c *gin.Context) {
		f := faults.New(faults.CodeSandboxNotFound, faults.NotFound, faults.Client, "Sandbox x not found")
		_ = c.Error(f)
		c.AbortWithStatusJSON(404, faults.EnvelopeOf(f))
	})
	for range 3 {
		e.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/sandboxes/x", nil))
	}
	fams := scrape(t, m)
	lbl := map[string]string{"category": "not_found", "source": "client", "code": faults.CodeSandboxNotFound}
	if got, _ := value(fams, "orchard_errors_total", lbl); got != 3 {
		t.Errorf("orchard_errors_total%v = %v, want 3", lbl, got)
	}
}

func TestLabelsAreBounded(t *testing.T) {
	m := metrics.New()
	// Values no enum or code has: raw paths, ids, free text, odd bytes.
	for _, bad := range []string{"/sandboxes/abc123", "Sandbox abc123 not found", "UPPER", "", "a b", "\xff", strings.Repeat("a", 65)} {
		m.ObserveError(bad, bad, bad)
		m.ObserveRetry(bad)
	}
	// A flood of distinct well-formed codes (say, decoded from a peer).
	for i := range 2000 {
		m.ObserveError("internal", "platform", fmt.Sprintf("site.http_%d", i))
		m.ObserveRetry(fmt.Sprintf("layer_%d", i))
	}
	m.ObserveRetry(metrics.RetryNavigation) // the cap is first come first served
	fams := scrape(t, m)

	codes := labelValues(fams, "orchard_errors_total", "code")
	if n := len(codes); n > 513 {
		t.Errorf("%d distinct codes, want the bound (512) plus %q", n, metrics.Other)
	}
	for _, lbl := range []string{"category", "source", "code"} {
		for v := range labelValues(fams, "orchard_errors_total", lbl) {
			if strings.ContainsAny(v, "/ ABCDEFGHIJKLMNOPQRSTUVWXYZ") || v == "" || len(v) > 64 {
				t.Errorf("%s label %q escaped the bound", lbl, v)
			}
		}
	}
	if got, _ := value(fams, "orchard_errors_total", map[string]string{"category": metrics.Other, "source": metrics.Other, "code": metrics.Other}); got != 7 {
		t.Errorf("malformed errors under %q = %v, want 7", metrics.Other, got)
	}
	if n := len(labelValues(fams, "orchard_retries_total", "layer")); n > 33 {
		t.Errorf("%d distinct retry layers, want at most 33", n)
	}
	if got, _ := value(fams, "orchard_retries_total", map[string]string{"layer": metrics.Other}); got < 7 {
		t.Errorf("retries under %q = %v, want the malformed and the excess ones", metrics.Other, got)
	}
}

func TestSandboxGauge(t *testing.T) {
	m := metrics.New()
	if _, ok := scrape(t, m)["orchard_sandboxes"]; ok {
		t.Error("orchard_sandboxes reported before a source was set")
	}
	m.SetSandboxSource(func(context.Context) (map[metrics.SandboxKey]int, error) {
		return map[metrics.SandboxKey]int{
			{Kind: "shell", Status: "ready"}:             2,
			{Kind: "browser", Status: "pending"}:         1,
			{Kind: "/sandboxes/abc", Status: "ready"}:    1,
			{Kind: "Evil Kind", Status: "ready"}:         1,
			{Kind: "shell", Status: "status from a bug"}: 4,
		}, nil
	})
	fams := scrape(t, m)
	cases := []struct {
		kind, status string
		want         float64
	}{
		{"shell", "ready", 2},
		{"browser", "pending", 1},
		{"desktop", "failed", 0}, // known combinations are always present
		{metrics.Other, "ready", 2},
		{"shell", metrics.Other, 4},
	}
	for _, tc := range cases {
		got, ok := value(fams, "orchard_sandboxes", map[string]string{"kind": tc.kind, "status": tc.status})
		if !ok || got != tc.want {
			t.Errorf("orchard_sandboxes{kind=%q,status=%q} = %v (present %v), want %v", tc.kind, tc.status, got, ok, tc.want)
		}
	}

	// A failing source costs its own series, not the scrape.
	m.SetSandboxSource(func(context.Context) (map[metrics.SandboxKey]int, error) {
		return nil, errors.New("store down")
	})
	m.ObserveRetry(metrics.RetryCreate)
	fams = scrape(t, m)
	if _, ok := fams["orchard_sandboxes"]; ok {
		t.Error("orchard_sandboxes reported although its source failed")
	}
	if got, _ := value(fams, "orchard_retries_total", map[string]string{"layer": metrics.RetryCreate}); got != 1 {
		t.Errorf("orchard_retries_total{layer=create} = %v, want 1", got)
	}
}

func TestBreakerGauge(t *testing.T) {
	m := metrics.New()
	m.SetBreakerSource(func(context.Context) map[string]int {
		return map[string]int{metrics.BreakerOpen: 2, metrics.BreakerHalfOpen: 1, "example.com": 5}
	})
	fams := scrape(t, m)
	for state, want := range map[string]float64{metrics.BreakerClosed: 0, metrics.BreakerOpen: 2, metrics.BreakerHalfOpen: 1, metrics.Other: 5} {
		if got, ok := value(fams, "orchard_breaker_state", map[string]string{"state": state}); !ok || got != want {
			t.Errorf("orchard_breaker_state{state=%q} = %v (present %v), want %v", state, got, ok, want)
		}
	}
}

func TestRegistriesAreIndependent(t *testing.T) {
	a, b := metrics.New(), metrics.New()
	a.ObserveRetry(metrics.RetryAgent)
	if _, ok := value(scrape(t, b), "orchard_retries_total", map[string]string{"layer": metrics.RetryAgent}); ok {
		t.Error("a retry counted on one Metrics shows on another")
	}
	fams := scrape(t, a)
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s missing: the Go and process collectors are not registered", name)
		}
	}
}
