package api

import (
	"encoding/json"
	"time"
)

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

// SessionFault is a failure a GUI session recovered from or ended on (an
// X server or a window manager that died): its class, when it happened,
// and the restarts it took in a row (1 for a one-off death; when the
// session gave up, the restarts made).
type SessionFault struct {
	FaultInfo
	At       time.Time `json:"at"`
	Restarts int       `json:"restarts,omitempty"`
}

// DesktopStatus is the body of GET /sandboxes/{id}/desktop/status.
type DesktopStatus struct {
	Display       string        `json:"display"`
	WindowManager string        `json:"window_manager" doc:"running, restarting, down or none"`
	LastFault     *SessionFault `json:"last_fault,omitempty"`
	LastFaultAt   *time.Time    `json:"last_fault_at,omitempty"`
}
