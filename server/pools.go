package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/metrics"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store"
)

// poolRoutes are the warm pools' paths (README "Warm pools").
func (s *Server) poolRoutes() []route {
	return []route{
		{method: "POST", path: "/pools", summary: "Define a warm pool: sandboxes of one spec kept started, handed over by matching creates (201)",
			request: api.PoolRequest{}, response: api.Pool{}, handler: s.createPool},
		{method: "GET", path: "/pools", summary: "List warm pools with their counts", response: api.PoolList{}, handler: s.listPools},
		{method: "GET", path: "/pools/:name", summary: "Get a warm pool with its counts", response: api.Pool{}, handler: s.getPool},
		{method: "DELETE", path: "/pools/:name", summary: "Delete a warm pool and its unclaimed sandboxes (claimed ones stay)",
			response: api.DeletePoolResponse{}, handler: s.deletePool},
	}
}

func poolJSON(p manager.PoolStatus) api.Pool {
	out := api.Pool{Name: p.Name, Size: p.Size, Max: p.Max, CreatedAt: p.CreatedAt,
		Ready: p.Ready, Starting: p.Starting, Claims: p.Claims, Misses: p.Misses}
	_ = json.Unmarshal(p.Sandbox, &out.Sandbox) // validated when the pool was defined
	return out
}

func (s *Server) createPool(c *gin.Context) error {
	raw := body(c)
	var req api.PoolRequest
	if err := decodeJSON(raw, &req); err != nil {
		return err
	}
	var top struct {
		Sandbox json.RawMessage `json:"sandbox"`
	}
	_ = json.Unmarshal(raw, &top)
	if len(top.Sandbox) == 0 || string(top.Sandbox) == "null" {
		return faults.Validation(missingField("body", "sandbox", jsonInput(raw)))
	}
	if req.Sandbox.Pool != "" {
		return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "sandbox", "pool"},
			Msg: "a pool's sandbox names no pool", Input: req.Sandbox.Pool})
	}
	var ck checks
	if req.Size < 0 || req.Size > manager.MaxPoolSize {
		ck.add(faults.CodeValidation, faults.FieldError{Type: "value_error", Loc: []any{"body", "size"},
			Msg: fmt.Sprintf("size must be 0 to %d", manager.MaxPoolSize), Input: req.Size})
	}
	if req.Max != 0 && (req.Max < req.Size || req.Max > manager.MaxPoolSize) {
		ck.add(faults.CodeValidation, faults.FieldError{Type: "value_error", Loc: []any{"body", "max"},
			Msg: fmt.Sprintf("max must be at least size and at most %d (or absent: size)", manager.MaxPoolSize), Input: req.Max})
	}
	if !manager.ValidID(req.Name) {
		ck.add(faults.CodeValidation, faults.FieldError{Type: "value_error", Loc: []any{"body", "name"},
			Msg: "name must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters)", Input: req.Name})
	}
	if err := ck.err(); err != nil {
		return err
	}
	p := manager.CreateParams{BlockNetwork: true}
	if err := s.sandboxParams(&p, req.Sandbox, "body", "sandbox"); err != nil {
		return err
	}
	if p.ID != "" {
		return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "sandbox", "sandbox_id"},
			Msg: "a pool's sandbox names no sandbox_id: each claim may name its own", Input: p.ID})
	}
	st, err := s.mgr.CreatePool(c.Request.Context(), manager.Pool{Name: req.Name, Size: req.Size, Max: req.Max,
		Sandbox: top.Sandbox, Params: p})
	if err != nil {
		return err
	}
	c.JSON(http.StatusCreated, poolJSON(st))
	return nil
}

func (s *Server) listPools(c *gin.Context) error {
	ps, err := s.mgr.ListPools(c.Request.Context())
	if err != nil {
		return err
	}
	out := api.PoolList{Pools: make([]api.Pool, 0, len(ps))}
	for _, p := range ps {
		out.Pools = append(out.Pools, poolJSON(p))
	}
	c.JSON(http.StatusOK, out)
	return nil
}

