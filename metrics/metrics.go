// Package metrics is the server's Prometheus instrumentation: one registry
// per server (no package-level state), HTTP requests by route template,
// rendered errors by class, retries by layer, circuit breakers by state and
// sandboxes by kind and status. Every label is bounded: values come from
// closed sets or route templates, and whatever falls outside becomes
// "other", so no caller can grow the number of series without bound.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// Label values that stand in for values the metrics do not admit.
const (
	// Unmatched is the route label of requests no route matched (404, 405).
	Unmatched = "unmatched"
	// Other replaces a label value outside its label's bounds.
	Other = "other"
)

// Retry layers for ObserveRetry.
const (
	RetryNavigation = "navigation"
	RetryCreate     = "create"
	RetryAgent      = "agent"
)

// Breaker states reported by a breaker source.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerHalfOpen = "half_open"
)

// Bounds on the distinct values of each label. They are far above what the
// code produces (about 30 routes, 13 categories, 9 sources, under 150
// codes) and only cut in when something unexpected feeds a label.
const (
	maxRoutes     = 256
	maxCategories = 32
	maxSources    = 32
	maxCodes      = 512
	maxLayers     = 32
	maxKinds      = 16
	maxStatuses   = 32
)

// scrapeTimeout bounds the sources called at scrape time (a store listing
// sandboxes): below Prometheus's default 10 s scrape timeout, so a slow
// store costs one series, not the whole scrape.
const scrapeTimeout = 5 * time.Second

// durationBuckets cover quick API calls and the long waits (sandbox and job
// waits, exec with wait) that are normal here; WebSocket sessions land in
// +Inf.
var durationBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// SandboxKey identifies one orchard_sandboxes series.
type SandboxKey struct{ Kind, Status string }

// Metrics holds one server's registry and its metrics. Its methods are safe
// for concurrent use.
type Metrics struct {
	reg     *prometheus.Registry
	handler http.Handler

	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	retries  *prometheus.CounterVec
	kubeAPI  *prometheus.CounterVec
	pools    *prometheus.CounterVec
	breaker  *gaugeFunc
	sandbox  *gaugeFunc

	route, category, source, code, layer *label
	kubeVerb, kubeResource               *label
	pool                                 *label
}

// New returns metrics registered on a fresh registry together with the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchard_http_requests_total",
			Help: "HTTP requests by route template, method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "orchard_http_request_duration_seconds",
			Help:    "HTTP request duration by route template and method.",
			Buckets: durationBuckets,
		}, []string{"route", "method"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchard_errors_total",
			Help: "Errors rendered as HTTP responses, by category, source and code.",
		}, []string{"category", "source", "code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchard_retries_total",
			Help: "Retried attempts by layer.",
		}, []string{"layer"}),
		kubeAPI: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchard_kube_api_requests_total",
			Help: "Calls of the Kubernetes runtime to the API server, by verb, resource and status class (the informer's list and watch included).",
		}, []string{"verb", "resource", "status"}),
		pools: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchard_pool_claims_total",
			Help: "Creates that named or matched a warm pool, by pool and result: claim (a ready sandbox handed over) or miss (the pool was empty; a cold create).",
		}, []string{"pool", "result"}),
		breaker: newGaugeFunc("orchard_breaker_state", "Hosts per circuit-breaker state.",
			[]*label{newLabel("state", len(breakerStates), isIdent)}, seeds1(breakerStates)),
		sandbox: newGaugeFunc("orchard_sandboxes", "Sandboxes by kind and status.",
			[]*label{newLabel("kind", maxKinds, isIdent), newLabel("status", maxStatuses, isIdent)},
			seeds2(sandboxKinds, sandboxStatuses)),
		route:    newLabel("route", maxRoutes, isRoute),
		category: newLabel("category", maxCategories, isIdent),
		source:   newLabel("source", maxSources, isIdent),
		code:     newLabel("code", maxCodes, isIdent),
		layer:    newLabel("layer", maxLayers, isIdent),
		kubeVerb: newLabel("verb", 16, isIdent),
		// Pool names are DNS-1123 labels the operator chose: few, and
		// bounded here all the same.
		pool: newLabel("pool", maxPools, func(v string) bool {
			return isIdent(strings.ReplaceAll(v, "-", "_"))
		}),
		kubeResource: newLabel("resource", 32, func(v string) bool {
			return isIdent(strings.ReplaceAll(v, "/", "."))
		}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.requests, m.duration, m.errors, m.retries, m.kubeAPI, m.pools, m.breaker, m.sandbox,
	)
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		// A failing source (the store) drops its own series; the rest
		// is still served, and promhttp_metric_handler_errors_total says so.
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      m.reg,
	})
	return m
}

