// Package agent is the in-sandbox HTTP server (exec, PTY, files, patches)
// and the client the server uses to reach it.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"github.com/orchard/orchard/api"
)

// DefaultSocket is where the agent listens inside a sandbox.
const DefaultSocket = "/run/orchard/agent.sock"

// Main parses flags and serves until ctx ends.
func Main(ctx context.Context, args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("orchard-agent", flag.ContinueOnError)
	sock := fs.String("socket", DefaultSocket, "unix socket to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*sock), 0o755); err != nil {
		return err
	}
	_ = os.Remove(*sock)
	ln, err := net.Listen("unix", *sock)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(api.AgentHealth{Status: "ok", PID: os.Getpid()})
	})
	srv := &http.Server{Handler: mux}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
