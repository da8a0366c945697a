package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/tasks"
)

// Policy chooses the actions of one episode. The runner asks it once per
// step; a Policy serves a single episode, so it may keep state.
type Policy interface {
	// Next returns the next action, a JSON action object as
	// POST /episodes/{id}/step takes it ({"type":"click","element":3}).
	// ErrStop ends the episode without another action; any other error
	// ends it with outcome error, classified by faults.Of (an
	// unclassified error is policy.failed).
	Next(ctx context.Context, in Input) (json.RawMessage, error)
}

// ErrStop is returned by a Policy that has no more actions: the runner
// finishes the episode as it stands.
var ErrStop = errors.New("policy stops")

// Input is what a Policy sees before a step.
type Input struct {
	Task tasks.Task `json:"task"`
	// Observation is the latest observation, as the episode API returns it.
	Observation json.RawMessage `json:"observation"`
	// Step is the number of the step to choose, from 1.
	Step int `json:"step"`
	// MaxSteps is the episode's step budget.
	MaxSteps int `json:"max_steps"`
	// History is the steps taken so far, oldest first.
	History []Turn `json:"history"`
}

// Turn is one step taken: its action and the classified error the action
// met, if any (the policy's own errors, such as action.no_such_element, do
// not end an episode).
type Turn struct {
	Step   int             `json:"step"`
	Action json.RawMessage `json:"action"`
	Error  *faults.Info    `json:"error,omitempty"`
}

// Factory makes the Policy of one episode: attempt counts the episodes of
// the task in this run, from 1 (a re-queued task gets a fresh policy). An
// error ends that episode with outcome error; the run goes on.
type Factory func(task tasks.Task, attempt int) (Policy, error)

// PolicyFunc adapts a function to Policy.
type PolicyFunc func(ctx context.Context, in Input) (json.RawMessage, error)

// Next calls f.
func (f PolicyFunc) Next(ctx context.Context, in Input) (json.RawMessage, error) { return f(ctx, in) }

// Scripted replays a fixed list of actions per task: lookup returns the
// script of a task id. When the script runs out the episode is finished.
// A task without a script ends its episode with policy.no_script.
func Scripted(lookup func(taskID string) ([]json.RawMessage, bool)) Factory {
	return func(task tasks.Task, _ int) (Policy, error) {
		script, ok := lookup(task.ID)
		if !ok {
			return nil, faults.Newf(faults.CodePolicyNoScript, faults.NotFound, faults.Policy, "no script for task %s", task.ID)
		}
		return PolicyFunc(func(_ context.Context, in Input) (json.RawMessage, error) {
			if in.Step > len(script) {
				return nil, ErrStop
			}
			return script[in.Step-1], nil
		}), nil
	}
}

// randomAnswerP is the chance that the random policy answers at a step
// before its last: small, so most episodes explore a few pages first.
const randomAnswerP = 0.1

// Random is a seeded random policy, a baseline and a load generator: at
// each step it clicks a random set-of-marks element, types short text into
// a text field, scrolls, goes back, or (with probability 0.1, and always
// at the last step) answers a random string. The same seed, task and
// attempt give the same choices for the same observations.
func Random(seed int64) Factory {
	return func(task tasks.Task, attempt int) (Policy, error) {
		h := fnv.New64a()
		fmt.Fprintf(h, "%s\x00%d", task.ID, attempt)
		rng := rand.New(rand.NewPCG(uint64(seed), h.Sum64()))
		return PolicyFunc(func(_ context.Context, in Input) (json.RawMessage, error) {
			return randomAction(rng, in), nil
		}), nil
	}
}

// element is the part of a set-of-marks element the random policy reads.
type element struct {
	ID   int    `json:"id"`
	Role string `json:"role"`
}

// textRoles are the set-of-marks roles that take typed text.
var textRoles = map[string]bool{"textbox": true, "searchbox": true, "combobox": true, "input": true, "textarea": true}

const randomLetters = "abcdefghijklmnopqrstuvwxyz"

func randomWord(rng *rand.Rand) string {
	b := make([]byte, 3+rng.IntN(5))
	for i := range b {
		b[i] = randomLetters[rng.IntN(len(randomLetters))]
	}
	return string(b)
}

func randomAction(rng *rand.Rand, in Input) json.RawMessage {
	var obs struct {
		Elements []element `json:"elements"`
		SOM      []element `json:"som"`
	}
	_ = json.Unmarshal(in.Observation, &obs)
	els := append(obs.Elements, obs.SOM...)
	var inputs []element
	for _, e := range els {
		if textRoles[e.Role] {
			inputs = append(inputs, e)
		}
	}
	var a map[string]any
	switch r := rng.Float64(); {
	case in.Step >= in.MaxSteps || r < randomAnswerP:
		a = map[string]any{"type": "answer", "text": randomWord(rng)}
	case r < 0.55 && len(els) > 0:
		a = map[string]any{"type": "click", "element": els[rng.IntN(len(els))].ID}
	case r < 0.7 && len(inputs) > 0:
		a = map[string]any{"type": "type", "element": inputs[rng.IntN(len(inputs))].ID, "text": randomWord(rng)}
	case r < 0.9:
		dy := 300
		if rng.IntN(2) == 0 {
			dy = -300
		}
		a = map[string]any{"type": "scroll", "dx": 0, "dy": dy}
	default:
		a = map[string]any{"type": "back"}
	}
	b, _ := json.Marshal(a)
	return b
}
