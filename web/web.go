// Package web is the dashboard (API.md "Operations": GET /ui): a static
// page, its script and its style sheet, embedded in the server. The page
// holds no data; it asks for an API key and calls the API with it.
package web

import "embed"

// Files holds index.html, its scripts app.js and runs.js, and app.css.
//
//go:embed index.html app.js runs.js app.css
var Files embed.FS
