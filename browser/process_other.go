//go:build !linux

package browser

import "os/exec"

func smallShm() bool { return false }

func (s *Session) processTree() []int {
	if s.pid > 0 {
		return []int{s.pid}
	}
	return nil
}

// killLeftovers is a no-op where processes cannot be found by their
// command line; the browser itself is killed by its context.
func (s *Session) killLeftovers() {}

func (s *Session) noteBrowser() {}

func (s *Session) reap() {}

func keepWithParent(*exec.Cmd) {}
