package server

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/episodes"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/failpoint"
	"github.com/orchard/orchard/recordings"
	"github.com/orchard/orchard/store"
)

// Episodes that branch: POST /episodes/{id}/fork makes count episodes
// that continue a running one from its current step, each in a sandbox
// forked off the episode's (Manager.Fork: its files and browser state,
// not its processes); GET /episodes/{id}/tree shows the family. A
// branch's recording holds only its own steps and names its parent's for
// the rest (recordings/FORMAT.md "Branches").

// forkEpisodeRoutes are the routes of episode forks.
func (s *Server) forkEpisodeRoutes() []route {
	return []route{
		{method: "POST", path: "/episodes/:id/fork", summary: "Branch a running episode into count episodes that continue from its current step, each in its own forked sandbox; the parent goes on",
			request: api.ForkEpisodeRequest{}, response: api.EpisodeFork{}, handler: s.forkEpisode},
		{method: "GET", path: "/episodes/:id/tree", summary: "An episode's family: the root and every episode forked from it, flat with parent links, parents first",
			response: api.EpisodeTree{}, handler: s.episodeTree},
		{method: "DELETE", path: "/recordings/:id", summary: "Delete a recording; refused (409) while a branch's recording continues it",
			response: recordingDeleted{}, handler: s.deleteRecording},
	}
}

// recordingDeleted is the answer of DELETE /recordings/{id}.
type recordingDeleted struct {
	RecordingID string `json:"recording_id"`
}

// branch is one branch of a fork in the making.
type branch struct {
	ep     *episodes.Episode
	lease  store.Lease
	unlock func()
	start  api.EpisodeStart
	err    error
}

func (s *Server) forkEpisode(c *gin.Context) error {
	t0 := time.Now()
	var req api.ForkEpisodeRequest
	if err := decodeJSON(body(c), &req); err != nil {
		return err
	}
	if req.Count < 1 {
		// Refused before the lock, as a malformed step is; the cap is the
		// sandbox fork's, checked before it makes anything.
		return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "count"}, Msg: "count must be at least 1", Input: req.Count})
	}
	ctx, ep, lease, unlock, err := s.eps.Acquire(c.Request.Context(), c.Param("id"), true)
	if err != nil {
		return err
	}
	defer unlock()
	if err := ep.CheckRunning(); err != nil {
		return err
	}
	// A fork carries files and the browser's state, not processes: the
	// processes a task's setup started (the bundled sites' server) are
	// started again in each branch, as the fork's start commands, before
	// the browser's state (which loads pages they serve) is restored.
	var startExec []string
	if rerunSetup(ep) {
		startExec = ep.Task.Setup.Exec
	}
	sbs, err := s.mgr.Fork(ctx, ep.SandboxID, api.ForkRequest{Count: req.Count, Exec: startExec,
		Labels: map[string]string{"orchard.episode.parent": ep.EpisodeID}})
	if err != nil {
		return err
	}
	bs := make([]*branch, len(sbs))
	now := time.Now()
	for i, sb := range sbs {
		bs[i] = &branch{ep: ep.Branch(uuid.NewString()[:12], sb.ID, now)}
	}
	// Each branch takes its observation in its own sandbox, all at once.
	var wg sync.WaitGroup
	for _, b := range bs {
		wg.Go(func() { s.startBranch(ctx, ep, b) })
	}
	wg.Wait()
	var failed error
	for _, b := range bs {
		if b.err != nil && failed == nil {
			failed = b.err
		}
	}
	if failed == nil {
		for _, b := range bs {
			ep.Children = append(ep.Children, b.ep.EpisodeID)
		}
		failed = s.eps.Save(ctx, lease, ep)
	}
	if failed != nil {
		s.dropBranches(bs)
		return failed
	}
	out := api.EpisodeFork{EpisodeID: ep.EpisodeID, BranchStep: ep.Steps, Branches: make([]api.EpisodeStart, len(bs))}
	for i, b := range bs {
		b.unlock()
		out.Branches[i] = b.start
	}
	out.ForkMS = float64(time.Since(t0).Microseconds()) / 1000
	c.JSON(http.StatusOK, out)
	return nil
}

// rerunSetup reports whether a branch of ep runs its task's setup
// commands again: they start the processes the task needs, which a fork
// does not carry. They must be idempotent (the bundled sites' command
// is: it returns at once when the sites already answer).
func rerunSetup(ep *episodes.Episode) bool {
	return ep.Task.Setup != nil && len(ep.Task.Setup.Exec) > 0
}

