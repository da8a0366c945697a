package main

import (
	"strings"
	"testing"
)

// exec's own message about a failed job starts a line of its own, even
// when the command's stderr ended without a newline (a timeout's note).
func TestCLIExecMessageOnItsOwnLine(t *testing.T) {
	c := newCLI(t)
	id := strings.TrimSpace(c.mustRun("sandbox", "create", "--wait"))
	t.Cleanup(func() { c.run("", "sandbox", "rm", id) })
	_, errOut, err := c.run("", "exec", "--timeout", "1", id, "--", "sleep 5")
	if code := exitCodeOf(err); code != 124 {
		t.Fatalf("exit %d, want 124", code)
	}
	if !strings.HasSuffix(errOut, "and was killed\norchard: Command timed out after 1s (sandbox.exec_timeout)\n") {
		t.Fatalf("stderr %q: the message is not on a line of its own", errOut)
	}
}
