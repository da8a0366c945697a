// Package inject decides when a sandbox's fault plan fires. The agent asks
// it at each step (an action or an exec) and the egress proxy at each
// connection; what fires is returned with its truth, so results can carry
// the attribution a correct system must give it.
package inject

import (
	"math/rand/v2"
	"sync"

	"github.com/orchard/orchard/faults"
)

// Injector evaluates one fault plan. The zero of *Injector (nil) never fires.
type Injector struct {
	mu    sync.Mutex // guards rng, fired, steps
	plan  []faults.Injection
	rng   *rand.Rand
	fired []int
	// steps counts steps per domain ("exec", "browser"), so a browser
	// fault's after_steps counts browser actions, not a task's setup execs.
	steps map[string]int
}

// Step domains.
const (
	Exec    = "exec"
	Browser = "browser"
)

// New returns an injector for plan, or nil for an empty plan. seed makes a
// run repeatable; 0 picks one.
func New(plan *faults.Plan, seed uint64) *Injector {
	if plan == nil || len(plan.Faults) == 0 {
		return nil
	}
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Injector{
		plan:  plan.Faults,
		rng:   rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		fired: make([]int, len(plan.Faults)),
		steps: map[string]int{},
	}
}

// Step counts one step of domain and returns its number (1-based).
func (in *Injector) Step(domain string) int {
	if in == nil {
		return 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.steps[domain]++
	return in.steps[domain]
}

// Steps is the number of steps of domain so far; "" counts every domain.
func (in *Injector) Steps(domain string) int {
	if in == nil {
		return 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.stepsLocked(domain)
}

func (in *Injector) stepsLocked(domain string) int {
	if domain != "" {
		return in.steps[domain]
	}
	n := 0
	for _, v := range in.steps {
		n += v
	}
	return n
}

// Connection returns the network fault to apply to a connection to host;
// its after_steps counts steps of every domain.
func (in *Injector) Connection(host string) (faults.Injection, faults.Truth, bool) {
	return in.pick("", func(f faults.Injection) bool {
		return faults.IsNetwork(f.Kind) && faults.MatchHost(f.Match, host)
	}, host)
}

// AtStep returns the step fault of one of kinds to apply now to a step of
// domain, if any; its after_steps counts that domain's steps.
func (in *Injector) AtStep(domain string, kinds ...string) (faults.Injection, faults.Truth, bool) {
	return in.pick(domain, func(f faults.Injection) bool {
		for _, k := range kinds {
			if f.Kind == k {
				return true
			}
		}
		return false
	}, "")
}

func (in *Injector) pick(domain string, match func(faults.Injection) bool, host string) (faults.Injection, faults.Truth, bool) {
	if in == nil {
		return faults.Injection{}, faults.Truth{}, false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for i, f := range in.plan {
		steps := in.stepsLocked(domain)
		if !match(f) || steps < f.AfterSteps || (f.Times > 0 && in.fired[i] >= f.Times) {
			continue
		}
		if f.P < 1 && in.rng.Float64() >= f.P {
			continue
		}
		in.fired[i]++
		t := faults.TruthOf(f)
		t.Host, t.Step = host, steps
		return f, t, true
	}
	return faults.Injection{}, faults.Truth{}, false
}
