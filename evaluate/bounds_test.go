package evaluate

import (
	"context"
	"testing"

	"github.com/orchard/orchard/tasks"
)

// A reference that starts or ends with a digit matches whole numbers only:
// "3 results" is not in "13 results", GAIA's "17" is not in "170".
func TestContainsNumberBoundaries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ref, answer string
		want        bool
	}{
		{"3 results", "There are 13 results.", false},
		{"3 results", "There are 3 results.", true},
		{"17", "It would take 170 thousand hours", false},
		{"17", "about 2017", false},
		{"17", "17 thousand hours", true},
		{"17", "(17)", true},
		{"3", "3,000 items", false},
		{"3", "3.5 stars", false},
		{"3", "1.3 stars", false},
		{"3", "The answer is 3.", true},
		{"3", "13, then 3", true},
		{"lasagna", "Spinach Lasagna recipe", true},
	}
	var e Evaluator
	for _, tt := range tests {
		ev := tasks.Eval{Type: tasks.EvalAnswerMatch, References: []string{tt.ref}}
		r, err := e.Evaluate(context.Background(), ev, Trajectory{Answer: tt.answer}, Env{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Success != tt.want {
			t.Errorf("contains %q in %q = %v, want %v", tt.ref, tt.answer, r.Success, tt.want)
		}
	}
}
