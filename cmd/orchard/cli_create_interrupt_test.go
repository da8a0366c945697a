package main

import (
	"context"
	"testing"
	"time"

	"github.com/orchard/orchard/client"
)

// Interrupting `sandbox create --wait` must not leave behind a sandbox
// whose id was never printed.
func TestCLICreateInterruptedLeavesNothing(t *testing.T) {
	c := newCLI(t)
	cl := client.New(c.env["ORCHARD_URL"], c.env["ORCHARD_API_KEY"])
	labels := client.ListOptions{Labels: map[string]string{"suite": "interrupt"}}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		// Interrupt once the server has accepted the create.
		for ctx.Err() == nil {
			if list, _ := cl.ListSandboxes(ctx, labels); len(list) > 0 {
				cancel()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	err := run(ctx, []string{"sandbox", "create", "--wait", "--kind", "browser", "--label", "suite=interrupt"},
		func(k string) string { return c.env[k] })
	cancel()
	if err == nil {
		t.Skip("the sandbox was ready before the interrupt")
	}
	list, lerr := cl.ListSandboxes(context.Background(), labels)
	for _, sb := range list {
		_ = cl.DeleteSandbox(context.Background(), sb.SandboxID)
	}
	if lerr != nil || len(list) > 0 {
		t.Fatalf("create --wait interrupted (%v) left %d sandbox(es) behind (list err %v)", err, len(list), lerr)
	}
}
