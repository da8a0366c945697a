// Package agentbin locates the static agent binary the server injects into
// every sandbox: embedded in the server (built with -tags embedagent), named
// by ORCHARD_AGENT, or installed beside the server binary. Nothing is built
// at run time.
package agentbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// Resolve returns the host path of the agent binary. An embedded agent is
// written once into dir (content-addressed, so upgrades never reuse a stale
// copy); explicit names the binary directly.
func Resolve(dir, explicit string) (string, error) {
	if explicit != "" {
		return checkExecutable(explicit)
	}
	if len(embedded) > 0 {
		sum := sha256.Sum256(embedded)
		path := filepath.Join(dir, "orchard-agent-"+hex.EncodeToString(sum[:8]))
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", fmt.Errorf("install embedded agent: %w", err)
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, embedded, 0o755); err != nil {
			return "", fmt.Errorf("install embedded agent: %w", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return "", fmt.Errorf("install embedded agent: %w", err)
		}
		return path, nil
	}
	exe, err := os.Executable()
	if err == nil {
		if p, err := checkExecutable(filepath.Join(filepath.Dir(exe), "orchard-agent")); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no agent binary: build the server with -tags embedagent (scripts/build.sh does), " +
		"install orchard-agent beside the orchard binary, or set ORCHARD_AGENT")
}

func checkExecutable(p string) (string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("agent binary: %w", err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("agent binary %s is not an executable file", p)
	}
	return filepath.Abs(p)
}
