// Command pause is the sandbox ("pause") container of the local Kubernetes
// node that scripts/kube.sh starts: it holds a pod's namespaces, reaps the
// zombies reparented to it, and exits on SIGTERM or SIGINT. There is no
// registry to pull the upstream image from, so scripts/kubeimage builds this
// one (statically, CGO_ENABLED=0) into orchard.local/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// One SIGCHLD can stand for several exited children.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
