// Package ordered runs the actions of one GUI request in order, stopping
// at the first that fails: the loop the browser and the desktop share, so
// that both answer a failed action the same way (API.md: an action that
// fails on the page or the screen is a result, not an error).
package ordered

import (
	"context"

	"github.com/orchard/orchard/faults"
)

// Run runs step on each action in order and stops after the first that
// fails. step returns the action's result, its error already recorded in
// it, and that error. Run returns one result per action run: all of them,
// or up to and including the failed one.
//
// Run's error is non-nil only when the session cannot go on — dead, asked
// after a failure, reports why — or ctx ended (then it is the failed
// action's classified error). Otherwise failed, when not nil, is told of
// the failure (for the session's log) and Run's error is nil.
func Run[A, R any](ctx context.Context, actions []A, step func(context.Context, A) (R, error), dead func() error, failed func(A, *faults.Error)) ([]R, error) {
	results := make([]R, 0, len(actions))
	for _, a := range actions {
		r, err := step(ctx, a)
		results = append(results, r)
		if err == nil {
			continue
		}
		if derr := dead(); derr != nil {
			return results, derr
		}
		fe := faults.Of(err)
		if ctx.Err() != nil {
			return results, fe
		}
		if failed != nil {
			failed(a, fe)
		}
		return results, nil
	}
	return results, nil
}
