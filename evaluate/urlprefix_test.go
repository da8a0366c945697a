package evaluate

import (
	"context"
	"testing"

	"github.com/orchard/orchard/tasks"
)

// A url_match prefix ends at a boundary of the URL: the host does not go
// on into another host, the last path segment not into a longer one.
func TestURLPrefixBoundary(t *testing.T) {
	t.Parallel()
	tests := []struct {
		want, got string
		ok        bool
	}{
		{"https://www.amazon.com", "https://www.amazon.com.evil.net/dp/1", false},
		{"https://www.amazon.com", "https://www.amazon.com:8443/", false},
		{"https://github.com/microsoft/", "https://github.com/microsoftdocs/repo", false},
		{"https://example.com/item/12", "https://example.com/item/123", false},
		{"https://www.amazon.com", "https://www.amazon.com/dp/1", true},
		{"https://www.amazon.com", "https://www.amazon.com", true},
		{"https://www.amazon.com", "https://www.amazon.com?x=1", true},
		{"https://github.com/microsoft/", "https://github.com/microsoft", true},
		{"https://github.com/microsoft", "https://github.com/microsoft/vscode", true},
		{"https://example.com/item/12", "https://example.com/item/12#reviews", true},
		{"https://example.com/search?q=", "https://example.com/search?q=lamp", true},
	}
	var e Evaluator
	for _, tt := range tests {
		ev := tasks.Eval{Type: tasks.EvalURLMatch, URL: tt.want}
		r, err := e.Evaluate(context.Background(), ev, Trajectory{}, Env{Page: &fakePage{url: tt.got}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Success != tt.ok {
			t.Errorf("prefix %q of %q = %v, want %v", tt.want, tt.got, r.Success, tt.ok)
		}
	}
}
