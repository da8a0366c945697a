package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/creack/pty"
	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

const (
	// ptyInitTimeout is how long a client has to send its init frame
	// (ORCHARD_COMPAT §3.17).
	ptyInitTimeout = 10 * time.Second
	// ptyPingInterval keeps the sync SDK alive: it gives up on a socket
	// after 10 s without a frame, and answering a ping counts.
	ptyPingInterval = 5 * time.Second
	// ptyMaxMessage is the largest client frame accepted.
	ptyMaxMessage = 4 << 20
	// ptyReadChunk caps the raw bytes of one stdout frame.
	ptyReadChunk = 64 << 10
	// ptyWriteTimeout: a client that cannot take a frame in this long is
	// treated as gone.
	ptyWriteTimeout = 10 * time.Second
	// ptyHangupGrace is how long a child may take to honour SIGTERM after
	// its client disappeared before it is killed; without it a child that
	// ignores TERM would hold the session (and its goroutines) forever.
	ptyHangupGrace = 5 * time.Second
	// ptyMaxPendingStdin bounds input queued for a child that does not
	// read it; more is dropped rather than buffered without limit.
	ptyMaxPendingStdin = 16 << 20
	// ptyCloseWait is how long the client gets to answer our close frame.
	ptyCloseWait = time.Second

	closeBadInit  = 4400
	closeInternal = 4500
)

// ptySignals are the signal names a client may send; anything else is TERM.
var ptySignals = map[string]syscall.Signal{
	"TERM": syscall.SIGTERM,
	"KILL": syscall.SIGKILL,
	"INT":  syscall.SIGINT,
	"HUP":  syscall.SIGHUP,
	"QUIT": syscall.SIGQUIT,
}

// handlePTY runs one interactive command on a pseudo-terminal over a
// WebSocket.
func (s *Server) handlePTY(w http.ResponseWriter, r *http.Request) error {
	if !websocket.IsWebSocketUpgrade(r) {
		return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "/exec/pty needs a WebSocket upgrade")
	}
	up := websocket.Upgrader{
		ReadBufferSize:  32 << 10,
		WriteBufferSize: 32 << 10,
		// Only the server reaches the agent's socket; it checks origins.
		CheckOrigin: func(*http.Request) bool { return true },
	}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		return nil // Upgrade has answered the client
	}
	ps := &ptySession{s: s, conn: conn, log: s.log.With("op", "pty")}
	ps.serve(r.Context())
	return nil
}

type ptySession struct {
	s    *Server
	conn *websocket.Conn
	log  *slog.Logger

	wmu sync.Mutex // guards data-frame writes: gorilla allows one writer

	// mu guards exited: signals from the client go to the group only while
	// the child has not been reaped.
	mu     sync.Mutex
	exited bool
}

// send writes one frame.
func (ps *ptySession) send(v any) error {
	ps.wmu.Lock()
	defer ps.wmu.Unlock()
	_ = ps.conn.SetWriteDeadline(time.Now().Add(ptyWriteTimeout))
	return ps.conn.WriteJSON(v)
}

// closeWith sends a close frame with code; the socket itself is closed by
// serve.
func (ps *ptySession) closeWith(code int, reason string) {
	_ = ps.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(ptyCloseWait))
}

// fail reports a session error and closes with code.
func (ps *ptySession) fail(code int, msg string) {
	_ = ps.send(api.PTYErrorFrame{Type: api.PTYError, Message: msg})
	ps.closeWith(code, "")
	ps.awaitClose()
}

// awaitClose gives the client a moment to answer the close frame, so it
// reads a clean close rather than a reset, then closes the socket.
func (ps *ptySession) awaitClose() {
	_ = ps.conn.SetReadDeadline(time.Now().Add(ptyCloseWait))
	for {
		if _, _, err := ps.conn.ReadMessage(); err != nil {
			break
		}
	}
	ps.conn.Close()
}

