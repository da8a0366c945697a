package server

import "github.com/orchard/orchard/api"

// desktopRoutes are the paths of desktop sandboxes (API.md): forwarded to
// the sandbox's desktop daemon through its agent.
func (s *Server) desktopRoutes() []route {
	return []route{
		{method: "POST", path: "/sandboxes/:id/desktop/actions",
			summary: "Run desktop actions in order (ours, Anthropic computer-use 20241022/20250124, or OpenAI computer-use names); optional observation in the same round trip",
			request: api.DesktopActionsRequest{}, response: api.DesktopActionsResponse{}, handler: s.toAgent("/desktop/actions")},
		{method: "GET", path: "/sandboxes/:id/desktop/screenshot", summary: "Screenshot of the screen as image bytes (X-Orchard-Frame, X-Orchard-Scale headers)",
			query: []queryParam{{"format", "string", "png or jpeg", false}, {"quality", "integer", "JPEG quality", false},
				{"width", "integer", "scale down to fit this width", false}, {"height", "integer", "scale down to fit this height", false}},
			produces: "image/png", handler: s.toAgent("/desktop/screenshot")},
		{method: "GET", path: "/sandboxes/:id/desktop/cursor", summary: "The pointer's position: x, y in the latest screenshot's pixels (frame, scale), screen_x, screen_y on the screen",
			response: api.Cursor{}, handler: s.toAgent("/desktop/cursor")},
		{method: "GET", path: "/sandboxes/:id/desktop/vnc", summary: "Live view: RFB over WebSocket (noVNC), view-only, shared by up to 8 viewers",
			ws: true, handler: s.toAgent("/desktop/vnc")},
		{method: "GET", path: "/sandboxes/:id/desktop/status", summary: "The X display, the window manager's state (running, restarting, down, none) and the last desktop fault (an X server or window manager death)",
			response: api.DesktopStatus{}, handler: s.toAgent("/desktop/status")},
	}
}