func (s *Server) getPool(c *gin.Context) error {
	p, err := s.mgr.GetPool(c.Request.Context(), c.Param("name"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, poolJSON(p))
	return nil
}

func (s *Server) deletePool(c *gin.Context) error {
	n, err := s.mgr.DeletePool(c.Request.Context(), c.Param("name"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, api.DeletePoolResponse{Status: "deleted", Drained: n})
	return nil
}

// createOrClaim is POST /sandboxes's create: through a warm pool when the
// request names one or matches one's spec, cold otherwise.
func (s *Server) createOrClaim(c *gin.Context, p manager.CreateParams, req api.CreateSandboxRequest) (store.Sandbox, error) {
	ctx := c.Request.Context()
	rec, res, err := s.mgr.CreateOrClaim(ctx, p, req.Pool)
	if err != nil {
		return rec, err
	}
	if res.Pool != "" {
		result := metrics.PoolMiss
		if res.Claimed {
			result = metrics.PoolClaim
		}
		s.cfg.Metrics.ObservePoolClaim(res.Pool, result)
	}
	if res.Claimed && rec.Kind == api.KindBrowser && req.Browser != nil {
		if err := s.applyBrowserClaim(ctx, rec, *req.Browser); err != nil {
			// The claim's own settings could not be applied: the sandbox is
			// not what was asked for, so it goes, and the caller learns why.
			_ = s.mgr.Delete(context.WithoutCancel(ctx), rec.ID)
			return store.Sandbox{}, err
		}
	}
	return rec, nil
}

// browserClaimTimeout bounds applying a claim's browser settings: a
// resize is one protocol call; a start page is a page load, which the
// browser's own navigation timeout bounds first.
const browserClaimTimeout = 60 * time.Second

// applyBrowserClaim gives a claimed browser sandbox the viewport and start
// page of the create that claimed it, through its browser daemon.
func (s *Server) applyBrowserClaim(ctx context.Context, rec store.Sandbox, o api.BrowserOptions) error {
	if o.Viewport == (api.Viewport{}) && o.StartURL == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, browserClaimTimeout)
	defer cancel()
	a, err := s.mgr.Agent(ctx, rec.ID)
	if err != nil {
		return err
	}
	base, rt := a.HTTP()
	post := func(path string, body any) error {
		b, _ := json.Marshal(body)
		u := *base
		u.Path = strings.TrimRight(u.Path, "/") + path
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(b))
		if err != nil {
			return err
		}
		hr.Header.Set("Content-Type", "application/json")
		resp, err := rt.RoundTrip(hr)
		if err != nil {
			return faults.Wrap(err, faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "apply the claim's browser settings")
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != http.StatusOK {
			var env faults.Envelope
			if json.Unmarshal(out, &env) == nil && env.Error != nil {
				return faults.FromInfo(*env.Error, resp.StatusCode)
			}
			return faults.Newf(faults.CodeBrowserProtocol, faults.Internal, faults.Browser,
				"apply the claim's browser settings: %s answered %d", path, resp.StatusCode)
		}
		var ar api.BrowserActionsResponse
		if path == "/browser/actions" && json.Unmarshal(out, &ar) == nil {
			for _, r := range ar.Results {
				if !r.OK && r.Error != nil {
					return faults.FromInfo(*r.Error, 0)
				}
			}
		}
		return nil
	}
	if o.Viewport != (api.Viewport{}) {
		v := o.Viewport
		if v.Width == 0 {
			v.Width = 1280
		}
		if v.Height == 0 {
			v.Height = 720
		}
		if err := post("/browser/viewport", v); err != nil {
			return err
		}
	}
	if o.StartURL != "" {
		nav := api.BrowserActionsRequest{Actions: []api.BrowserAction{{Type: "navigate", URL: o.StartURL}}}
		if err := post("/browser/actions", nav); err != nil {
			return err
		}
	}
	return nil
}
