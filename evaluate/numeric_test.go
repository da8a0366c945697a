package evaluate

import (
	"context"
	"testing"

	"github.com/orchard/orchard/tasks"
)

// Numeric answers keep their sign as pages print it (Wikipedia writes
// negatives with U+2212 MINUS SIGN), and a hyphen inside a word is no sign.
func TestNumericSigns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ref, answer string
		want        bool
	}{
		{"-3", "The record low is −3 °C", true},
		{"3", "The record low is −3 °C", false},
		{"19", "COVID-19", true},
		{"12", "Model B-12", true},
		{"-5", "it is -5", true},
	}
	var e Evaluator
	for _, tt := range tests {
		ev := tasks.Eval{Type: tasks.EvalAnswerMatch, Mode: tasks.ModeNumeric, References: []string{tt.ref}}
		r, err := e.Evaluate(context.Background(), ev, Trajectory{Answer: tt.answer}, Env{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Success != tt.want {
			t.Errorf("numeric %q vs %q = %v (read %v), want %v", tt.ref, tt.answer, r.Success, r.Details["answer_number"], tt.want)
		}
	}
}
