package metrics

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// label admits the values of one label: values its check accepts, at most
// max distinct ones, first come first served. Anything else is Other.
type label struct {
	name  string
	max   int
	check func(string) bool

	mu   sync.Mutex // guards seen
	seen map[string]struct{}
}

func newLabel(name string, max int, check func(string) bool) *label {
	return &label{name: name, max: max, check: check, seen: map[string]struct{}{}}
}

// admit reserves v ahead of any caller (the values a gauge always reports).
func (l *label) admit(v string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen[v] = struct{}{}
}

func (l *label) value(v string) string {
	if !l.check(v) {
		return Other
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[v]; ok {
		return v
	}
	if len(l.seen) >= l.max {
		return Other
	}
	l.seen[v] = struct{}{}
	return v
}

// isIdent accepts the shape of Orchard's enums and codes ("not_found",
// "site.http_503"): lowercase letters, digits, '_' and '.', at most 64.
func isIdent(v string) bool {
	if v == "" || len(v) > 64 {
		return false
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// isRoute accepts a route template as gin reports it ("/sandboxes/:id").
func isRoute(v string) bool {
	return strings.HasPrefix(v, "/") && len(v) <= 128 && utf8.ValidString(v)
}

// gaugeFunc is a gauge computed at scrape time from a source that counts
// things by up to two label values. Seeded label combinations are always
// reported (0 when the source has none), so series do not vanish when a
// count drops to zero.
type gaugeFunc struct {
	name   string
	desc   *prometheus.Desc
	labels []*label
	seeds  [][2]string

	mu  sync.Mutex // guards src
	src func(ctx context.Context) (map[[2]string]int, error)
}

var _ prometheus.Collector = (*gaugeFunc)(nil)

func newGaugeFunc(name, help string, labels []*label, seeds [][2]string) *gaugeFunc {
	names := make([]string, len(labels))
	for i, l := range labels {
		names[i] = l.name
	}
	for _, s := range seeds {
		for i, l := range labels {
			l.admit(s[i])
		}
	}
	return &gaugeFunc{name: name, desc: prometheus.NewDesc(name, help, names, nil), labels: labels, seeds: seeds}
}

func seeds1(values []string) [][2]string {
	out := make([][2]string, 0, len(values))
	for _, v := range values {
		out = append(out, [2]string{v})
	}
	return out
}

func seeds2(first, second []string) [][2]string {
	out := make([][2]string, 0, len(first)*len(second))
	for _, a := range first {
		for _, b := range second {
			out = append(out, [2]string{a, b})
		}
	}
	return out
}

func (g *gaugeFunc) set(src func(ctx context.Context) (map[[2]string]int, error)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.src = src
}

// Describe implements prometheus.Collector.
func (g *gaugeFunc) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

// Collect implements prometheus.Collector.
func (g *gaugeFunc) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	src := g.src
	g.mu.Unlock()
	if src == nil {
		return
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), scrapeTimeout, errors.New("metrics scrape timed out"))
	defer cancel()
	counts, err := src(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(g.desc, fmt.Errorf("collect %s: %w", g.name, err))
		return
	}
	// Bound the source's values, then fold what became Other together.
	out := map[[2]string]int{}
	for _, s := range g.seeds {
		out[s] = 0
	}
	for k, n := range counts {
		var b [2]string
		for i, l := range g.labels {
			b[i] = l.value(k[i])
		}
		out[b] += n
	}
	for k, n := range out {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(n), k[:len(g.labels)]...)
	}
}
