package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// browserRoutes are the paths of browser sandboxes (API.md); the agent
// serves them and the server forwards them as they are, WebSocket
// upgrades (the DevTools protocol) included.
func (s *Server) browserRoutes() []route {
	return []route{
		{method: "POST", path: "/sandboxes/:id/browser/actions", summary: "Run browser actions in order; optional observation in the same round trip",
			request: api.BrowserActionsRequest{}, response: api.BrowserActionsResponse{}, handler: s.toAgent("/browser/actions")},
		{method: "GET", path: "/sandboxes/:id/browser/observation", summary: "Observe the page: screenshot, accessibility tree, set-of-marks, text",
			query: []queryParam{{"screenshot", "string", "jpeg, png or none", false}, {"quality", "integer", "JPEG quality", false},
				{"width", "integer", "downscale the screenshot to this width", false},
				{"scale", "number", "downscale the screenshot by this factor (0–1]; width wins", false}, {"axtree", "boolean", "", false},
				{"som", "boolean", "", false}, {"text", "boolean", "", false},
				{"marks", "boolean", "draw the set-of-marks boxes and ids on the screenshot", false}},
			response: api.BrowserObservation{}, handler: s.toAgent("/browser/observation")},
		{method: "GET", path: "/sandboxes/:id/browser/screenshot", summary: "Screenshot as image bytes (X-Orchard-Frame, X-Orchard-Scale, X-Orchard-Capture headers)",
			query: []queryParam{{"format", "string", "png or jpeg", false}, {"quality", "integer", "", false},
				{"full_page", "boolean", "", false}, {"width", "integer", "scale down to this width", false},
				{"scale", "number", "scale down by this factor (0–1]; width wins", false},
				{"marks", "boolean", "draw the set-of-marks boxes and ids on the screenshot", false}},
			produces: "image/png", handler: s.toAgent("/browser/screenshot")},
		{method: "POST", path: "/sandboxes/:id/browser/evaluate", summary: "Evaluate a JavaScript expression in the active tab: {expression} → {value}",
			request: api.EvaluateRequest{}, response: api.EvaluateResult{}, handler: s.toAgent("/browser/evaluate")},
		{method: "GET", path: "/sandboxes/:id/browser/tabs", summary: "Open tabs", response: api.TabList{}, handler: s.toAgent("/browser/tabs")},
		{method: "GET", path: "/sandboxes/:id/browser/network", summary: "The sandbox's connection log (?format=har for HTTP Archive 1.2, ?since=ID for newer entries)",
			query:    []queryParam{{"format", "string", "json or har", false}, {"since", "integer", "only entries with a larger id", false}},
			response: map[string]any{}, handler: s.toAgent("/egress/log")},
		{method: "GET", path: "/sandboxes/:id/network", summary: "The connection log of any network-enabled sandbox (as /browser/network)",
			query:    []queryParam{{"format", "string", "json or har", false}, {"since", "integer", "only entries with a larger id", false}},
			response: map[string]any{}, handler: s.toAgent("/egress/log")},
		{method: "GET", path: "/sandboxes/:id/browser/cdp", summary: "WebSocket to the browser's DevTools protocol (Playwright connectOverCDP, chromedp, rod)",
			ws: true, handler: s.toAgent("/browser/cdp")},
		{method: "GET", path: "/sandboxes/:id/browser/cdp/json/version", summary: "DevTools discovery for the /browser/cdp WebSocket (webSocketDebuggerUrl)",
			response: map[string]any{}, handler: s.toAgentWith("/browser/cdp/json/version", cdpDiscovery)},
		{method: "GET", path: "/sandboxes/:id/browser/stream", summary: "Live view of the active tab: MJPEG (multipart/x-mixed-replace) until the client disconnects",
			query: []queryParam{{"fps", "integer", "frames per second, at most 10 (default 5)", false},
				{"quality", "integer", "JPEG quality (default 60)", false},
				{"width", "integer", "scale frames down to this width (default the viewport's)", false}},
			produces: "multipart/x-mixed-replace", handler: s.toAgent("/browser/stream")},
	}
}

