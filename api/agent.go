package api

// The agent's wire protocol: HTTP/1.1 over the sandbox's unix socket. Errors
// use the same envelope as the server ({"detail", "error"}).
//
//	GET  /health                         → AgentHealth
//	POST /exec          AgentExecRequest → NDJSON stream of ExecEvent
//	POST /files/upload  UploadRequest    → UploadResult
//	GET  /files/download?path=           → FileContent
//	GET  /files/list?path=               → FileList
//	POST /patch         AgentPatchRequest → AgentPatchResult
//	GET  /exec/pty      WebSocket, frames per ORCHARD_COMPAT §3.17
//
// An upload's body is read as it arrives and its content written to disk
// as it is decoded; the server sends the path first and the mode, if any,
// after the content, and the file appears only once the body has ended
// whole.

// AgentHealth is the agent's /health body.
type AgentHealth struct {
	Status  string `json:"status"`
	PID     int    `json:"pid"`
	Version string `json:"version,omitempty"`
}

// AgentExecRequest asks the agent to run one command.
type AgentExecRequest struct {
	Command        string            `json:"command"`
	TimeoutSeconds int               `json:"timeout"`
	Cwd            string            `json:"cwd,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	LoginShell     bool              `json:"login_shell"`
	// MaxOutputBytes caps each of stdout and stderr; 0 means the agent default.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
}

// ExecEvent is one line of the agent's exec stream. Output events carry a
// chunk of raw bytes (base64 in JSON); the last event has Exit set.
type ExecEvent struct {
	Stream string    `json:"stream,omitempty"` // "stdout" | "stderr"
	Data   []byte    `json:"data,omitempty"`
	Exit   *ExecExit `json:"exit,omitempty"`
}

// ExecExit ends an exec stream.
type ExecExit struct {
	// ExitCode is the process's status, or -signal when killed by a signal;
	// 124 after a timeout (ORCHARD_COMPAT §4).
	ExitCode  int  `json:"exit_code"`
	TimedOut  bool `json:"timed_out"`
	Signal    int  `json:"signal,omitempty"`
	Truncated bool `json:"truncated,omitempty"`
	// SpawnError is set when the command could not be started at all.
	SpawnError string `json:"spawn_error,omitempty"`
}

// AgentPatchRequest asks the agent to apply a unified diff with git apply.
type AgentPatchRequest struct {
	Patch          string `json:"patch"`
	TimeoutSeconds int    `json:"timeout"`
	Dir            string `json:"dir,omitempty"`
}

// AgentPatchResult is the outcome of git apply.
type AgentPatchResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

// Where the agent's daemons keep their state inside a sandbox: the
// browser's and the desktop's sockets, and next to the browser's its
// profile (<socket>.profile) and open tabs (<socket>.tabs), which a
// browser restarted after a crash takes up again.
const (
	BrowserDaemonSocket = "/run/orchard-browser.sock"
	DesktopDaemonSocket = "/run/orchard-desktop.sock"
)

// DaemonStatePaths are the files of the agent's daemons and of the X
// server (sockets, lock files, the browser's profile and tab list): state
// of processes, which a snapshot leaves out, so that a sandbox started
// from it starts them afresh (an X lock file kept would stop Xvfb
// starting) and takes the browser's state from the snapshot's export.
var DaemonStatePaths = []string{
	BrowserDaemonSocket + "*", DesktopDaemonSocket + "*",
	"/tmp/.X*-lock", "/tmp/.X11-unix",
}
