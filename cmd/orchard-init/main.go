// Command orchard-init is the init process of Orchard's containers, and
// nothing else: libcontainer starts every container by re-executing the
// server binary as "<server> init", and the server redirects that exec here
// (see runtime/local.ReexecSealed). The server links hundreds of packages
// whose initialisation costs ≈4 ms of CPU per start; this binary links only
// libcontainer, so each sandbox's start-up pays for that alone.
//
// It must come from the same build as the server: both sides of
// libcontainer's start-up protocol are compiled into each. scripts/dev.sh
// builds them together and installs this one beside the server.
package main

import (
	"github.com/opencontainers/runc/libcontainer"
	// Enters the container's namespaces before the Go runtime starts.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

func main() {
	libcontainer.Init()
}
