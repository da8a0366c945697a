package api

import "encoding/json"

// Tab is one open tab of a browser sandbox.
type Tab struct {
	Index  int    `json:"index"`
	URL    string `json:"url"`
	Title  string `json:"title"`
	Active bool   `json:"active"`
}

// TabList is the body of GET /sandboxes/{id}/browser/tabs.
type TabList struct {
	Tabs []Tab `json:"tabs"`
}

// EvaluateRequest is the body of POST /sandboxes/{id}/browser/evaluate: a
// JavaScript expression run in the active tab's page (a promise is
// awaited).
type EvaluateRequest struct {
	Expression string `json:"expression"`
}

// EvaluateResult is what POST /browser/evaluate answers with.
type EvaluateResult struct {
	// Value is the expression's value as JSON: any JSON value, by design.
	Value json.RawMessage `json:"value" doc:"the expression's value: any JSON value"`
}
