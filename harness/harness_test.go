package harness

import (
	"strings"
	"testing"
)

// Names resolve against the known set and the installed ones: "all" is
// every installed harness; a name that is unknown (a path, say) or not
// installed is refused by name.
func TestHarnessResolve(t *testing.T) {
	installed := []string{"claude", "codex"}
	for _, tc := range []struct {
		asked   []string
		want    string
		errName string
	}{
		{[]string{"codex"}, "codex", ""},
		{[]string{"codex", "claude", "codex"}, "claude,codex", ""},
		{[]string{"all"}, "claude,codex", ""},
		{[]string{"../runtime"}, "", "../runtime"},
		{[]string{"codex", "hermes"}, "", "hermes"},
		{[]string{"Codex"}, "", "Codex"},
	} {
		got, err := Resolve(tc.asked, installed)
		switch {
		case tc.errName != "" && (err == nil || !strings.Contains(err.Error(), `"`+tc.errName+`"`)):
			t.Errorf("Resolve(%q): %v, %v; want an error naming %q", tc.asked, got, err, tc.errName)
		case tc.errName == "" && (err != nil || strings.Join(got, ",") != tc.want):
			t.Errorf("Resolve(%q) = %v, %v; want %s", tc.asked, got, err, tc.want)
		}
	}
}

func TestHarnessNodeVersion(t *testing.T) {
	for v, old := range map[string]bool{"v18.19.0": true, "v20.5.9": true, "v20.6.0": false, "v22.1.0": false, "garbage": true} {
		if got := olderThan(v, minNode); got != old {
			t.Errorf("olderThan(%s) = %v, want %v", v, got, old)
		}
	}
}
