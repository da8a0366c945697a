package server

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// AgentHTTP returns how to reach an agent over HTTP: its base URL and a
// transport (unix socket or TCP) with pooled connections.
type AgentHTTP func(agentAddr string) (*url.URL, http.RoundTripper)

// browserRoutes are the paths of browser sandboxes (API.md); the agent
// serves them and the server forwards them as they are, WebSocket
// upgrades (the DevTools protocol) included.
func (s *Server) browserRoutes() []route {
	return []route{
		{method: "POST", path: "/sandboxes/:id/browser/actions", summary: "Run browser actions in order; optional observation in the same round trip",
			request: map[string]any{}, response: map[string]any{}, handler: s.toAgent("/browser/actions")},
		{method: "GET", path: "/sandboxes/:id/browser/observation", summary: "Observe the page: screenshot, accessibility tree, set-of-marks, text",
			query: []queryParam{{"screenshot", "string", "jpeg, png or none", false}, {"quality", "integer", "JPEG quality", false},
				{"width", "integer", "downscale the screenshot to this width", false}, {"axtree", "boolean", "", false},
				{"som", "boolean", "", false}, {"text", "boolean", "", false}},
			response: map[string]any{}, handler: s.toAgent("/browser/observation")},
		{method: "GET", path: "/sandboxes/:id/browser/screenshot", summary: "Screenshot as image bytes",
			query: []queryParam{{"format", "string", "png or jpeg", false}, {"quality", "integer", "", false},
				{"full_page", "boolean", "", false}, {"width", "integer", "", false}},
			handler: s.toAgent("/browser/screenshot")},
		{method: "GET", path: "/sandboxes/:id/browser/tabs", summary: "Open tabs", response: map[string]any{}, handler: s.toAgent("/browser/tabs")},
		{method: "GET", path: "/sandboxes/:id/browser/cdp", summary: "WebSocket to the browser's DevTools protocol (Playwright connectOverCDP, chromedp, rod)",
			ws: true, handler: s.toAgent("/browser/cdp")},
	}
}

// toAgent forwards the request to path on the sandbox's agent.
func (s *Server) toAgent(path string) handlerFunc {
	return func(c *gin.Context) error {
		if s.agentHTTP == nil {
			return faults.New(faults.CodeKindUnsupported, faults.NotImplemented, faults.Platform, "this server does not forward to agents")
		}
		rec, err := s.mgr.Get(c.Request.Context(), c.Param("id"))
		if err != nil {
			return err
		}
		if rec.Kind != api.KindBrowser {
			return faults.Newf(faults.CodeKindUnsupported, faults.InvalidRequest, faults.Client,
				"sandbox %s is a %s sandbox; browser paths need kind \"browser\"", rec.ID, rec.Kind)
		}
		addr, err := s.mgr.AgentAddr(c.Request.Context(), rec.ID)
		if err != nil {
			return err
		}
		base, rt := s.agentHTTP(addr)
		raw := body(c)
		proxy := &httputil.ReverseProxy{
			Transport: rt,
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.URL = &url.URL{Scheme: base.Scheme, Host: base.Host, Path: strings.TrimRight(base.Path, "/") + path,
					RawQuery: pr.In.URL.RawQuery}
				pr.Out.Host = base.Host
				// Credentials are the server's business, not the agent's.
				pr.Out.Header.Del("X-API-Key")
				q := pr.Out.URL.Query()
				if q.Has("api_key") {
					q.Del("api_key")
					pr.Out.URL.RawQuery = q.Encode()
				}
				if raw != nil {
					pr.Out.Body = io.NopCloser(bytes.NewReader(raw))
					pr.Out.ContentLength = int64(len(raw))
				}
			},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				renderError(c, s.log, faults.Wrap(err, faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox,
					"the sandbox's agent did not answer"))
			},
		}
		proxy.ServeHTTP(c.Writer, c.Request)
		return nil
	}
}