// startBranch takes b's lock, opens its recording and takes its current
// step's observation again in its sandbox, then stores it. A branch whose
// sandbox fails any of that is not made: b.err.
func (s *Server) startBranch(ctx context.Context, parent *episodes.Episode, b *branch) {
	bctx, lease, unlock, err := s.eps.Lock(ctx, b.ep.EpisodeID)
	if err != nil {
		b.err = err
		return
	}
	b.lease, b.unlock = lease, unlock
	if parent.RecordingID != "" && s.recs != nil {
		s.startBranchRecording(parent, b.ep)
	}
	out := s.runStep(bctx, b.ep, b.ep.RetakeStep())
	if b.ep.Outcome == api.OutcomeEnvError && out.Info.Error != nil {
		f := faults.FromInfo(*out.Info.Error, 0)
		b.err = faults.Wrap(f, f.Code, f.Category, f.Source, "branch "+b.ep.EpisodeID+" of episode "+parent.EpisodeID+": "+f.Message)
		return
	}
	if err := failpoint.Eval("server.episode.fork.branch"); err != nil {
		b.err = err
		return
	}
	if err := s.eps.Save(bctx, lease, b.ep); err != nil {
		b.err = err
		return
	}
	b.start = api.EpisodeStart{EpisodeID: b.ep.EpisodeID, SandboxID: b.ep.SandboxID, StepResult: out}
}

// startBranchRecording opens a branch's recording: its own steps from the
// fork's on, its first ones its parent's.
func (s *Server) startBranchRecording(parent, ep *episodes.Episode) {
	w, err := s.recs.Create(recordings.Manifest{ID: ep.EpisodeID, EpisodeID: ep.EpisodeID, TaskID: ep.Task.ID, Question: ep.Task.Question,
		StartURL: ep.Task.StartURL, SandboxID: ep.SandboxID, Kind: ep.Kind, CreatedAt: ep.CreatedAt,
		Parent: &recordings.ParentRef{RecordingID: parent.RecordingID, Steps: parent.Steps}})
	if err != nil {
		s.log.Warn("episode: branch recording", "episode_id", ep.EpisodeID, "err", err)
		return
	}
	_ = w.Close()
	ep.RecordingID = ep.EpisodeID
}

// dropBranches takes back what a failed fork made: the branches' stored
// state, recordings and sandboxes.
func (s *Server) dropBranches(bs []*branch) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, b := range bs {
		if err := s.eps.Delete(ctx, b.ep.EpisodeID); err != nil {
			s.log.Warn("episode fork: drop branch", "episode_id", b.ep.EpisodeID, "err", err)
		}
		if b.ep.RecordingID != "" && s.recs != nil {
			if err := s.recs.Delete(b.ep.RecordingID); err != nil {
				s.log.Warn("episode fork: drop branch recording", "episode_id", b.ep.EpisodeID, "err", err)
			}
		}
		_ = s.mgr.Delete(ctx, b.ep.SandboxID)
		if b.unlock != nil {
			b.unlock()
		}
	}
}

// episodeTree reads without locks, as GET /episodes/{id} does. Episodes
// that expired are left out; a root whose parent expired is the root.
func (s *Server) episodeTree(c *gin.Context) error {
	ctx := c.Request.Context()
	ep, err := s.eps.Load(ctx, c.Param("id"), false)
	if err != nil {
		return err
	}
	seen := map[string]bool{ep.EpisodeID: true}
	for depth := 0; ep.Parent != "" && depth < episodes.MaxFamilyDepth; depth++ {
		if seen[ep.Parent] {
			break
		}
		up, err := s.eps.Load(ctx, ep.Parent, false)
		if f := faults.Of(err); err != nil && f.Category == faults.NotFound {
			break
		} else if err != nil {
			return err
		}
		seen[up.EpisodeID] = true
		ep = up
	}
	tree := api.EpisodeTree{Root: ep.EpisodeID}
	queue := []*episodes.Episode{ep}
	inTree := map[string]bool{ep.EpisodeID: true}
	for len(queue) > 0 {
		e := queue[0]
		queue = queue[1:]
		n := api.EpisodeNode{EpisodeID: e.EpisodeID, Parent: e.Parent, Steps: e.Steps, Status: e.Status, Outcome: e.Outcome,
			Reward: e.Reward, RecordingID: e.RecordingID, Children: []string{}}
		if e.EpisodeID == tree.Root {
			n.Parent = "" // the root's parent expired: it is not in the tree
		}
		if e.BranchStep != nil && n.Parent != "" {
			n.BranchStep = *e.BranchStep
		}
		for _, id := range e.Children {
			if inTree[id] {
				continue
			}
			child, err := s.eps.Load(ctx, id, false)
			if f := faults.Of(err); err != nil && f.Category == faults.NotFound {
				continue
			} else if err != nil {
				return err
			}
			inTree[id] = true
			n.Children = append(n.Children, id)
			queue = append(queue, child)
		}
		tree.Episodes = append(tree.Episodes, n)
	}
	c.JSON(http.StatusOK, tree)
	return nil
}

func (s *Server) deleteRecording(c *gin.Context) error {
	st, err := s.recStore()
	if err != nil {
		return err
	}
	if err := st.Delete(c.Param("id")); err != nil {
		return err
	}
	c.JSON(http.StatusOK, recordingDeleted{RecordingID: c.Param("id")})
	return nil
}

// maxAgentState bounds a browser state read from an agent, as the
// manager's snapshots do.
const maxAgentState = 64 << 20
