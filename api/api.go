// Package api holds the wire types shared by the server, the agent and the
// clients. Field names of the Orchard-compatible types are the wire contract
// of ORCHARD_COMPAT.md and must not change.
package api

import (
	"encoding/json"
	"strings"

	"github.com/orchard/orchard/faults"
)

// Sandbox statuses (ORCHARD_COMPAT §6).
const (
	StatusPending       = "pending"
	StatusReady         = "ready"
	StatusPaused        = "paused"
	StatusUnschedulable = "unschedulable"
	StatusFailed        = "failed"
	// StatusDeleting: deleted through a replica that cannot reach the
	// container; the replica that can finishes the delete.
	StatusDeleting = "deleting"
	StatusNotFound = "not_found"
)

// Job statuses.
const (
	JobQueued    = "queued"
	JobRunning   = "running"
	JobSucceeded = "succeeded"
	JobFailed    = "failed"
)

// Sandbox kinds.
const (
	KindShell   = "shell"
	KindBrowser = "browser"
	KindDesktop = "desktop"
)

// CreateSandboxRequest is the body of POST /sandboxes.
type CreateSandboxRequest struct {
	Image        string  `json:"image"`
	BlockNetwork *bool   `json:"block_network"`
	SandboxID    *string `json:"sandbox_id"`
	// CPU and Memory are Kubernetes quantities ("2", "500m"; "512Mi",
	// "16Gi"), above 0 and at most the server's limits (the host's CPUs
	// and RAM unless configured); absent or "" take the defaults.
	CPU     *string `json:"cpu"`
	Memory  *string `json:"memory"`
	Timeout *int    `json:"timeout" openapi:"minimum=0" doc:"readiness timeout, seconds; 0 or null: 3600"`
	Kind    string  `json:"kind,omitempty"`
	// Browser configures a browser sandbox; only with kind "browser".
	Browser *BrowserOptions `json:"browser,omitempty"`
	// Desktop configures a desktop sandbox; only with kind "desktop".
	Desktop    *DesktopOptions   `json:"desktop,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	TTLSeconds *int              `json:"ttl_seconds,omitempty" openapi:"minimum=0" doc:"hard cap on the sandbox's age, seconds; 0 or absent: SANDBOX_TTL_HOURS"`
	// EphemeralStorage caps what the sandbox writes to its filesystem; its
	// doc tag is its description in the OpenAPI document.
	EphemeralStorage *string `json:"ephemeral_storage,omitempty" doc:"Kubernetes quantity (\"10Gi\") capping what the sandbox writes to its filesystem, kept on the host's disk, not in memory; writes beyond it fail with ENOSPC (No space left on device). At least 16Mi, at most the host disk's free space; absent: the server's default (DEFAULT_EPHEMERAL_STORAGE, 10Gi)"`
	// Egress limits a network-enabled sandbox to some hosts.
	Egress *Egress `json:"egress,omitempty"`
	// Faults is a fault plan ({"faults": [...]}) injected into the
	// sandbox, for testing the layers that attribute failures.
	Faults *faults.Plan `json:"faults,omitempty"`
	// Snapshot starts the sandbox from a snapshot (POST
	// /sandboxes/{id}/snapshots): its files, and a browser sandbox's
	// browser state. The image and kind are the snapshot's.
	Snapshot *string `json:"snapshot,omitempty" doc:"snapshot id to start from; image and kind then default to the snapshot's and may not differ"`
	// Exec runs in the sandbox before it is ready (and before a snapshot's
	// browser state is restored): a sandbox started from a snapshot
	// carries files, not processes, so this starts what its pages need.
	Exec []string `json:"exec,omitempty" doc:"commands (bash -c, 120 s each) run before the sandbox is ready and before a snapshot's browser state is restored; a failing one fails the sandbox"`
	// Pool claims a ready sandbox of that warm pool (POST /pools).
	Pool string `json:"pool,omitempty" doc:"claim a ready sandbox of this warm pool; its spec must match in every setting a claim cannot change"`
	// Harnesses puts coding-agent harnesses on the sandbox's PATH.
	Harnesses HarnessList `json:"harnesses,omitempty" doc:"coding-agent harnesses on PATH (codex, claude, opencode, pi, hermes), from the server's read-only harness store at /.orchard/harnesses; \"all\" (or [\"all\"]): every installed one; absent: the server's default (DEFAULT_HARNESSES); []: none. Credentials are not stored: pass them per call in env"`
}

// HarnessList is the `harnesses` of a create request: a list of names, or
// the string "all". Nil: the server's default; empty: none.
type HarnessList []string

// UnmarshalJSON accepts a list of names or one name ("all").
func (h *HarnessList) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*h = nil
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*h = HarnessList{one}
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return err
	}
	if list == nil {
		list = []string{}
	}
	*h = list
	return nil
}

// Egress is the `egress` object of a create request.
type Egress struct {
	// Allow lists host patterns ("example.com", "*.wikipedia.org"); empty
	// allows every public host.
	Allow []string `json:"allow"`
	// Mode is "proxy" (the default: HTTP/HTTPS through the sandbox's proxy,
	// filtered by host name and logged) or "full" (a routed interface with
	// NAT, for tools that ignore proxies: private ranges, the host and
	// other sandboxes stay unreachable, but hosts cannot be filtered by
	// name and connections are not logged).
	Mode string `json:"mode,omitempty"`
}

// CreateSandboxResponse is the body POST /sandboxes answers with.
type CreateSandboxResponse struct {
	SandboxID    string `json:"sandbox_id"`
	Namespace    string `json:"namespace"`
	Image        string `json:"image"`
	BlockNetwork bool   `json:"block_network"`
	CPU          string `json:"cpu"`
	Memory       string `json:"memory"`
	Timeout      int    `json:"timeout"`
	Status       string `json:"status"`
	Kind         string `json:"kind"`
	// EphemeralStorage is the sandbox's limit on what it writes.
	EphemeralStorage string `json:"ephemeral_storage,omitempty"`
	// Ready is true when a warm pool handed over a started sandbox.
	Ready bool `json:"ready,omitempty"`
	// Pool names the warm pool the sandbox came from.
	Pool string `json:"pool,omitempty"`
}

// Sandbox is the body of GET /sandboxes/{id} and /wait.
type Sandbox struct {
	SandboxID     string            `json:"sandbox_id"`
	Namespace     string            `json:"namespace"`
	Image         string            `json:"image"`
	PodName       string            `json:"pod_name"`
	BlockNetwork  bool              `json:"block_network"`
	CPU           string            `json:"cpu"`
	Memory        string            `json:"memory"`
	CreatedAt     float64           `json:"created_at"`
	Ready         bool              `json:"ready"`
	Status        string            `json:"status"`
	StatusMessage string            `json:"status_message"`
	Kind          string            `json:"kind"`
	Labels        map[string]string `json:"labels"`
	LastHeartbeat *float64          `json:"last_heartbeat"`
	ExpiresAt     *float64          `json:"expires_at"`
	// Fault classifies why a failed sandbox failed (create error, death).
	Fault *FaultInfo `json:"fault,omitempty"`
	// EphemeralStorage is the sandbox's limit on what it writes.
	EphemeralStorage string `json:"ephemeral_storage,omitempty"`
	// Snapshot is the snapshot the sandbox started from; ForkOf the
	// sandbox it was forked from.
	Snapshot string `json:"snapshot,omitempty"`
	ForkOf   string `json:"fork_of,omitempty"`
}

// SandboxList is the body of GET /sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// DeleteResponse is the body of DELETE /sandboxes/{id}.
type DeleteResponse struct {
	Status    string `json:"status"`
	SandboxID string `json:"sandbox_id"`
}

// Command is a command as the exec endpoint takes it: a string, or a list
// of strings that is joined with single spaces without quoting (an Orchard
// quirk kept for compatibility).
type Command string

// UnmarshalJSON accepts a string or a list of strings.
func (c *Command) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*c = Command(s)
		return nil
	}
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return &json.UnmarshalTypeError{Value: "command", Type: nil, Field: "command"}
	}
	*c = Command(strings.Join(l, " "))
	return nil
}

// ExecRequest is the body of POST /sandboxes/{id}/exec. The doc and
// openapi tags describe fields in the server's OpenAPI document; the
// server enforces the bounds they state.
type ExecRequest struct {
	// Command may not contain a NUL byte (no process can receive one).
	Command        *Command          `json:"command"`
	TimeoutSeconds *int              `json:"timeout_seconds" openapi:"minimum=0" doc:"seconds; 0 or null: DEFAULT_TIMEOUT_SECONDS (300)"`
	Cwd            *string           `json:"cwd" doc:"must be a directory when the command starts, or the job fails (file.path_not_found, file.not_directory); null: the sandbox's working directory"`
	Env            map[string]string `json:"env"`
	LoginShell     bool              `json:"login_shell"`
	Wait           bool              `json:"wait"`
}

// Job is the Orchard job object (§3.11) plus Orchard's classified fault.
type Job struct {
	JobID       string   `json:"job_id"`
	SandboxID   string   `json:"sandbox_id"`
	Command     string   `json:"command"`
	Status      string   `json:"status"`
	Stdout      string   `json:"stdout"`
	Stderr      string   `json:"stderr"`
	ExitCode    *int     `json:"exit_code"`
	CreatedAt   float64  `json:"created_at"`
	StartedAt   *float64 `json:"started_at"`
	CompletedAt *float64 `json:"completed_at"`
	Error       *string  `json:"error"`
	// Fault classifies a failed job whose cause is not the command itself
	// (timeout, OOM, sandbox died). Absent for ordinary non-zero exits.
	Fault     *FaultInfo `json:"fault,omitempty"`
	Truncated bool       `json:"truncated,omitempty"`
	// TimeoutSeconds is the command's timeout; it bounds how long a job
	// may stay unfinished before its runner is presumed lost.
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
	// Runner names the server replica that runs the job.
	Runner string `json:"runner,omitempty"`
	// CancelRequested is set by POST /jobs/{id}/cancel; the runner ends
	// the job when it sees it.
	CancelRequested bool `json:"cancel_requested,omitempty"`
}

// Terminal reports whether the job has finished.
func (j *Job) Terminal() bool { return j.Status == JobSucceeded || j.Status == JobFailed }

// FaultInfo mirrors faults.Info so that api stays free of other packages.
type FaultInfo struct {
	Category  string `json:"category"`
	Source    string `json:"source"`
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

// ExecQueued is the body of a non-waiting exec.
type ExecQueued struct {
	JobID  string `json:"job_id"`
	Status string `json:"status"`
}

// PatchRequest is the body of POST /sandboxes/{id}/apply_patch.
type PatchRequest struct {
	Patch          *string `json:"patch"`
	TimeoutSeconds *int    `json:"timeout_seconds" openapi:"minimum=0" doc:"seconds; 0 or null: 30"`
}

// PatchResult is the body apply_patch answers with.
type PatchResult struct {
	Success  bool    `json:"success"`
	Stdout   string  `json:"stdout"`
	Stderr   string  `json:"stderr"`
	ExitCode *int    `json:"exit_code"`
	Error    *string `json:"error"`
}

// UploadRequest is the body of POST /sandboxes/{id}/files.
type UploadRequest struct {
	Path    *string `json:"path"`
	Content *string `json:"content"` // standard base64
	Mode    string  `json:"mode,omitempty"`
}

// UploadResult is the body an upload answers with.
type UploadResult struct {
	Success bool   `json:"success"`
	Path    string `json:"path"`
	Size    int64  `json:"size"`
}

// FileContent is the body of a download.
type FileContent struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	Size    int64  `json:"size"`
}

// FileEntry is one entry of a directory listing.
type FileEntry struct {
	Name     string  `json:"name"`
	Type     string  `json:"type"` // "file" | "directory"
	Size     int64   `json:"size"`
	Modified *string `json:"modified"`
}

// FileList is the body of a listing.
type FileList struct {
	Path  string      `json:"path"`
	Files []FileEntry `json:"files"`
}

// StatusOK is the body of heartbeat and similar acknowledgements.
type StatusOK struct {
	Status    string `json:"status"`
	SandboxID string `json:"sandbox_id,omitempty"`
}

// Cursor is a desktop's pointer (GET /sandboxes/{id}/desktop/cursor): X, Y
// in the pixels of the latest screenshot (the space actions take
// coordinates in), ScreenX, ScreenY on the screen. Frame and Scale name
// that screenshot (frame 0: none taken yet, so screen pixels).
type Cursor struct {
	X       float64 `json:"x"`
	Y       float64 `json:"y"`
	ScreenX int     `json:"screen_x"`
	ScreenY int     `json:"screen_y"`
	Frame   int64   `json:"frame"`
	Scale   float64 `json:"scale"`
}

// PoolRequest is the body of POST /pools.
type PoolRequest struct {
	Name string `json:"name" doc:"DNS-1123 label"`
	Size int    `json:"size" openapi:"minimum=0" doc:"ready sandboxes kept, 0 to 256"`
	Max  int    `json:"max,omitempty" openapi:"minimum=0" doc:"bound on ready plus starting sandboxes, size to 256; 0 or absent: size"`
	// Sandbox is the spec of the pool's sandboxes.
	Sandbox CreateSandboxRequest `json:"sandbox"`
}

// Pool is a warm pool with its counts (GET /pools/{name}).
type Pool struct {
	Name      string               `json:"name"`
	Size      int                  `json:"size"`
	Max       int                  `json:"max"`
	Sandbox   CreateSandboxRequest `json:"sandbox" doc:"the spec the pool was defined with"`
	CreatedAt float64              `json:"created_at"`
	Ready     int                  `json:"ready" doc:"unclaimed sandboxes ready to hand over"`
	Starting  int                  `json:"starting"`
	Claims    int                  `json:"claims" doc:"creates served by a ready sandbox"`
	Misses    int                  `json:"misses" doc:"creates that found the pool empty and started cold"`
}

// PoolList is the body of GET /pools.
type PoolList struct {
	Pools []Pool `json:"pools"`
}

// DeletePoolResponse is the body of DELETE /pools/{name}.
type DeletePoolResponse struct {
	Status string `json:"status"`
	// Drained counts the unclaimed sandboxes deleted.
	Drained int `json:"drained"`
}
