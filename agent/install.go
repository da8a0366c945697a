package agent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Install copies the running agent binary to dst (mode 0755), for an init
// container that puts the agent into a volume the sandbox's own image then
// starts it from: the image needs no shell, cp or package manager.
func Install(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install: find own binary: %w", err)
	}
	src, err := os.Open(self)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	// Written beside dst and renamed, so a restarted init container never
	// leaves a half-written binary where the sandbox starts it.
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".orchard-agent-*")
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return fmt.Errorf("install: copy to %s: %w", dst, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return fmt.Errorf("install: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	return nil
}
