package server_test

import (
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// scrapeMetrics fetches GET /metrics without an API key and parses the
// text format.
func scrapeMetrics(t *testing.T, srv *testserver.Server) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	res, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics without a key: status %d", res.StatusCode)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET /metrics: Content-Type %q, want the text format", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("GET /metrics: parse: %v", err)
	}
	var text strings.Builder
	for _, f := range fams {
		_, _ = expfmt.MetricFamilyToText(&text, f)
	}
	return fams, text.String()
}

// metricValue returns the value of the series of name with exactly labels.
func metricValue(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
next:
	for _, m := range fams[name].GetMetric() {
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
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// errorLabels are the orchard_errors_total labels of an error response,
// read from the envelope the client got.
func errorLabels(t *testing.T, r resp) map[string]string {
	t.Helper()
	info, _ := r.body["error"].(map[string]any)
	if info == nil {
		t.Fatalf("no error object in %s", r.raw)
	}
	return map[string]string{"category": info["category"].(string), "source": info["source"].(string), "code": info["code"].(string)}
}

func TestMetrics(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	fams, _ := scrapeMetrics(t, srv)
	if metricValue(fams, "orchard_sandboxes", map[string]string{"kind": "shell", "status": "ready"}) != 0 {
		t.Fatal("a fresh server reports a ready sandbox")
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("Go runtime metrics missing")
	}

	notFound := call(t, srv, "GET", "/sandboxes/metricsnosuch", nil)
	want(t, notFound, 404)
	invalid := call(t, srv, "POST", "/sandboxes", map[string]any{})
	want(t, invalid, 422)
	noRoute := call(t, srv, "GET", "/metricsnosuch/route", nil)
	want(t, noRoute, 404)
	id := createReady(t, srv, map[string]any{"sandbox_id": "metricsbox"})

	fams, text := scrapeMetrics(t, srv)
	requests := []struct {
		route, method, status string
		want                  float64
	}{
		{"/sandboxes/:id", "GET", "404", 1},
		{"/sandboxes", "POST", "422", 1},
		{"/sandboxes", "POST", "200", 1},
		{"/sandboxes/:id/wait", "GET", "200", 1},
		{"unmatched", "GET", "404", 1},
		{"/metrics", "GET", "200", 1}, // the first scrape
	}
	for _, tc := range requests {
		l := map[string]string{"route": tc.route, "method": tc.method, "status": tc.status}
		if got := metricValue(fams, "orchard_http_requests_total", l); got != tc.want {
			t.Errorf("orchard_http_requests_total%v = %v, want %v", l, got, tc.want)
		}
	}
	errs := []struct {
		r    resp
		code string
	}{
		{notFound, faults.CodeSandboxNotFound},
		{invalid, faults.CodeValidation},
		{noRoute, faults.CodeRouteNotFound},
	}
	for _, tc := range errs {
		l := errorLabels(t, tc.r)
		if l["code"] != tc.code {
			t.Errorf("error code %q, want %q", l["code"], tc.code)
		}
		if got := metricValue(fams, "orchard_errors_total", l); got != 1 {
			t.Errorf("orchard_errors_total%v = %v, want 1", l, got)
		}
	}
	if got := metricValue(fams, "orchard_sandboxes", map[string]string{"kind": "shell", "status": "ready"}); got != 1 {
		t.Errorf("orchard_sandboxes{kind=shell,status=ready} = %v after creating one sandbox, want 1", got)
	}
	for _, raw := range []string{id, "metricsnosuch"} {
		if strings.Contains(text, raw) {
			t.Errorf("%q reached a metric label", raw)
		}
	}

	// /metrics is in the route table, so the OpenAPI document shows it public.
	doc := call(t, srv, "GET", "/openapi.json", nil, "")
	get, _ := doc.body["paths"].(map[string]any)["/metrics"].(map[string]any)["get"].(map[string]any)
	if get == nil {
		t.Fatal("GET /metrics missing from the OpenAPI document")
	}
	if _, ok := get["security"]; ok {
		t.Error("OpenAPI asks for an API key on GET /metrics")
	}
	content, _ := get["responses"].(map[string]any)["200"].(map[string]any)["content"].(map[string]any)
	if _, ok := content["text/plain"]; !ok {
		t.Errorf("OpenAPI 200 of GET /metrics: content %v, want text/plain", content)
	}
}