// cdpDiscovery points the browser's /json/version answer at this server's
// /browser/cdp WebSocket, as the caller reached it.
func cdpDiscovery(c *gin.Context, resp *http.Response) error {
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	var v map[string]any
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v); err != nil {
		return err
	}
	resp.Body.Close()
	scheme := "ws"
	if c.Request.TLS != nil || strings.EqualFold(c.GetHeader("X-Forwarded-Proto"), "https") {
		scheme = "wss"
	}
	v["webSocketDebuggerUrl"] = scheme + "://" + c.Request.Host + "/sandboxes/" + url.PathEscape(c.Param("id")) + "/browser/cdp"
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return nil
}

// toAgent forwards the request to path on the sandbox's agent.
func (s *Server) toAgent(path string) handlerFunc { return s.toAgentWith(path, nil) }

// toAgentWith is toAgent with a hook that may rewrite the agent's response.
func (s *Server) toAgentWith(path string, modify func(*gin.Context, *http.Response) error) handlerFunc {
	return func(c *gin.Context) error {
		rec, err := s.mgr.Get(c.Request.Context(), c.Param("id"))
		if err != nil {
			return err
		}
		for _, k := range []string{api.KindBrowser, api.KindDesktop} {
			if strings.HasPrefix(path, "/"+k+"/") && rec.Kind != k {
				return faults.Newf(faults.CodeKindUnsupported, faults.InvalidRequest, faults.Client,
					"sandbox %s is a %s sandbox; %s paths need kind %q", rec.ID, rec.Kind, k, k)
			}
		}
		a, err := s.mgr.Agent(c.Request.Context(), rec.ID)
		if err != nil {
			return err
		}
		base, rt := a.HTTP()
		raw := body(c)
		var keyProto string // the "api_key.<key>" subprotocol the client offered
		proxy := &httputil.ReverseProxy{
			Transport: rt,
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.URL = &url.URL{Scheme: base.Scheme, Host: base.Host, Path: strings.TrimRight(base.Path, "/") + path,
					RawQuery: pr.In.URL.RawQuery}
				pr.Out.Host = base.Host
				// Credentials are the server's business, not the agent's.
				pr.Out.Header.Del("X-API-Key")
				keyProto = stripKeyProtocols(pr.Out.Header)
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
				if c.Writer.Written() {
					return
				}
				if d := s.mgr.DeathFault(c.Request.Context(), rec.ID); d != nil {
					renderError(c, s.log, d)
					return
				}
				renderError(c, s.log, faults.Wrap(err, faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox,
					"the sandbox's agent did not answer"))
			},
		}
		defer func() {
			// A viewer leaving a stream aborts the copy; that is no fault.
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler && c.Request.Context().Err() != nil {
					return
				}
				panic(r)
			}
		}()
		proxy.ModifyResponse = func(resp *http.Response) error {
			// A browser fails a handshake that answers none of the
			// subprotocols it offered: with the key taken out, the agent
			// may choose none, and the key's entry is the answer.
			if resp.StatusCode == http.StatusSwitchingProtocols && keyProto != "" && resp.Header.Get("Sec-WebSocket-Protocol") == "" {
				resp.Header.Set("Sec-WebSocket-Protocol", keyProto)
			}
			if modify != nil {
				return modify(c, resp)
			}
			return nil
		}
		proxy.ServeHTTP(c.Writer, c.Request)
		return nil
	}
}

// stripKeyProtocols takes the "api_key.<key>" entries, which carry the
// caller's API key (see auth), out of h's Sec-WebSocket-Protocol, so the
// key does not reach the sandbox, and returns the first of them.
func stripKeyProtocols(h http.Header) string {
	var key string
	var keep []string
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			switch {
			case p == "":
			case strings.HasPrefix(p, "api_key."):
				if key == "" {
					key = p
				}
			default:
				keep = append(keep, p)
			}
		}
	}
	if key == "" {
		return ""
	}
	h.Del("Sec-WebSocket-Protocol")
	if len(keep) > 0 {
		h.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
	}
	return key
}