// readInit reads and checks the init frame. When it is not acceptable, msg
// is the text of the client's error frame, or "" if the client left.
func (ps *ptySession) readInit() (init api.PTYInitFrame, msg string, ok bool) {
	_ = ps.conn.SetReadDeadline(time.Now().Add(ptyInitTimeout))
	mt, data, err := ps.conn.ReadMessage()
	if err != nil {
		var ne net.Error
		var ce *websocket.CloseError
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			return init, "init timeout", false
		case errors.As(err, &ce):
			return init, "", false
		}
		return init, "bad init frame: " + err.Error(), false
	}
	_ = ps.conn.SetReadDeadline(time.Time{})
	if mt != websocket.TextMessage {
		return init, "bad init frame: expected a text frame", false
	}
	if err := json.Unmarshal(data, &init); err != nil {
		return init, "bad init frame: " + err.Error(), false
	}
	switch {
	case init.Type != api.PTYInit:
		return init, fmt.Sprintf("bad init frame: type is %q, want \"init\"", init.Type), false
	case len(init.Cmd) == 0:
		return init, "bad init frame: cmd must be a non-empty list", false
	case init.Cmd[0] == "":
		return init, "bad init frame: cmd[0] is empty", false
	}
	return init, "", true
}

func (ps *ptySession) serve(ctx context.Context) {
	ps.conn.SetReadLimit(ptyMaxMessage)
	init, msg, ok := ps.readInit()
	switch {
	case ok:
		ps.run(ctx, init)
	case msg != "":
		ps.fail(closeBadInit, msg)
	default:
		ps.conn.Close() // the client left before init
	}
}

// ptyWinsize clamps a requested size; zero or negative means the default.
func ptyWinsize(rows, cols int) *pty.Winsize {
	clamp := func(v, def int) uint16 {
		switch {
		case v <= 0:
			return uint16(def)
		case v > 0xffff:
			return 0xffff
		}
		return uint16(v)
	}
	return &pty.Winsize{Rows: clamp(rows, 24), Cols: clamp(cols, 80)}
}

// shellQuote quotes s for a POSIX shell like Python's shlex.quote.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	if !shellUnsafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}

var shellUnsafe = regexp.MustCompile(`[^A-Za-z0-9_@%+=:,./-]`)

// ptyArgv is the argv of an init frame. The login shell is bash, or the
// image's sh (busybox, Alpine) when it has no bash.
func ptyArgv(init api.PTYInitFrame, env []string, dir string) []string {
	if !init.LoginShell {
		return init.Cmd
	}
	q := make([]string, len(init.Cmd))
	for i, a := range init.Cmd {
		q[i] = shellQuote(a)
	}
	return imageShell([]string{"bash", "--login", "-i", "-c", loginPrelude + strings.Join(q, " ")}, env, dir)
}

// openPTY opens a pseudo-terminal pair of the given size. The master is
// returned in non-blocking mode so that the runtime poller serves it: a
// blocked Read then ends when the master is closed, which is how output is
// cut off after the drain. (creack/pty leaves it blocking, because asking
// for the slave's name goes through File.Fd.)
func openPTY(ws *pty.Winsize) (master, tty *os.File, err error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	defer m.Close()
	fd, err := syscall.Dup(int(m.Fd()))
	if err != nil {
		tty.Close()
		return nil, nil, fmt.Errorf("dup pty master: %w", err)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		tty.Close()
		return nil, nil, fmt.Errorf("pty master non-blocking: %w", err)
	}
	master = os.NewFile(uintptr(fd), m.Name())
	if err := setWinsize(master, ws); err != nil {
		master.Close()
		tty.Close()
		return nil, nil, fmt.Errorf("set pty size: %w", err)
	}
	return master, tty, nil
}

