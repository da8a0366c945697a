package browser

import (
	"context"
	"errors"
	"syscall"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"

	"github.com/orchard/orchard/faults"
)

// InjectCrash kills the browser process, as a crash does: the session
// reports browser.crashed and its owner restarts it.
func (s *Session) InjectCrash() error {
	if s.pid == 0 {
		return errors.New("no browser process")
	}
	return syscall.Kill(s.pid, syscall.SIGKILL)
}

// InjectHang stops every browser process: the next call times out and the
// session finds the browser hung.
func (s *Session) InjectHang() error {
	var err error
	for _, pid := range s.processTree() {
		if e := syscall.Kill(pid, syscall.SIGSTOP); e != nil && err == nil {
			err = e
		}
	}
	return err
}

// hangProbeTimeout is how long the browser process itself gets to answer
// after a call timed out: a busy page stalls its tab, never the browser
// process, which answers in milliseconds even under load.
const hangProbeTimeout = time.Second

// hung tells a slow page from a hung browser after a call timed out.
func (s *Session) hung() bool {
	if s.isClosing() || s.crashError() != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(s.rootCtx, hangProbeTimeout)
	defer cancel()
	b := s.browser()
	if b == nil {
		return false
	}
	_, err := cdp.Call(ctx, b, cdpbrowser.GetVersion, cdp.Empty{})
	return err != nil && ctx.Err() != nil
}

// markHung records the browser as hung and kills it, so its owner
// restarts it as after a crash.
func (s *Session) markHung(cause error) *faults.Error {
	s.mu.Lock()
	if s.crashed != nil {
		defer s.mu.Unlock()
		return s.crashed
	}
	s.crashed = faults.Wrap(cause, faults.CodeBrowserHung, faults.Unavailable, faults.Browser,
		"the browser stopped answering; it is being restarted")
	s.died()
	crashed := s.crashed
	tabs := s.tabs
	s.mu.Unlock()
	s.log.Warn("browser hung; killing it", "pid", s.pid)
	for _, pid := range s.processTree() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, t := range tabs {
		t.interrupt(errTabClosed)
	}
	return crashed
}
