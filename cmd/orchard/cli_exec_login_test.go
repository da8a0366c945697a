package main

import (
	"strings"
	"testing"
)

// A login shell's stderr is re-joined when the job ends (CRLF becomes LF,
// ORCHARD_COMPAT §4): what exec streamed before must not make it drop
// what came after.
func TestCLIExecLoginStreamsAll(t *testing.T) {
	c := newCLI(t)
	id := strings.TrimSpace(c.mustRun("sandbox", "create", "--wait"))
	t.Cleanup(func() { c.run("", "sandbox", "rm", id) })
	_, errOut, err := c.run("", "exec", "--login", id, "--", `printf 'a\r\nb\r\nc\r\n' >&2; sleep 1.5; echo tail >&2`)
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if !strings.Contains(errOut, "tail") {
		t.Fatalf("stderr %q: the last line is lost", errOut)
	}
}
