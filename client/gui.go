package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/orchard/orchard/api"
)

// Browser and desktop sandboxes (API.md). Requests and answers are the
// api package's GUI step types; a desktop request may also be any body
// the desktop reads (an Anthropic tool input, an OpenAI action), which
// api.DesktopActionsRequest, in the normalised vocabulary, cannot hold.

// Image is a screenshot's bytes with the frame and scale that actions on
// its pixels name (X-Orchard-Frame, X-Orchard-Scale).
type Image struct {
	Data        []byte
	ContentType string
	// Frame is the observation frame the image is; 0 when the server sent
	// none.
	Frame int64
	// Scale is image pixels per CSS pixel (browser) or per screen pixel
	// (desktop).
	Scale float64
}

// BrowserActions runs a browser action request (POST
// /sandboxes/{id}/browser/actions: {"actions": [...], "observe": {...},
// "frame": n, "strict": bool}). An action that fails on the page is in the
// answer's results, not an error. Not retried: actions act.
func (c *Client) BrowserActions(ctx context.Context, id string, req api.BrowserActionsRequest) (api.BrowserActionsResponse, error) {
	var out api.BrowserActionsResponse
	err := c.do(ctx, call{method: "POST", path: sandboxPath(id) + "/browser/actions", body: req, out: &out})
	return out, err
}

// BrowserObservation observes the active tab (GET /browser/observation
// with screenshot, quality, width, scale, axtree, som, text, full_page).
func (c *Client) BrowserObservation(ctx context.Context, id string, q url.Values) (api.BrowserObservation, error) {
	var out api.BrowserObservation
	err := c.do(ctx, call{method: "GET", path: sandboxPath(id) + "/browser/observation", query: q, out: &out, idempotent: true})
	return out, err
}

// BrowserScreenshot returns the active tab's screenshot (format, quality,
// width, scale, full_page).
func (c *Client) BrowserScreenshot(ctx context.Context, id string, q url.Values) (Image, error) {
	return c.image(ctx, sandboxPath(id)+"/browser/screenshot", q)
}

// DesktopActions runs a desktop action request (POST /desktop/actions):
// an api.DesktopActionsRequest, or a body in Anthropic's or OpenAI's
// vocabulary (marshalled as it is). Not retried.
func (c *Client) DesktopActions(ctx context.Context, id string, req any) (api.DesktopActionsResponse, error) {
	var out api.DesktopActionsResponse
	err := c.do(ctx, call{method: "POST", path: sandboxPath(id) + "/desktop/actions", body: req, out: &out})
	return out, err
}

// DesktopScreenshot returns the screen (format, quality, width, height).
func (c *Client) DesktopScreenshot(ctx context.Context, id string, q url.Values) (Image, error) {
	return c.image(ctx, sandboxPath(id)+"/desktop/screenshot", q)
}

// DesktopCursor reads the pointer.
func (c *Client) DesktopCursor(ctx context.Context, id string) (api.Cursor, error) {
	var out api.Cursor
	err := c.do(ctx, call{method: "GET", path: sandboxPath(id) + "/desktop/cursor", out: &out, idempotent: true})
	return out, err
}

func (c *Client) image(ctx context.Context, path string, q url.Values) (Image, error) {
	var (
		data []byte
		h    http.Header
	)
	if err := c.do(ctx, call{method: "GET", path: path, query: q, rawOut: &data, header: &h, idempotent: true}); err != nil {
		return Image{}, err
	}
	img := Image{Data: data, ContentType: h.Get("Content-Type")}
	img.Frame, _ = strconv.ParseInt(h.Get("X-Orchard-Frame"), 10, 64)
	img.Scale, _ = strconv.ParseFloat(h.Get("X-Orchard-Scale"), 64)
	return img, nil
}
