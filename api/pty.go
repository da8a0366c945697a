package api

// Frames of the PTY protocol (ORCHARD_COMPAT §3.17), spoken over the
// WebSocket of GET /sandboxes/{id}/exec/pty and, unchanged, of the agent's
// /exec/pty. All are JSON text frames; bytes travel as base64 ([]byte).
// The client sends an init frame, then input frames; the sandbox answers
// with ready, then stdout frames, then exit (or error).

// PTY frame types (the "type" key).
const (
	PTYInit   = "init"
	PTYStdin  = "stdin"
	PTYSignal = "signal"
	PTYResize = "resize"
	PTYClose  = "close"
	PTYReady  = "ready"
	PTYStdout = "stdout"
	PTYExit   = "exit"
	PTYError  = "error"
)

// PTYInitFrame is the first frame, with every key present as Orchard
// Env's SDK sends it (env {} and cwd null when unset).
type PTYInitFrame struct {
	Type       string            `json:"type"`
	Cmd        []string          `json:"cmd"`
	Env        map[string]string `json:"env"`
	Cwd        *string           `json:"cwd"`
	Rows       int               `json:"rows"`
	Cols       int               `json:"cols"`
	LoginShell bool              `json:"login_shell"`
}

// PTYInputFrame is a frame the client sends after init: stdin (Data),
// signal (Sig: "TERM", "KILL", "INT", "HUP", "QUIT"), resize (Rows, Cols)
// or close.
type PTYInputFrame struct {
	Type string `json:"type"`
	Data []byte `json:"data,omitempty"`
	Sig  string `json:"sig,omitempty"`
	Rows int    `json:"rows,omitempty"`
	Cols int    `json:"cols,omitempty"`
}

// PTYReadyFrame says the command started (PID 0: it could not be found,
// and an exit frame follows).
type PTYReadyFrame struct {
	Type string `json:"type"`
	PID  int    `json:"pid"`
}

// PTYDataFrame carries terminal output.
type PTYDataFrame struct {
	Type string `json:"type"`
	Data []byte `json:"data"`
}

// PTYExitFrame ends a session whose command ran: its exit code.
type PTYExitFrame struct {
	Type string `json:"type"`
	Code int    `json:"code"`
}

// PTYErrorFrame ends a session that could not run its command.
type PTYErrorFrame struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// PTYOutputFrame is any frame the sandbox sends, as a client reads it.
type PTYOutputFrame struct {
	Type    string `json:"type"`
	PID     int    `json:"pid,omitempty"`
	Data    []byte `json:"data,omitempty"`
	Code    *int   `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}
