// Package server is Orchard's HTTP API: gin routes, authentication,
// request ids, body limits, error rendering, the PTY proxy and the OpenAPI
// document. Sandbox logic lives in server/manager.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/episodes"
	"github.com/orchard/orchard/evaluate"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/metrics"
	"github.com/orchard/orchard/recordings"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/sitehealth"
	"github.com/orchard/orchard/tasks"
)

// Version is the service version reported by GET / (Orchard reports 0.1.0).
const Version = "0.1.0"

// Config holds the HTTP layer's settings.
type Config struct {
	ServiceName   string   // SERVICE_NAME
	APIKeys       []string // API_KEYS
	RequireAPIKey bool     // REQUIRE_API_KEY
	// MaxBodyBytes bounds every request body. Uploads travel base64 in
	// JSON, so this also bounds the largest file (≈ 3/4 of it).
	MaxBodyBytes int64
	// MaxConcurrentUploads bounds the uploads of more than 1 MiB (or of
	// unknown length) received at once; more wait up to five minutes for
	// a turn, then get 503 with Retry-After. 0 =
	// DefaultMaxConcurrentUploads, negative = no bound.
	MaxConcurrentUploads int
	// Metrics receives the server's instrumentation and is served at
	// GET /metrics; nil = a fresh registry of the server's own.
	Metrics *metrics.Metrics
	// RecordingsDir keeps episode recordings; empty = episodes are not
	// recorded and /recordings answers 501.
	RecordingsDir string
	// Judge is the LLM judge of tasks whose eval is "judge" (JUDGE_URL,
	// JUDGE_MODEL, JUDGE_API_KEY); nil = such tasks end env_error.
	Judge *evaluate.JudgeConfig
	// Tasks holds the loaded task suites; nil = a fresh registry.
	Tasks *tasks.Registry
	// SiteHealth reports the per-host circuit breakers at GET /sitehealth
	// and in metrics; nil = no breaker (the route answers an empty list).
	SiteHealth SiteHealth
	// ServicePublicURL is the scheme and host service URLs start with
	// (SERVICE_PUBLIC_BASE_URL); empty = the request's own.
	ServicePublicURL string
	// RepoRoots are the directories of this host under which a task's
	// setup.repo may name a repository or tarball (TASK_REPO_ROOTS,
	// colon-separated); empty = tasks copy no repository from the host.
	RepoRoots []string
}

// SiteHealth is what the server shows of the site breakers.
type SiteHealth interface {
	Status(ctx context.Context) ([]sitehealth.HostStatus, error)
}

// Server serves the API.
type Server struct {
	cfg    Config
	mgr    *manager.Manager
	log    *slog.Logger
	engine *gin.Engine
	routes []route

	eps       *episodes.Store
	suitesMu  sync.Mutex        // guards suiteSums
	suiteSums map[string]string // suite → hash of the stored version the registry has
	tasks     *tasks.Registry
	evaluator *evaluate.Evaluator
	recs      *recordings.Store // nil without Config.RecordingsDir
	uploads   *uploadGate
	svc       *serviceProxy
}

