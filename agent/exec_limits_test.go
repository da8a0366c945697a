package agent

import (
	"testing"

	"github.com/orchard/orchard/api"
)

// A very large timeout must mean "a long time", not overflow time.Duration
// into a negative one that times the command out at once.
func TestExecHugeTimeout(t *testing.T) {
	a := startAgent(t, nil)
	r := a.exec(t, api.AgentExecRequest{Command: "echo hi", TimeoutSeconds: 10_000_000_000})
	if r.exit.ExitCode != 0 || r.exit.TimedOut || string(r.stdout) != "hi\n" {
		t.Fatalf("exit %+v stdout %q stderr %q; want exit 0, \"hi\\n\"", r.exit, r.stdout, r.stderr)
	}
}

// The output cap must not cut a UTF-8 character in half: the stray lead
// byte would decode to a U+FFFD the command never wrote.
func TestExecCapKeepsWholeRunes(t *testing.T) {
	a := startAgent(t, nil)
	for _, tt := range []struct {
		cmd  string
		max  int64
		want string
	}{
		{`printf 'a\xc3\xa9b'`, 2, "a"},                    // 2-byte character split
		{`printf 'a\xe2\x82\xacb'`, 3, "a"},                // 3-byte character split
		{`printf 'a\xf0\x9f\x98\x80b'`, 4, "a"},            // 4-byte character split
		{`printf 'a\xc3\xa9b'`, 3, "a\xc3\xa9"},            // cap on a boundary
		{`printf 'a\xff\xfe\xfdb'`, 2, "a\xff"},            // invalid bytes cut as they are
		{`printf 'a\xe2\x82\xe2\x82\xac'`, 4, "a\xe2\x82"}, // truncated sequence kept, next one split
	} {
		r := a.exec(t, api.AgentExecRequest{Command: tt.cmd, MaxOutputBytes: tt.max})
		want := tt.want + string(truncationMarker(tt.max))
		if string(r.stdout) != want || !r.exit.Truncated {
			t.Errorf("%s cap %d: stdout = %q (exit %+v), want %q", tt.cmd, tt.max, r.stdout, r.exit, want)
		}
	}
}
