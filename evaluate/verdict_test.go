package evaluate

import "testing"

// The "Status:" line decides, whatever follows it: a verdict word in a
// note after it, or "status" used as an ordinary word, must not flip it.
func TestParseVerdictStatusLine(t *testing.T) {
	t.Parallel()
	tests := []struct{ reply, want string }{
		{"The cart shows the item.\nStatus: FAILURE. The order status page shows success.", VerdictFailure},
		{"Reasoning...\nStatus: SUCCESS\n\nNote: the earlier failure to load the page was recovered.", VerdictSuccess},
		{"Status: SUCCESS — the flight status page lists the flight.", VerdictSuccess},
		{"**Status:** NOT SUCCESS", VerdictFailure},
		{"Thoughts: it failed at first but then succeeded.\nStatus: \"success\"", VerdictSuccess},
	}
	for _, tt := range tests {
		if got, ok := parseVerdict(tt.reply); got != tt.want || !ok {
			t.Errorf("parseVerdict(%q) = %q, %v; want %q", tt.reply, got, ok, tt.want)
		}
	}
}