var (
	breakerStates   = []string{BreakerClosed, BreakerOpen, BreakerHalfOpen}
	sandboxKinds    = []string{api.KindShell, api.KindBrowser, api.KindDesktop}
	sandboxStatuses = []string{api.StatusPending, api.StatusReady, api.StatusUnschedulable, api.StatusFailed, api.StatusNotFound}
)

// Registry returns the registry, for tests and for collectors of other
// parts of the server.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler { return m.handler }

// Middleware records every request under its route template (gin's
// FullPath, never the raw path; Unmatched when no route matched) and
// counts the errors the handlers attached with c.Error.
func (m *Metrics) Middleware() gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		// Deferred: a response broken off on purpose (http.ErrAbortHandler,
		// re-panicked past the recovery for net/http to drop the
		// connection) is a request too.
		defer func() {
			status := c.Writer.Status()
			if status == http.StatusOK && c.IsWebsocket() {
				// A hijacked upgrade never writes through gin.
				status = http.StatusSwitchingProtocols
			}
			m.observeRequest(c.FullPath(), c.Request.Method, status, time.Since(start))
			for _, e := range c.Errors {
				f := faults.Of(e.Err)
				m.ObserveError(string(f.Category), string(f.Source), f.Code)
			}
		}()
		c.Next()
	}
}

func (m *Metrics) observeRequest(route, method string, status int, d time.Duration) {
	if route == "" {
		route = Unmatched
	} else {
		route = m.route.value(route)
	}
	method = boundMethod(method)
	m.requests.WithLabelValues(route, method, boundStatus(status)).Inc()
	m.duration.WithLabelValues(route, method).Observe(d.Seconds())
}

// ObserveError counts one error response.
func (m *Metrics) ObserveError(category, source, code string) {
	m.errors.WithLabelValues(m.category.value(category), m.source.value(source), m.code.value(code)).Inc()
}

// ObserveKubeAPI counts one call of the Kubernetes runtime to the API
// server; status is a class ("2xx", "4xx", "error").
func (m *Metrics) ObserveKubeAPI(verb, resource, status string) {
	m.kubeAPI.WithLabelValues(m.kubeVerb.value(verb), m.kubeResource.value(resource), boundClass(status)).Inc()
}

func boundClass(s string) string {
	switch s {
	case "1xx", "2xx", "3xx", "4xx", "5xx":
		return s
	}
	return "error"
}

// maxPools bounds the pool label's values (orchard_pool_claims_total).
const maxPools = 64

// Results of a pool claim (ObservePoolClaim).
const (
	PoolClaim = "claim"
	PoolMiss  = "miss"
)

// ObservePoolClaim counts a create that went to pool: PoolClaim when it
// got a ready sandbox, PoolMiss when the pool was empty.
func (m *Metrics) ObservePoolClaim(pool, result string) {
	m.pools.WithLabelValues(m.pool.value(pool), result).Inc()
}

// ObserveRetry counts one retried attempt in layer (RetryNavigation,
// RetryCreate, RetryAgent, ...).
func (m *Metrics) ObserveRetry(layer string) {
	m.retries.WithLabelValues(m.layer.value(layer)).Inc()
}

// SetBreakerSource sets what orchard_breaker_state reports at each scrape:
// the number of hosts in each breaker state (BreakerClosed, BreakerOpen,
// BreakerHalfOpen). Until it is set the metric has no series.
func (m *Metrics) SetBreakerSource(src func(ctx context.Context) map[string]int) {
	if src == nil {
		m.breaker.set(nil)
		return
	}
	m.breaker.set(func(ctx context.Context) (map[[2]string]int, error) {
		out := map[[2]string]int{}
		for state, n := range src(ctx) {
			out[[2]string{state}] += n
		}
		return out, nil
	})
}

// SetSandboxSource sets what orchard_sandboxes reports at each scrape: the
// number of sandboxes per kind and status. An error drops the series from
// that scrape. Until it is set the metric has no series.
func (m *Metrics) SetSandboxSource(src func(ctx context.Context) (map[SandboxKey]int, error)) {
	if src == nil {
		m.sandbox.set(nil)
		return
	}
	m.sandbox.set(func(ctx context.Context) (map[[2]string]int, error) {
		counts, err := src(ctx)
		if err != nil {
			return nil, err
		}
		out := make(map[[2]string]int, len(counts))
		for k, n := range counts {
			out[[2]string{k.Kind, k.Status}] += n
		}
		return out, nil
	})
}

// boundMethod keeps the standard methods; clients may send any token.
func boundMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return Other
}

func boundStatus(s int) string {
	if s < 100 || s > 599 {
		return Other
	}
	return strconv.Itoa(s)
}
