package recordings

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/orchard/orchard/faults"
)

// ParentRef is a branch recording's link to the recording it continues:
// its first Steps steps (numbers 0..Steps-1) are RecordingID's.
type ParentRef struct {
	RecordingID string `json:"recording_id"`
	Steps       int    `json:"steps"`
}

// maxParentDepth bounds the parent links followed to resolve a
// trajectory: forks of forks that deep are a loop or a bug, not a search.
const maxParentDepth = 64

// OpenResolved reads recording id with its whole trajectory: for a
// branch (a manifest with a parent), its parent's first steps, resolved
// the same way, then its own; the screenshots of each step are read from
// the recording that holds them. The manifest is the branch's, its Steps
// the resolved count; Parent still says where the branch's own steps
// begin. A parent that is missing, holds fewer steps than named, or a
// loop of links is an error; so is a branch whose own steps start before
// its parent's end.
func (s *Store) OpenResolved(id string) (*Recording, error) {
	return s.resolve(id, map[string]bool{}, 0)
}

func (s *Store) resolve(id string, seen map[string]bool, depth int) (*Recording, error) {
	bad := func(format string, a ...any) error {
		return faults.Newf(faults.CodeInternal, faults.Internal, faults.Platform, "resolve recording %s: "+format, append([]any{id}, a...)...)
	}
	if depth > maxParentDepth {
		return nil, bad("parent links deeper than %d", maxParentDepth)
	}
	if seen[id] {
		return nil, bad("its parent links loop")
	}
	seen[id] = true
	r, err := s.Open(id)
	if err != nil {
		return nil, err
	}
	p := r.m.Parent
	if p == nil {
		return r, nil
	}
	if p.Steps < 0 {
		return nil, bad("negative parent step count %d", p.Steps)
	}
	for _, st := range r.steps {
		if st.N < p.Steps {
			return nil, bad("its own step %d is before its parent's end (%d)", st.N, p.Steps)
		}
	}
	parent, err := s.resolve(p.RecordingID, seen, depth+1)
	if err != nil {
		return nil, fmt.Errorf("resolve recording %s: parent: %w", id, err)
	}
	prefix := make([]Step, 0, p.Steps+len(r.steps))
	for _, st := range parent.steps {
		if st.N >= p.Steps {
			break
		}
		if st.dir == "" {
			st.dir = parent.dir
		}
		prefix = append(prefix, st)
	}
	if len(prefix) != p.Steps {
		return nil, bad("parent %s holds %d of the %d steps it is named for", p.RecordingID, len(prefix), p.Steps)
	}
	r.steps = append(prefix, r.steps...)
	r.m.Steps = len(r.steps)
	return r, nil
}

// Delete removes recording id. A recording that another names as its
// parent is refused (conflict) until the branches that continue it are
// deleted: their trajectories begin with its steps and images. The
// directory is first renamed out of the listing, so a delete cut short
// leaves no half recording listed.
func (s *Store) Delete(id string) error {
	dir, _, err := s.manifest(id, "delete")
	if err != nil {
		return err
	}
	list, err := s.List()
	if err != nil {
		return err
	}
	var branches []string
	for _, m := range list {
		if m.Parent != nil && m.Parent.RecordingID == id {
			branches = append(branches, m.ID)
		}
	}
	if len(branches) > 0 {
		sort.Strings(branches)
		return faults.Newf(faults.CodeValidation, faults.Conflict, faults.Client,
			"delete recording %s: recordings %s continue it (their first steps are its); delete them first", id, strings.Join(branches, ", "))
	}
	gone := filepath.Join(s.root, "."+id+".deleting")
	if err := os.Rename(dir, gone); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return faults.Newf(CodeRecordingNotFound, faults.NotFound, faults.Client, "recording %s not found", id)
		}
		return fmt.Errorf("delete recording %s: %w", id, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("delete recording %s: %w", id, err)
	}
	return nil
}
