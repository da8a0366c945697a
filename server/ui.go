package server

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/web"
)

// The dashboard's files (package web) are public: the page holds no data,
// and everything it shows stays behind the API key it asks for.

// uiPolicy lets the page run only its own script and style, talk only to
// this server, show only images it made from the API's bytes, and never be
// framed.
const uiPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (s *Server) uiRoutes() []route {
	return []route{
		{method: "GET", path: "/ui", summary: "Dashboard: sandboxes with live views, capacity, episodes, site health, recordings (asks for an API key; holds no data)",
			public: true, produces: "text/html", handler: uiFile("index.html", "text/html; charset=utf-8")},
		{method: "GET", path: "/ui/app.js", summary: "The dashboard's script", public: true, produces: "text/javascript",
			handler: uiFile("app.js", "text/javascript; charset=utf-8")},
		{method: "GET", path: "/ui/runs.js", summary: "The dashboard's run charts and comparison", public: true, produces: "text/javascript",
			handler: uiFile("runs.js", "text/javascript; charset=utf-8")},
		{method: "GET", path: "/ui/app.css", summary: "The dashboard's style sheet", public: true, produces: "text/css",
			handler: uiFile("app.css", "text/css; charset=utf-8")},
	}
}

func uiFile(name, contentType string) handlerFunc {
	data, err := web.Files.ReadFile(name)
	if err != nil {
		panic("ui: " + err.Error()) // embedded at build time
	}
	return func(c *gin.Context) error {
		h := c.Writer.Header()
		h.Set("Content-Security-Policy", uiPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		c.Data(http.StatusOK, contentType, data)
		return nil
	}
}
