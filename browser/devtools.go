package browser

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// devToolsPortFile is where Chromium writes the port and browser path of
// its DevTools endpoint, in the profile directory.
const devToolsPortFile = "DevToolsActivePort"

// devToolsWait bounds the wait for DevToolsActivePort after the browser
// answered on its pipe; the endpoint opens during startup, so this is
// normally immediate.
const devToolsWait = 5 * time.Second

// devToolsCmd adds the debugging port to the browser's command line while
// the session itself stays on the pipe: chromedp would switch to a
// WebSocket connection if the port were one of its flags.
func devToolsCmd(cmd *exec.Cmd) {
	extra := []string{"--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1"}
	// The last argument is the start URL; switches go before it.
	if n := len(cmd.Args); n > 1 {
		args := append([]string{}, cmd.Args[:n-1]...)
		args = append(args, extra...)
		cmd.Args = append(args, cmd.Args[n-1])
	} else {
		cmd.Args = append(cmd.Args, extra...)
	}
	keepWithParent(cmd)
}

// readDevToolsURL waits for the profile's DevToolsActivePort and returns
// the browser-level WebSocket URL it names.
func readDevToolsURL(ctx context.Context, dir string) (string, error) {
	deadline := time.Now().Add(devToolsWait)
	for {
		b, err := os.ReadFile(filepath.Join(dir, devToolsPortFile))
		if err == nil {
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) == 2 {
				port, perr := strconv.Atoi(strings.TrimSpace(lines[0]))
				path := strings.TrimSpace(lines[1])
				if perr == nil && port > 0 && strings.HasPrefix(path, "/devtools/browser/") {
					return fmt.Sprintf("ws://127.0.0.1:%d%s", port, path), nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no DevTools endpoint: %s not written", devToolsPortFile)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// DevToolsURL is the browser-level DevTools WebSocket URL
// (ws://127.0.0.1:PORT/devtools/browser/ID) that other clients attach to,
// or "" when Options.DevTools is off.
func (s *Session) DevToolsURL() string { return s.devToolsURL }