// setWinsize is pty.Setsize done through SyscallConn. pty.Setsize uses
// File.Fd, which holds no reference: a resize frame that arrives as the
// session ends could read the master's number, lose it to Close, and ioctl
// whatever descriptor (another session's terminal) reuses it. Control keeps
// the descriptor open for the call, and fails once the master is closed.
func setWinsize(f *os.File, ws *pty.Winsize) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(ws)))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// run starts the command and relays until it has exited and its output has
// been drained.
func (ps *ptySession) run(ctx context.Context, init api.PTYInitFrame) {
	def := ps.s.cfg.Cwd
	dir := ""
	if init.Cwd != nil {
		dir = *init.Cwd
	}
	dir, err := commandDir(dir, def)
	if err != nil {
		// Closed as a bad init frame is: the client's mistake, not the agent's.
		ps.fail(closeBadInit, faults.Of(err).Message)
		return
	}
	env := commandEnv(ps.s.cfg.Env, init.Env)
	if _, ok := envValue(env, "TERM"); !ok {
		env = append(env, "TERM=xterm-256color")
	}
	argv := ptyArgv(init, env, dir)

	path, err := lookPath(argv[0], env, dir)
	if err != nil {
		ps.notFound(argv[0], err)
		return
	}
	master, tty, err := openPTY(ptyWinsize(init.Rows, init.Cols))
	if err != nil {
		ps.log.Error("pty spawn", "err", err)
		ps.fail(closeInternal, "spawn failed: "+err.Error())
		return
	}
	defer master.Close()
	c, err := ps.s.reaper.startProcess(func() (*os.Process, error) {
		return os.StartProcess(path, argv, &os.ProcAttr{
			Dir:   dir,
			Env:   env,
			Files: []*os.File{tty, tty, tty},
			// A new session with the pty as its controlling terminal:
			// job control, ^C and SIGHUP behave as in a terminal, and
			// signals to the group reach everything the command started.
			Sys: &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
		})
	})
	tty.Close() // the child has its copies; ours would keep EIO from coming
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			ps.notFound(argv[0], err)
			return
		}
		ps.log.Error("pty spawn", "err", err)
		ps.fail(closeInternal, "spawn failed: "+err.Error())
		return
	}
	if err := ps.send(api.PTYReadyFrame{Type: api.PTYReady, PID: c.pid}); err != nil {
		ps.log.Debug("pty client gone before ready", "err", err)
	}

	stop := make(chan struct{}) // closed when the session ends
	var wg sync.WaitGroup
	defer wg.Wait()

	outDone := make(chan struct{})
	go func() {
		defer close(outDone)
		ps.pumpOutput(master)
	}()

	stdin := newStdinQueue()
	wg.Go(func() { ps.pumpInput(master, stdin, stop) })
	wg.Go(func() { ps.ping(stop) })
	gone := make(chan struct{}) // closed when the client left
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(gone)
		ps.readClient(c, master, stdin)
	}()

	var killAfter <-chan time.Time
	ctxDone, goneCh := ctx.Done(), (<-chan struct{})(gone)
wait:
	for {
		select {
		case <-c.done:
			break wait
		case <-goneCh:
			goneCh = nil
			ps.signal(c, syscall.SIGTERM)
			killAfter = time.After(ptyHangupGrace)
		case <-killAfter:
			killAfter = nil
			ps.signal(c, syscall.SIGKILL)
		case <-ctxDone:
			// The agent is shutting down.
			ctxDone = nil
			ps.signal(c, syscall.SIGKILL)
		}
	}
	ps.mu.Lock()
	ps.exited = true
	ps.mu.Unlock()

	// Drain what the child wrote before it exited; a background process
	// that keeps the terminal open does not hold the session beyond this.
	select {
	case <-outDone:
	case <-time.After(exitDrain):
	}
	master.Close()
	<-outDone

	code, _ := c.exitCode()
	_ = ps.send(api.PTYExitFrame{Type: api.PTYExit, Code: code})
	ps.closeWith(websocket.CloseNormalClosure, "")
	close(stop)
	select {
	case <-readerDone: // the client answered the close frame or left
	case <-time.After(ptyCloseWait):
	}
	ps.conn.Close()
	<-readerDone
}

