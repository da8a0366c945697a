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
	"golang.org/x/sys/unix"

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
	args := os.Args[1:]
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	// The server ends on SIGINT and SIGTERM only: its output is a log, and
	// a log reader that goes away (a collector that restarts, a killed
	// `| tee`) must not take every sandbox down with it. The other commands end
	// when their output does. Root has no flags, so the command is the
	// first argument (as for init above).
	outputs := []int{1, 2}
	if len(args) > 0 && args[0] == "serve" {
		outputs = nil
	}
	ctx, release := onClosedOutput(ctx, outputs...)
	err := run(ctx, args, os.Getenv)
	release()
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

// errOutputClosed ends a command whose standard output or error has lost
// its reader.
var errOutputClosed = errors.New("standard output or error closed")

// onClosedOutput returns a context that ends, with errOutputClosed as its
// cause, once the process has written to one of fds (its standard output
// and error) after their reader has gone: `orchard demo | head -1` then
// ends its run and removes its sandboxes instead of being killed mid-run.
// With no fds it never ends for that reason. release ends the watch.
//
// SIGPIPE is the only news of such a write, but the kernel raises it for a
// write to any pipe or socket whose peer has gone, and once the process
// asks for SIGPIPE, Go delivers every one, whichever descriptor was
// written: a client that resets its connection to the server raises the
// same signal as `head` exiting. So a SIGPIPE counts only while one of fds
// is itself closed; the others are dropped, their writes having failed
// with EPIPE, which the code that made them handles.
//
// SIGPIPE is asked for even with no fds: left to Go, a write to a closed
// descriptor 1 or 2 kills the process. It is caught, never ignored: an
// ignored SIGPIPE is inherited by every program the process starts.
func onClosedOutput(parent context.Context, fds ...int) (_ context.Context, release func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGPIPE)
	if len(fds) == 0 {
		// Nothing reads sig: the signals that find it full are dropped.
		return parent, func() {}
	}
	ctx, cancel := context.WithCancelCause(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sig:
				if outputClosed(fds...) {
					cancel(errOutputClosed)
					return
				}
			}
		}
	}()
	// The notification outlives the watch: the process is about to exit,
	// and its last words to a closed stderr must fail, not kill it.
	return ctx, func() { cancel(nil); <-done }
}

// outputClosed reports whether any of fds is a pipe, socket or terminal
// that can no longer be written: its reader has gone or hung up.
func outputClosed(fds ...int) bool {
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
	}
	for {
		_, err := unix.Poll(pfds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false
		}
		break
	}
	for _, p := range pfds {
		if p.Revents&(unix.POLLERR|unix.POLLHUP) != 0 {
			return true
		}
	}
	return false
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
	root.AddCommand(serveCmd(getenv), versionCmd(), demo, harnessCmd(getenv), cleanupCmd())
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
