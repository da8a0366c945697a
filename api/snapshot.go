package api

import "encoding/json"

// Snapshot is a saved state of a sandbox (POST /sandboxes/{id}/snapshots):
// its filesystem changes and, for a browser sandbox, the browser's state.
// A sandbox created with "snapshot" starts from it.
type Snapshot struct {
	SnapshotID string `json:"snapshot_id"`
	// SandboxID is the sandbox it was taken from (which may be gone).
	SandboxID string  `json:"sandbox_id"`
	Kind      string  `json:"kind"`
	Image     string  `json:"image"`
	CreatedAt float64 `json:"created_at"`
	// Bytes is the space of the changes this snapshot adds; TotalBytes
	// adds those of the snapshots below it (Parent's, its parent's...),
	// which it references rather than copies.
	Bytes      int64 `json:"bytes"`
	TotalBytes int64 `json:"total_bytes"`
	// Parent is the snapshot the sandbox had started from; "" if none.
	Parent string `json:"parent,omitempty"`
	// BrowserState tells whether the browser's state (cookies, storage,
	// tabs, history, scroll, form values) was taken with it.
	BrowserState bool              `json:"browser_state"`
	Labels       map[string]string `json:"labels,omitempty"`
}

// SnapshotRequest is the optional body of POST /sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	Labels map[string]string `json:"labels,omitempty"`
}

// SnapshotList is the body of GET /snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// ForkRequest is the body of POST /sandboxes/{id}/fork.
type ForkRequest struct {
	Count int `json:"count" openapi:"minimum=1" doc:"how many sandboxes to branch off (1 to ORCHARD_FORK_MAX, default cap 32)"`
	// Labels are added to each branch's (which start as the parent's).
	Labels map[string]string `json:"labels,omitempty"`
	// Timeout bounds the wait for every branch to be ready, seconds
	// (default 300).
	Timeout int `json:"timeout,omitempty" openapi:"minimum=0"`
	// Exec runs in each branch before it is ready and before its browser
	// state is restored: running processes are not carried, so this is
	// where a branch starts what its pages come from (a local server).
	Exec []string `json:"exec,omitempty" doc:"commands (bash -c, 120 s each) run in each branch before it is ready and before its browser state is restored; a failing one fails the fork"`
}

// ForkResponse is the body of POST /sandboxes/{id}/fork: the branches,
// ready, in order.
type ForkResponse struct {
	SandboxID string    `json:"sandbox_id"`
	Sandboxes []Sandbox `json:"sandboxes"`
	// ForkMs is how long the fork took, from the request to every branch
	// ready.
	ForkMs float64 `json:"fork_ms"`
}

// SnapshotSource is what a snapshot keeps of its sandbox's settings, so
// that a sandbox created from it is of the same kind, on the same image,
// with the same kind settings unless the create says otherwise.
type SnapshotSource struct {
	Kind         string            `json:"kind"`
	Image        string            `json:"image"`
	KindOptions  json.RawMessage   `json:"kind_options,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	BrowserState json.RawMessage   `json:"browser_state,omitempty"`
}
