// Package sites is the bundled task suite: offline sites written into the
// sandbox by each task's setup, with a script that solves every task.
//
// PLACEHOLDER, to be replaced: this file stands in for the real bundled
// suite, which is built in a separate change with the same API
// (SuiteName, Suite, Script). It holds one task so that `orchard run
// bundled` and `orchard demo` work and can be tested until then. Replace
// the whole file when that change lands; nothing else depends on its
// contents.
package sites

import (
	"encoding/json"

	"github.com/orchard/orchard/tasks"
)

// SuiteName is the name the bundled suite is loaded under.
const SuiteName = "bundled"

// counterPage is an offline page: a field, a button, and a count.
const counterPage = `<!doctype html><html><head><title>Greenhouse</title>
<style>body{font:16px sans-serif;margin:24px}input,button{font-size:16px;padding:4px 8px}</style></head>
<body><h1>Greenhouse inventory</h1>
<label>Plant <input id="q" placeholder="search plants"></label>
<button id="go" onclick="var q=document.getElementById('q').value.trim().toLowerCase();
document.getElementById('r').textContent=(q==='fern'?'4 ferns in stock':'0 '+q+' in stock')">Search</button>
<p id="r">Type a plant and press Search.</p></body></html>`

// Suite returns the bundled tasks.
func Suite() ([]tasks.Task, error) {
	return []tasks.Task{{
		ID:       "greenhouse-ferns",
		Suite:    SuiteName,
		Source:   tasks.SourceOrchard,
		StartURL: "file:///workspace/site/index.html",
		Question: "How many ferns are in stock at the greenhouse?",
		MaxSteps: 8,
		Setup: &tasks.Setup{
			Files:   []tasks.File{{Path: "/workspace/site/index.html", Content: counterPage}},
			Sandbox: json.RawMessage(`{"block_network":true,"browser":{"viewport":{"width":800,"height":600}}}`),
		},
		Eval: &tasks.Eval{Type: tasks.EvalAnswerMatch, Mode: tasks.ModeNumeric, References: []string{"4"}},
	}}, nil
}

var scripts = map[string][]string{
	"greenhouse-ferns": {
		`{"type":"click","selector":"#q"}`,
		`{"type":"type","text":"fern"}`,
		`{"type":"click","selector":"#go"}`,
		`{"type":"answer","text":"4 ferns"}`,
	},
}

// Script returns the actions that solve a bundled task.
func Script(taskID string) ([]json.RawMessage, bool) {
	s, ok := scripts[taskID]
	if !ok {
		return nil, false
	}
	out := make([]json.RawMessage, len(s))
	for i, a := range s {
		out[i] = json.RawMessage(a)
	}
	return out, true
}
