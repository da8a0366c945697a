// Command orchard-agent is the in-sandbox agent: it runs as the sandbox's
// PID 1 and serves the agent protocol (exec, PTY, files, patches) over HTTP
// on a unix socket that the server reaches from the host. Its subcommands
// run the sandbox's daemons: the browser, the desktop, and the offline
// sites that bundled tasks browse (`orchard-agent sites`);
// `orchard-agent install PATH` copies the agent to PATH (a Kubernetes init
// container's job). With --listen and --token-sha256 it serves a pod's
// network instead of a unix socket.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/orchard/orchard/agent"
	"github.com/orchard/orchard/sites"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	run := func() error { return agent.Main(ctx, os.Args[1:], os.Getenv) }
	if len(os.Args) > 1 && os.Args[1] == "hog" {
		agent.Hog()
	}
	if len(os.Args) > 1 && os.Args[1] == "desktop" {
		run = func() error { return agent.DesktopMain(ctx, os.Args[2:]) }
	}
	if len(os.Args) > 1 && os.Args[1] == "browser" {
		run = func() error { return agent.BrowserMain(ctx, os.Args[2:]) }
	}
	if len(os.Args) == 3 && os.Args[1] == "install" {
		run = func() error { return agent.Install(os.Args[2]) }
	}
	if len(os.Args) > 1 && os.Args[1] == "sites" {
		run = func() error { return agent.SitesMain(ctx, os.Args[2:], sites.Handler(), sites.Header) }
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "orchard-agent:", err)
		os.Exit(1)
	}
}
