package local

import (
	"context"
	"errors"
	"fmt"

	"github.com/opencontainers/runc/libcontainer"

	"github.com/orchard/orchard/faults"
)

// Pause freezes every process of the sandbox in place through its freezer
// cgroup: nothing runs, memory and open files stay. Pausing a paused
// sandbox does nothing.
func (l *Local) Pause(ctx context.Context, id string) error {
	return l.freeze(id, true)
}

// Resume thaws a paused sandbox; its processes go on where they stopped.
// Resuming a running sandbox does nothing.
func (l *Local) Resume(ctx context.Context, id string) error {
	return l.freeze(id, false)
}

func (l *Local) freeze(id string, pause bool) error {
	if !idPattern.MatchString(id) {
		return notFound(id)
	}
	s, err := l.lookup(id)
	if err != nil {
		return err
	}
	if s == nil {
		return notFound(id)
	}
	// Serialised with Create and Delete: a delete thaws what it kills, and
	// a pause after it would freeze a sandbox being torn down.
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	c, gone, broken := s.container, s.gone, s.broken
	s.mu.Unlock()
	if gone {
		return notFound(id)
	}
	if c == nil || broken != "" {
		return faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox,
			"sandbox %s is not running%s", id, suffix(broken))
	}
	st, err := c.Status()
	if err != nil {
		return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform, "sandbox "+id+": container status")
	}
	switch {
	case pause && st == libcontainer.Paused, !pause && st == libcontainer.Running:
		return nil
	case st == libcontainer.Stopped:
		return faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox, "sandbox %s is not running", id)
	}
	if pause {
		err = c.Pause()
	} else {
		err = c.Resume()
	}
	if err != nil && !errors.Is(err, libcontainer.ErrNotPaused) {
		verb := "resume"
		if pause {
			verb = "pause"
		}
		return faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform, fmt.Sprintf("%s sandbox %s", verb, id))
	}
	return nil
}

func suffix(why string) string {
	if why == "" {
		return ""
	}
	return ": " + why
}