// New builds the server and its routes. The manager's store keeps the
// episodes too, so it must hold documents and locks (the memory and Redis
// stores do).
func New(cfg Config, mgr *manager.Manager, log *slog.Logger) (*Server, error) {
	if cfg.ServiceName == "" {
		cfg.ServiceName = "sandbox-orchestrator"
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 256 << 20
	}
	if cfg.MaxConcurrentUploads == 0 {
		cfg.MaxConcurrentUploads = DefaultMaxConcurrentUploads
	}
	if log == nil {
		log = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	gin.SetMode(gin.ReleaseMode)
	if cfg.Tasks == nil {
		cfg.Tasks = tasks.NewRegistry()
	}
	eps, err := episodes.NewStore(mgr.Store())
	if err != nil {
		return nil, fmt.Errorf("new server: %w", err)
	}
	s := &Server{cfg: cfg, mgr: mgr, log: log, engine: gin.New(),
		eps: eps, suiteSums: map[string]string{}, tasks: cfg.Tasks, evaluator: &evaluate.Evaluator{Judge: cfg.Judge},
		uploads: newUploadGate(cfg.MaxConcurrentUploads, uploadWait), svc: newServiceProxy()}
	if cfg.RecordingsDir != "" {
		recs, err := recordings.NewStore(cfg.RecordingsDir)
		if err != nil {
			log.Error("recordings: episodes will not be recorded", "dir", cfg.RecordingsDir, "err", err)
		} else {
			s.recs = recs
		}
	}
	e := s.engine
	e.HandleMethodNotAllowed = true
	e.ContextWithFallback = true
	// gin's own trailing-slash redirect answers before any middleware
	// runs (no X-Request-ID, not counted, an HTML body); NoRoute redirects
	// instead, as Starlette does.
	e.RedirectTrailingSlash = false
	cfg.Metrics.SetSandboxSource(s.sandboxCounts)
	if cfg.SiteHealth != nil {
		cfg.Metrics.SetBreakerSource(func(ctx context.Context) map[string]int {
			hosts, err := cfg.SiteHealth.Status(ctx)
			if err != nil {
				return nil
			}
			n := map[string]int{}
			for _, h := range hosts {
				n[string(h.State)]++
			}
			return n
		})
	}
	e.Use(requestID(), cfg.Metrics.Middleware(), s.recovery())
	e.NoRoute(func(c *gin.Context) {
		if loc, ok := s.slashRedirect(c.Request); ok {
			c.Header("Location", loc)
			c.AbortWithStatus(http.StatusTemporaryRedirect)
			return
		}
		renderError(c, s.log, faults.New(faults.CodeRouteNotFound, faults.NotFound, faults.Client, "Not Found"))
	})
	e.NoMethod(func(c *gin.Context) {
		renderError(c, s.log, faults.New(faults.CodeMethodNotAllowed, faults.InvalidRequest, faults.Client, "Method Not Allowed"))
	})
	s.routes = append(append(append(append(s.table(), s.browserRoutes()...), s.desktopRoutes()...), s.episodeRoutes()...), s.uiRoutes()...)
	s.routes = append(s.routes, s.snapshotRoutes()...)
	s.routes = append(s.routes, s.poolRoutes()...)
	s.routes = append(s.routes, s.serviceRoutes()...)
	s.routes = append(s.routes, s.datasetRoutes()...)
	for _, r := range s.routes {
		chain := []gin.HandlerFunc{s.readBody(cfg.MaxBodyBytes, r.rawBody, r.public, r.stream)}
		if !r.public {
			chain = append(chain, s.auth(r.ws))
		}
		chain = append(chain, s.wrap(r))
		e.Handle(r.method, r.path, chain...)
	}
	return s, nil
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.engine }

// handlerFunc is a handler that returns its error instead of writing it.
type handlerFunc func(c *gin.Context) error

// wrap is r's gin handler: its handlerFunc, whose error it renders with
// the route's statuses.
func (s *Server) wrap(r route) gin.HandlerFunc {
	h, statuses := r.handler, r.statuses
	return func(c *gin.Context) {
		if err := h(c); err != nil {
			renderErrorOn(c, s.log, err, statuses)
		}
	}
}

// slashRedirect is where a path that matches no route redirects to: the
// same path with its trailing slash added or removed, when a route of the
// request's method matches that (Starlette's redirect_slashes).
func (s *Server) slashRedirect(r *http.Request) (string, bool) {
	p := r.URL.Path
	if p == "/" || p == "" {
		return "", false
	}
	alt := strings.TrimSuffix(p, "/")
	if alt == p {
		alt = p + "/"
	}
	for _, rt := range s.routes {
		if rt.method == r.Method && matchTemplate(rt.path, alt) {
			if r.URL.RawQuery != "" {
				alt += "?" + r.URL.RawQuery
			}
			return alt, true
		}
	}
	return "", false
}

// matchTemplate reports whether path matches a gin route template whose
// ":name" segments match any one non-empty segment.
func matchTemplate(tmpl, path string) bool {
	ts, ps := strings.Split(tmpl, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		return false
	}
	for i, t := range ts {
		if strings.HasPrefix(t, ":") {
			if ps[i] == "" {
				return false
			}
		} else if t != ps[i] {
			return false
		}
	}
	return true
}
