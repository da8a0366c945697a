// Package sites holds small offline websites — a shop, a wiki, a flight
// search and a recipe collection — embedded in the binary and served by
// one http.Handler, plus the bundled task suite over them with a scripted
// reference policy for every task. Browser sandboxes without network
// access reach them through `orchard-agent sites`, which a task's setup
// starts inside the sandbox.
package sites

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"

	"github.com/orchard/orchard/tasks"
)

// SuiteName is the name of the bundled suite.
const SuiteName = "bundled"

// Header is set on every answer of Handler, so a caller can tell the
// sites from another server on the same address.
const Header = "X-Orchard-Sites"

//go:embed web
var webFS embed.FS

//go:embed suite.jsonl
var suiteJSONL []byte

//go:embed scripts.json
var scriptsJSON []byte

// Handler serves the sites: /shop/, /wiki/, /travel/, /recipes/ and an
// index at /. Directories without an index page are not listed.
func Handler() http.Handler {
	root, err := fs.Sub(webFS, "web")
	if err != nil {
		panic(err) // the embedded tree always has web/
	}
	files := http.FileServerFS(root)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(Header, "1")
		// The sites are tiny and change with the binary; a cached copy
		// from an older agent must never be shown.
		w.Header().Set("Cache-Control", "no-store")
		if accountRoute(w, r) {
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		p := path.Clean("/" + r.URL.Path)
		if strings.HasSuffix(r.URL.Path, "/") && p != "/" {
			p += "/"
		}
		if strings.HasSuffix(p, "/") {
			if _, err := fs.Stat(root, strings.TrimPrefix(p, "/")+"index.html"); err != nil {
				http.NotFound(w, r)
				return
			}
		}
		files.ServeHTTP(w, r)
	})
}

// Suite parses the bundled suite. Every task starts the sites in its
// sandbox and runs with the network blocked.
func Suite() ([]tasks.Task, error) {
	ts, err := tasks.Parse(bytes.NewReader(suiteJSONL), "suite.jsonl")
	if err != nil {
		return nil, err
	}
	for i := range ts {
		ts[i].Suite = SuiteName
	}
	return ts, nil
}

// SuiteJSONL is the bundled suite file, as POST /tasks takes it.
func SuiteJSONL() []byte { return bytes.Clone(suiteJSONL) }

// Script returns the reference policy of a bundled task: its actions in
// order, each one action object as POST /episodes/{id}/step takes it, the
// last an answer when the task's eval reads one.
func Script(taskID string) ([]json.RawMessage, bool) {
	all, err := scripts()
	if err != nil {
		return nil, false
	}
	s, ok := all[taskID]
	return s, ok
}

// scripts decodes scripts.json; a unit test keeps it decodable.
func scripts() (map[string][]json.RawMessage, error) {
	var all map[string][]json.RawMessage
	if err := json.Unmarshal(scriptsJSON, &all); err != nil {
		return nil, fmt.Errorf("sites: scripts.json: %w", err)
	}
	return all, nil
}