// notFound answers a command that does not exist the way Orchard's
// pty_runner does: as terminal output and exit 127, not as an error frame.
// There is no process, so ready carries pid 0.
func (ps *ptySession) notFound(argv0 string, err error) {
	ps.log.Debug("pty command not found", "argv0", argv0, "err", err)
	_ = ps.send(api.PTYReadyFrame{Type: api.PTYReady, PID: 0})
	_ = ps.send(api.PTYDataFrame{Type: api.PTYStdout, Data: []byte("pty_runner: command not found: " + argv0 + "\r\n")})
	_ = ps.send(api.PTYExitFrame{Type: api.PTYExit, Code: 127})
	ps.closeWith(websocket.CloseNormalClosure, "")
	ps.awaitClose()
}

// signal delivers sig to the child's process group while it is not reaped.
func (ps *ptySession) signal(c *child, sig syscall.Signal) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.exited {
		return
	}
	if err := c.signalGroup(sig); err != nil {
		ps.log.Warn("signal pty group", "pid", c.pid, "sig", sig, "err", err)
	}
}

// pumpOutput sends terminal output as stdout frames until the master ends
// (EIO once no process holds the terminal, or our Close). After a failed
// send it keeps reading so that the child never blocks on a full terminal.
func (ps *ptySession) pumpOutput(master *os.File) {
	buf := make([]byte, ptyReadChunk)
	broken := false
	for {
		n, err := master.Read(buf)
		if n > 0 && !broken {
			if serr := ps.send(api.PTYDataFrame{Type: api.PTYStdout, Data: buf[:n]}); serr != nil {
				broken = true
			}
		}
		if err != nil {
			return
		}
	}
}

// readClient acts on client frames until the connection ends.
func (ps *ptySession) readClient(c *child, master *os.File, stdin *stdinQueue) {
	closed := false // after a close frame, frames are read but ignored
	for {
		mt, data, err := ps.conn.ReadMessage()
		if err != nil {
			return
		}
		if closed || mt != websocket.TextMessage {
			continue
		}
		var f api.PTYInputFrame
		if json.Unmarshal(data, &f) != nil {
			continue // unparseable frames are ignored
		}
		switch f.Type {
		case api.PTYStdin:
			if !stdin.push(f.Data) {
				ps.log.Warn("pty stdin dropped: child is not reading", "bytes", len(f.Data))
			}
		case api.PTYSignal:
			sig, ok := ptySignals[strings.ToUpper(f.Sig)]
			if !ok {
				sig = syscall.SIGTERM
			}
			ps.signal(c, sig)
		case api.PTYResize:
			_ = setWinsize(master, ptyWinsize(f.Rows, f.Cols)) // errors ignored, as in Orchard
		case api.PTYClose:
			ps.signal(c, syscall.SIGTERM)
			closed = true
		}
	}
}

// pumpInput writes queued stdin to the terminal. It runs apart from
// readClient so that a child that does not read its input cannot delay the
// client's signals.
func (ps *ptySession) pumpInput(master *os.File, q *stdinQueue, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-q.wake:
		}
		for {
			p, ok := q.pop()
			if !ok {
				break
			}
			if _, err := master.Write(p); err != nil {
				return // the master is closed: the session is over
			}
		}
	}
}

// ping keeps the client's read timeouts from firing while the command is
// quiet.
func (ps *ptySession) ping(stop <-chan struct{}) {
	t := time.NewTicker(ptyPingInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			_ = ps.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(ptyWriteTimeout))
		}
	}
}

// stdinQueue is the input waiting for the terminal, bounded in bytes.
type stdinQueue struct {
	mu      sync.Mutex // guards pending and size
	pending [][]byte
	size    int
	wake    chan struct{} // has a token while pending is non-empty
}

func newStdinQueue() *stdinQueue { return &stdinQueue{wake: make(chan struct{}, 1)} }

// push queues p; false means it was dropped because the queue is full.
func (q *stdinQueue) push(p []byte) bool {
	if len(p) == 0 {
		return true
	}
	q.mu.Lock()
	if q.size+len(p) > ptyMaxPendingStdin {
		q.mu.Unlock()
		return false
	}
	q.pending = append(q.pending, p)
	q.size += len(p)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

func (q *stdinQueue) pop() ([]byte, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) == 0 {
		return nil, false
	}
	p := q.pending[0]
	q.pending = q.pending[1:]
	q.size -= len(p)
	return p, true
}
