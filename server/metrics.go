package server

import (
	"context"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/metrics"
)

// serveMetrics is GET /metrics: the server's registry in the Prometheus
// text format. It is public, as /health is, so scrapers need no API key;
// no label carries a sandbox id, path or message.
func (s *Server) serveMetrics(c *gin.Context) error {
	s.cfg.Metrics.Handler().ServeHTTP(c.Writer, c.Request)
	return nil
}

// sandboxCounts feeds orchard_sandboxes at scrape time: the sandboxes in
// the store by kind and live status, as GET /sandboxes lists them.
func (s *Server) sandboxCounts(ctx context.Context) (map[metrics.SandboxKey]int, error) {
	recs, err := s.mgr.List(ctx, nil, "", "")
	if err != nil {
		return nil, err
	}
	out := map[metrics.SandboxKey]int{}
	for _, r := range recs {
		out[metrics.SandboxKey{Kind: r.Kind, Status: r.Status}]++
	}
	return out, nil
}
