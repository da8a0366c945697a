package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/inject"
)

// handleExec runs one command and streams its output as NDJSON ExecEvents,
// ending with the exit event (ORCHARD_COMPAT §4 semantics).
func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) error {
	var req api.AgentExecRequest
	if err := decodeJSON(w, r, maxJSONBody, &req); err != nil {
		return err
	}
	if req.MaxOutputBytes < 0 {
		return faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client, "max_output_bytes must not be negative")
	}
	timeout := s.cfg.ExecTimeout
	if req.TimeoutSeconds > 0 {
		timeout = api.Seconds(req.TimeoutSeconds)
	}
	maxOut := s.cfg.MaxOutputBytes
	if req.MaxOutputBytes > 0 {
		maxOut = req.MaxOutputBytes
	}
	// A directory that is not there fails the request before the
	// command starts: the job fails with the class, and no output.
	dir, err := commandDir(req.Cwd, s.cfg.Cwd)
	if err != nil {
		return err
	}
	env := commandEnv(s.cfg.Env, req.Env)
	spec := runSpec{
		argv:        imageShell(shellArgv(req.Command, req.LoginShell), env, dir),
		dir:         dir,
		env:         env,
		timeout:     timeout,
		maxOutput:   maxOut,
		loginFilter: req.LoginShell,
	}
	if s.stepFault(w, inject.Exec, faults.InjectAgentKill, faults.InjectOOM) == faults.InjectOOM {
		// The step's command becomes a process that outgrows the memory
		// limit, so the kernel kills it as it would a real one.
		if exe, err := os.Executable(); err == nil {
			spec.argv = []string{exe, "hog"}
		}
	} else if !req.LoginShell {
		spec.direct = s.directCommand(r.Context(), req.Command, spec.env, spec.dir)
	}

	// A client that stops reading is treated like one that left: the
	// command is killed rather than left blocked on its full pipe.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	st := &eventStream{w: w, rc: http.NewResponseController(w)}
	exit, err := s.run(ctx, spec, func(stream string, p []byte) {
		if err := st.send(api.ExecEvent{Stream: stream, Data: p}); err != nil {
			cancel(err)
		}
	})
	if err != nil {
		if st.started {
			// The status line is gone; the stream ends without an exit
			// event, which the client reports as a broken stream.
			s.log.Error("exec failed mid-stream", "err", err)
			return nil
		}
		return err
	}
	// The exit event is not flushed: the handler returns next, and
	// net/http writes it with the end of the response in one write (a
	// plain Content-Length body when nothing was streamed before). The
	// client then reads the end of the stream with the event and keeps its
	// pooled connection, instead of finding it mid-stream.
	if err := st.write(api.ExecEvent{Exit: &exit}, false); err != nil {
		s.log.Debug("exec result not delivered", "err", err)
	}
	s.log.Debug("exec done", "exit_code", exit.ExitCode, "timed_out", exit.TimedOut, "truncated", exit.Truncated)
	return nil
}

// eventWriteTimeout bounds the write of one event. Without it a client that
// stops reading would block the stream, and with it the command's timeout,
// forever.
const eventWriteTimeout = 30 * time.Second

// eventStream writes NDJSON events, flushing each so output reaches the
// client as the command produces it.
type eventStream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	started bool
	broken  error // the client went away or stalled; later events are dropped
}

func (st *eventStream) send(ev api.ExecEvent) error { return st.write(ev, true) }

func (st *eventStream) write(ev api.ExecEvent, flush bool) error {
	if st.broken != nil {
		return nil // reported once
	}
	if !st.started {
		st.started = true
		st.w.Header().Set("Content-Type", "application/x-ndjson")
		st.w.Header().Set("X-Content-Type-Options", "nosniff")
		st.w.WriteHeader(http.StatusOK)
		st.enc = json.NewEncoder(st.w)
	}
	_ = st.rc.SetWriteDeadline(time.Now().Add(eventWriteTimeout))
	err := st.enc.Encode(ev)
	if err == nil && flush {
		err = st.rc.Flush()
	}
	if err != nil {
		st.broken = fmt.Errorf("exec stream: write event: %w", err)
		return st.broken
	}
	return nil
}
