package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// An interrupted exec (Ctrl-C) cancels its job: the remote command dies,
// the output it wrote is printed, and exec exits 130.
func TestCLIExecInterruptCancelsTheCommand(t *testing.T) {
	c := newCLI(t)
	id := strings.TrimSpace(c.mustRun("sandbox", "create", "--wait"))
	t.Cleanup(func() { c.run("", "sandbox", "rm", id) })

	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	go func() {
		// Interrupt once the command has printed its first line.
		for ctx.Err() == nil {
			jobs, _ := c.srv.Manager.Store().ListJobs(ctx)
			for _, j := range jobs {
				if j.SandboxID == id && j.Stdout == "started\n" {
					interrupt()
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	out, errOut, err := c.runCtx(ctx, "", "exec", id, "--", "echo started; sleep 60; echo late")
	if code := exitCodeOf(err); code != 130 {
		t.Fatalf("exit %d (%v), want 130; stderr %q", code, err, errOut)
	}
	if out != "started\n" {
		t.Fatalf("stdout %q, want the output written before the interrupt", out)
	}
	if !strings.Contains(errOut, "canceled ("+faults.CodeJobCanceled+")") {
		t.Fatalf("stderr %q does not say the job was canceled", errOut)
	}
	// Nothing of the command is left running once the agent has killed
	// its group, which it does as the server lets go of the command.
	deadline := time.Now().Add(10 * time.Second)
	for {
		probe, _, err := c.run("", "exec", id, "--", testenv.ProcessesNamed("sleep"))
		if err == nil && probe == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the interrupted command's sleep still runs: %q %v", probe, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
