// Command orchard is Orchard's server and command-line client: `orchard
// serve` runs the API on this machine; the other commands talk to a server.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/orchard/orchard/runtime/local"
)

func init() {
	// libcontainer re-executes this binary as the container's init
	// process; that path must run before anything else.
	if len(os.Args) > 1 && os.Args[1] == "init" {
		local.Init()
	}
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exitError carries a command's exit code out of cobra.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	// SIGPIPE too: `orchard demo | head` closes the pipe while sandboxes
	// run; without it the write kills the process before it removes them.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGPIPE)
	err := run(ctx, os.Args[1:], os.Getenv)
	stop()
	var ee exitError
	switch {
	case errors.As(err, &ee):
		os.Exit(ee.code)
	case err != nil:
		fmt.Fprintln(os.Stderr, "orchard:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	root := &cobra.Command{
		Use:           "orchard",
		Short:         "Orchard: sandboxes for AI agents (shell, browser, desktop)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	demo := demoCmd(getenv)
	wrapErrors(demo)
	root.AddCommand(serveCmd(getenv), versionCmd(), demo)
	addClientCommands(root, getenv)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "orchard", version)
			return nil
		},
	}
}
