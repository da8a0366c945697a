package tasks

import (
	"slices"
	"strings"
	"sync"

	"github.com/orchard/orchard/faults"
)

// Registry holds the loaded task suites. It is safe for concurrent use.
type Registry struct {
	mu     sync.RWMutex      // guards suites
	suites map[string][]Task // suite name → its tasks, in file order
}

// SuiteInfo describes a loaded suite.
type SuiteInfo struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return &Registry{suites: map[string][]Task{}} }

// Add loads ts as suite, replacing a suite of the same name. Every task is
// validated; duplicate ids within the suite are refused. Each task's Suite
// is set to suite.
func (r *Registry) Add(suite string, ts []Task) error {
	if strings.TrimSpace(suite) == "" || strings.Contains(suite, "/") {
		return invalid("suite name %q: want a non-empty name without '/'", suite)
	}
	cp := make([]Task, len(ts))
	seen := make(map[string]int, len(ts))
	for i, t := range ts {
		if err := t.Validate(); err != nil {
			return invalid("suite %s: index %d: %v", suite, i, err)
		}
		if first, dup := seen[t.ID]; dup {
			return invalid("suite %s: index %d: duplicate id %q (first at index %d)", suite, i, t.ID, first)
		}
		seen[t.ID] = i
		cp[i] = t.clone()
		cp[i].Suite = suite
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.suites == nil {
		r.suites = map[string][]Task{}
	}
	r.suites[suite] = cp
	return nil
}

// Get returns the task with the id, written "id" or "suite/id". A plain id
// found in several suites is refused as ambiguous; an unknown one is
// task.not_found.
func (r *Registry) Get(id string) (Task, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if suite, rest, ok := strings.Cut(id, "/"); ok {
		if ts, ok := r.suites[suite]; ok {
			for _, t := range ts {
				if t.ID == rest {
					return t.clone(), nil
				}
			}
		}
	}
	var found []Task
	for _, ts := range r.suites {
		for _, t := range ts {
			if t.ID == id {
				found = append(found, t)
			}
		}
	}
	switch len(found) {
	case 0:
		return Task{}, faults.Newf(faults.CodeTaskNotFound, faults.NotFound, faults.Task, "task %s not found", id)
	case 1:
		return found[0].clone(), nil
	}
	names := make([]string, len(found))
	for i, t := range found {
		names[i] = t.Suite
	}
	slices.Sort(names)
	return Task{}, invalid("task id %s is in several suites (%s); name it as suite/id", id, strings.Join(names, ", "))
}

// List returns the loaded suites sorted by name.
func (r *Registry) List() []SuiteInfo {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]SuiteInfo, 0, len(r.suites))
	for name, ts := range r.suites {
		out = append(out, SuiteInfo{Name: name, Count: len(ts)})
	}
	slices.SortFunc(out, func(a, b SuiteInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Tasks returns a copy of the suite's tasks in load order, nil if it is
// not loaded.
func (r *Registry) Tasks(suite string) []Task {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ts, ok := r.suites[suite]
	if !ok {
		return nil
	}
	out := make([]Task, len(ts))
	for i, t := range ts {
		out[i] = t.clone()
	}
	return out
}
