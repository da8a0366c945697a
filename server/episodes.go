package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/evaluate"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/recordings"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/memory"
	"github.com/orchard/orchard/tasks"
)

// Episodes: the RL loop, one call per step (API.md "Episodes"). An episode
// owns a browser or desktop sandbox from create to finish; its steps are
// forwarded to the sandbox's browser or desktop daemon and recorded;
// finish runs the task's evaluator.
//
// Episode state lives in the store (store.Docs), not in this process: each
// call takes the episode's lock (store.Locker — a Redis lease when replicas
// share Redis), loads the state, works and writes it back fenced by the
// lease, so any replica serves any call and a replica that lost the lock
// mid-step cannot overwrite its successor's state.

// Outcomes of a finished episode.
const (
	OutcomeSuccess  = "success"
	OutcomeFailure  = "failure"
	OutcomeEnvError = "env_error"
)

// Episode defaults, each with its reason.
const (
	// defaultMaxSteps: WebVoyager's budget for a task.
	defaultMaxSteps = 30
	// defaultStepTimeout bounds one step: a page load with its retries.
	defaultStepTimeout = 90 * time.Second
	// defaultEpisodeTimeout bounds an episode that a trainer abandons.
	defaultEpisodeTimeout = 30 * time.Minute
	// episodeFinishGrace is how long past its deadline an episode's sandbox
	// is kept (at most the episode's own length) for a finish to evaluate
	// the final page; then the cleanup sweep removes it.
	episodeFinishGrace = 5 * time.Minute
	// execEvalTimeout bounds an exec eval's command: a check of files or
	// settings, not a build.
	execEvalTimeout = 60
	// judgeScreenshots are the last screenshots kept for a judge.
	judgeScreenshots = 3
	// episodeKeep is how long an episode stays readable after its last
	// call (or, while running, after its deadline).
	episodeKeep = 24 * time.Hour
	// episodeLockTTL bounds how long a replica that died mid-call blocks
	// the episode's next call; the holder refreshes it every third.
	episodeLockTTL = 15 * time.Second
)

// Kinds of the episode documents in the store.
const (
	episodeDoc  = "episode"
	screensDoc  = "episode-screens" // apart, so listing episodes does not read images
	episodeLock = "episode:"
)

type episodeRequest struct {
	TaskID           string          `json:"task_id,omitempty"`
	Task             *tasks.Task     `json:"task,omitempty"`
	Sandbox          json.RawMessage `json:"sandbox,omitempty"` // POST /sandboxes fields (kind, browser, desktop, memory, faults, block_network, egress)
	Observe          map[string]any  `json:"observe,omitempty"`
	MaxSteps         int             `json:"max_steps,omitempty" openapi:"minimum=0" doc:"0: the task's, else the default"`
	StepTimeoutMS    int             `json:"step_timeout_ms,omitempty" openapi:"minimum=0" doc:"milliseconds; 0: the default"`
	EpisodeTimeoutMS int             `json:"episode_timeout_ms,omitempty" openapi:"minimum=0" doc:"milliseconds; 0: the default"`
	Record           *bool           `json:"record,omitempty"`
}

type episodeInfo struct {
	Step     int           `json:"step"`
	Error    *faults.Info  `json:"error,omitempty"`
	Injected *faults.Truth `json:"injected,omitempty"`
	StepMS   float64       `json:"step_ms"`
}

type attribution struct {
	faults.Info
	Step int `json:"step"`
}

// episodeView is what GET /episodes/{id} shows.
type episodeView struct {
	ID        string           `json:"episode_id"`
	SandboxID string           `json:"sandbox_id"`
	TaskID    string           `json:"task_id"`
	Kind      string           `json:"kind"`   // api.KindBrowser or api.KindDesktop
	Status    string           `json:"status"` // running, done, finished, aborted
	Steps     int              `json:"steps"`
	Outcome   string           `json:"outcome,omitempty"`
	Reward    *float64         `json:"reward,omitempty"`
	Answer    string           `json:"answer,omitempty"`
	Attrib    *attribution     `json:"attribution,omitempty"`
	Eval      *evaluate.Result `json:"evaluation,omitempty"`
	CreatedAt time.Time        `json:"created_at"`
	Recording string           `json:"recording_id,omitempty"`
}

// episode is the stored state of an episode: its view and what the next
// call needs.
type episode struct {
	episodeView
	Task        tasks.Task      `json:"task"`
	Observe     map[string]any  `json:"observe"`
	MaxSteps    int             `json:"max_steps"`
	StepTimeout time.Duration   `json:"step_timeout"`
	Deadline    time.Time       `json:"deadline"`
	LastURL     string          `json:"last_url,omitempty"`
	History     []evaluate.Step `json:"history,omitempty"`

	// screens are the last screenshots, for a judge; stored apart.
	screens      [][]byte
	screensDirty bool
}

func (ep *episode) ended() bool { return ep.Status == "finished" || ep.Status == "aborted" }

// desktop reports whether ep runs in a desktop sandbox. Episodes stored
// before episodes had kinds have none: they are browser episodes.
func (ep *episode) desktop() bool { return ep.Kind == api.KindDesktop }

// episodeStore keeps episodes in a store.Docs under store.Locker locks.
type episodeStore struct {
	docs   store.Docs
	locker store.Locker
}

// newEpisodeStore uses st when it can hold documents and locks; otherwise
// episodes live in this process only.
func newEpisodeStore(st store.Store) *episodeStore {
	d, okD := st.(store.Docs)
	l, okL := st.(store.Locker)
	if !okD || !okL {
		m := memory.New()
		d, l = m, m
	}
	return &episodeStore{docs: d, locker: l}
}

func errEpisodeNotFound(id string) error {
	return faults.Newf(faults.CodeEpisodeNotFound, faults.NotFound, faults.Client, "Episode %s not found", id)
}

// lock takes the episode's lock for one call. The returned context ends
// when the lease is lost, so the call stops and its fenced save fails.
func (st *episodeStore) lock(ctx context.Context, id string) (context.Context, store.Lease, func(), error) {
	ctx, cancel := context.WithCancelCause(ctx)
	lease, release, err := store.Hold(ctx, st.locker, episodeLock+id, episodeLockTTL, cancel)
	if err != nil {
		cancel(nil)
		return nil, nil, nil, err
	}
	return ctx, lease, func() { release(); cancel(nil) }, nil
}

// load reads the episode id, and its screenshots when withScreens.
func (st *episodeStore) load(ctx context.Context, id string, withScreens bool) (*episode, error) {
	b, ok, err := st.docs.GetDoc(ctx, episodeDoc, id)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errEpisodeNotFound(id)
	}
	var ep episode
	if err := json.Unmarshal(b, &ep); err != nil {
		return nil, faults.Wrap(err, faults.CodeInternal, faults.Internal, faults.Platform, "decode episode "+id)
	}
	if withScreens {
		b, ok, err := st.docs.GetDoc(ctx, screensDoc, id)
		if err != nil {
			return nil, err
		}
		if ok {
			_ = json.Unmarshal(b, &ep.screens)
		}
	}
	return &ep, nil
}

// acquire locks the episode id and loads it; release unlocks.
func (st *episodeStore) acquire(ctx context.Context, id string, withScreens bool) (context.Context, *episode, store.Lease, func(), error) {
	ctx, lease, release, err := st.lock(ctx, id)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ep, err := st.load(ctx, id, withScreens)
	if err != nil {
		release()
		return nil, nil, nil, nil, err
	}
	return ctx, ep, lease, release, nil
}

// save writes ep, fenced by lease.
func (st *episodeStore) save(ctx context.Context, lease store.Lease, ep *episode) error {
	ttl := episodeKeep
	if !ep.ended() {
		ttl += max(time.Until(ep.Deadline), 0)
	}
	if ep.screensDirty {
		b, err := json.Marshal(ep.screens)
		if err != nil {
			return err
		}
		if err := st.docs.PutDocFenced(ctx, lease, screensDoc, ep.ID, b, ttl); err != nil {
			return err
		}
		ep.screensDirty = false
	}
	b, err := json.Marshal(ep)
	if err != nil {
		return err
	}
	return st.docs.PutDocFenced(ctx, lease, episodeDoc, ep.ID, b, ttl)
}

func (s *Server) episodeRoutes() []route {
	return []route{
		{method: "POST", path: "/episodes", summary: "Start an episode: a browser sandbox on the task's start URL, or a desktop sandbox (setup.sandbox or sandbox kind \"desktop\"); returns the first observation",
			request: episodeRequest{}, response: map[string]any{}, handler: s.createEpisode},
		{method: "GET", path: "/episodes", summary: "List episodes", response: map[string]any{}, handler: s.listEpisodes},
		{method: "GET", path: "/episodes/:id", summary: "An episode: status, steps so far, outcome", response: map[string]any{}, handler: s.getEpisode},
		{method: "POST", path: "/episodes/:id/step", summary: "One action → the observation, done and info (classified error, step, timing)",
			request: map[string]any{}, response: map[string]any{}, handler: s.stepEpisode},
		{method: "POST", path: "/episodes/:id/finish", summary: "Evaluate: outcome (success, failure, env_error), reward, evaluation, attribution",
			request: map[string]any{}, response: map[string]any{}, handler: s.finishEpisode},
		{method: "DELETE", path: "/episodes/:id", summary: "Abort an episode and release its sandbox", response: map[string]any{}, handler: s.deleteEpisode},
		{method: "GET", path: "/tasks", summary: "Loaded task suites", response: map[string]any{}, handler: s.listTasks},
		{method: "POST", path: "/tasks", summary: "Load a task suite: the body is the file (our JSONL/YAML, WebVoyager JSONL, Online-Mind2Web JSON); ?suite=NAME&name=FILE.ext",
			query:   []queryParam{{"suite", "string", "suite name", true}, {"name", "string", "file name (its extension picks the format)", false}},
			rawBody: true, response: map[string]any{}, handler: s.loadTasks},
		{method: "GET", path: "/tasks/:suite", summary: "The tasks of a suite", response: map[string]any{}, handler: s.suiteTasks},
		{method: "GET", path: "/recordings", summary: "Episode recordings, newest first", response: map[string]any{}, handler: s.listRecordings},
		{method: "GET", path: "/recordings/:id", summary: "A recording's manifest and steps", response: map[string]any{}, handler: s.getRecording},
		{method: "GET", path: "/recordings/:id/steps/:n/screenshot", summary: "The screenshot of a recorded step", produces: "image/jpeg", handler: s.recordingScreenshot},
		{method: "GET", path: "/recordings/:id/export", summary: "Export: jsonl, parquet, gif, mp4 or html (a self-contained replay)",
			query: []queryParam{{"format", "string", "jsonl, parquet, gif, mp4 or html", true}}, produces: "application/octet-stream", handler: s.exportRecording},
	}
}

// agentCall posts one request to path on a sandbox's agent, which serves
// it or forwards it to the sandbox's browser or desktop daemon.
func (s *Server) agentCall(ctx context.Context, sandboxID, path string, body any) (int, []byte, error) {
	status, _, raw, err := s.agentCallHeader(ctx, sandboxID, path, body)
	return status, raw, err
}

// agentCallHeader is agentCall that also returns the response's header.
func (s *Server) agentCallHeader(ctx context.Context, sandboxID, path string, body any) (int, http.Header, []byte, error) {
	if s.agentHTTP == nil {
		return 0, nil, nil, faults.New(faults.CodeKindUnsupported, faults.NotImplemented, faults.Platform, "this server does not forward to agents")
	}
	addr, err := s.mgr.AgentAddr(ctx, sandboxID)
	if err != nil {
		return 0, nil, nil, err
	}
	base, rt := s.agentHTTP(addr)
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base.String(), "/")+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		if d := s.mgr.DeathFault(ctx, sandboxID); d != nil {
			return 0, nil, nil, d
		}
		return 0, nil, nil, faults.Wrap(err, faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "the sandbox's agent did not answer")
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	return resp.StatusCode, resp.Header, raw, err
}

// envelopeError decodes an error answer of the agent.
func envelopeError(status int, raw []byte) *faults.Error {
	var env faults.Envelope
	if json.Unmarshal(raw, &env) == nil && env.Error != nil {
		return faults.FromInfo(*env.Error, status)
	}
	return faults.Newf(faults.CodeBadResponse, faults.Unavailable, faults.Platform, "the sandbox's agent answered %d", status)
}

// isEnvFault reports whether a step's error ends the episode as the
// environment's fault rather than the policy's.
func isEnvFault(f *faults.Info) bool {
	if f == nil {
		return false
	}
	switch faults.Source(f.Source) {
	case faults.Policy, faults.Client, faults.Task:
		return false
	}
	info, ok := faults.Lookup(f.Code)
	if !ok {
		return f.Category != faults.ActionFailed && f.Category != faults.InvalidRequest
	}
	return info.EnvError
}

func (s *Server) createEpisode(c *gin.Context) error {
	var req episodeRequest
	if err := decodeJSON(body(c), &req); err != nil {
		return err
	}
	var v checks
	v.nonNegative(&req.MaxSteps, []any{"body", "max_steps"})
	v.nonNegative(&req.StepTimeoutMS, []any{"body", "step_timeout_ms"})
	v.nonNegative(&req.EpisodeTimeoutMS, []any{"body", "episode_timeout_ms"})
	if err := v.err(); err != nil {
		return err
	}
	var task tasks.Task
	switch {
	case req.Task != nil:
		task = *req.Task
		if task.ID == "" {
			task.ID = "inline-" + uuid.NewString()[:8]
		}
	case req.TaskID != "":
		if err := s.syncSuites(c.Request.Context()); err != nil {
			return err
		}
		t, err := s.tasks.Get(req.TaskID)
		if err != nil {
			return err
		}
		task = t
	default:
		return errValidation(validationItem{Type: "missing", Loc: []any{"body", "task_id"}, Msg: "task or task_id is required", Input: nil})
	}
	if task.Eval != nil {
		if err := s.evaluator.Ready(*task.Eval); err != nil {
			return err
		}
	}
	ep := &episode{
		episodeView: episodeView{ID: uuid.NewString()[:12], TaskID: task.ID, Status: "running", CreatedAt: time.Now().UTC()},
		Task:        task, Observe: req.Observe, MaxSteps: req.MaxSteps, StepTimeout: time.Duration(req.StepTimeoutMS) * time.Millisecond,
	}
	if ep.MaxSteps <= 0 {
		ep.MaxSteps = task.MaxSteps
	}
	if ep.MaxSteps <= 0 {
		ep.MaxSteps = defaultMaxSteps
	}
	if ep.StepTimeout <= 0 {
		ep.StepTimeout = defaultStepTimeout
	}
	total := time.Duration(req.EpisodeTimeoutMS) * time.Millisecond
	if total <= 0 {
		total = defaultEpisodeTimeout
	}
	ep.Deadline = time.Now().Add(total)

	// The sandbox: the request's settings over the task's over ours.
	p := manager.CreateParams{Kind: api.KindBrowser, Image: "host", BlockNetwork: false}
	var spec api.CreateSandboxRequest
	for _, raw := range []json.RawMessage{taskSandbox(task), req.Sandbox} {
		if len(raw) > 0 && string(raw) != "null" {
			if err := json.Unmarshal(raw, &spec); err != nil {
				return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "sandbox: "+err.Error())
			}
		}
	}
	if err := s.sandboxParams(&p, spec, "body", "sandbox"); err != nil {
		return err
	}
	if err := episodeKind(&p, task); err != nil {
		return err
	}
	// The sandbox lives no longer than the episode, and a grace for a late
	// finish to evaluate in: one its trainer abandons is not kept until the
	// server-wide TTL (hours).
	if ttl := int(math.Ceil((total + min(total, episodeFinishGrace)).Seconds())); p.TTLSeconds <= 0 || p.TTLSeconds > ttl {
		p.TTLSeconds = ttl
	}
	ep.Kind = p.Kind
	if ep.Observe == nil {
		ep.Observe = map[string]any{"screenshot": "jpeg", "som": true}
		if ep.desktop() {
			ep.Observe = map[string]any{"screenshot": "jpeg"}
		}
	}
	p.Labels = maps.Clone(p.Labels)
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels["orchard.episode"] = ep.ID
	// Nobody knows the id yet: the lock is free, and held from here so the
	// first state written is the whole first step's.
	ctx, lease, unlock, err := s.eps.lock(c.Request.Context(), ep.ID)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := s.mgr.Create(ctx, p)
	if err != nil {
		return err
	}
	ep.SandboxID = rec.ID
	release := func() { _ = s.mgr.Delete(context.Background(), rec.ID) }
	if sb, err := s.mgr.Wait(ctx, rec.ID, 120); err != nil || sb.Status != api.StatusReady {
		release()
		if err == nil {
			err = faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox, "episode sandbox did not start: %s", sb.StatusMessage)
		}
		return err
	}
	if err := s.setupTask(ctx, rec.ID, task.Setup); err != nil {
		release()
		return err
	}
	if (req.Record == nil || *req.Record) && s.recs != nil {
		w, err := s.recs.Create(recordings.Manifest{ID: ep.ID, EpisodeID: ep.ID, TaskID: task.ID, Question: task.Question,
			StartURL: task.StartURL, SandboxID: rec.ID, Kind: ep.Kind, CreatedAt: ep.CreatedAt})
		if err != nil {
			s.log.Warn("episode: recording", "episode_id", ep.ID, "err", err)
		} else {
			_ = w.Close()
			ep.Recording = ep.ID
		}
	}

	// Step 0: the start page, loaded with the navigation retry policy; on
	// a desktop, the screen as the setup left it.
	first := map[string]any{"observe": ep.Observe}
	if task.StartURL != "" && !ep.desktop() {
		first["actions"] = []map[string]any{{"type": "navigate", "url": task.StartURL,
			"retry": map[string]any{"attempts": 3, "initial_ms": 500, "max_ms": 4000}}}
	}
	out := s.runStep(ctx, ep, first, true)
	if err := s.eps.save(ctx, lease, ep); err != nil {
		release()
		return err
	}
	out["episode_id"], out["sandbox_id"] = ep.ID, ep.SandboxID
	c.JSON(http.StatusOK, out)
	return nil
}

// episodeKind checks the sandbox kind of an episode (p as the request and
// the task set it, settings already checked against it): a browser, or a
// desktop whose chromium app opens the task's start URL unless told
// otherwise.
func episodeKind(p *manager.CreateParams, task tasks.Task) error {
	switch p.Kind {
	case api.KindBrowser:
	case api.KindDesktop:
		if err := task.CheckKind(api.KindDesktop); err != nil {
			return faults.Newf(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, "task %s: %v", task.ID, err)
		}
		if task.StartURL != "" {
			opts := map[string]any{}
			if len(p.KindOptions) > 0 && string(p.KindOptions) != "null" {
				if err := json.Unmarshal(p.KindOptions, &opts); err != nil || opts == nil {
					return errValidation(validationItem{Type: "value_error", Loc: []any{"body", "sandbox", "desktop"},
						Msg: "desktop settings must be an object", Input: jsonInput(p.KindOptions)})
				}
			}
			if _, ok := opts["url"]; !ok {
				opts["url"] = task.StartURL
				p.KindOptions, _ = json.Marshal(opts)
			}
		}
	default:
		return errValidation(validationItem{Type: "value_error", Loc: []any{"body", "sandbox", "kind"},
			Msg: "episodes run in a \"browser\" or \"desktop\" sandbox", Input: p.Kind})
	}
	return nil
}

// taskSandbox is the sandbox part of a task's setup.
func taskSandbox(t tasks.Task) json.RawMessage {
	if t.Setup == nil {
		return nil
	}
	return t.Setup.Sandbox
}

// setupTask writes the task's files and runs its commands in the sandbox.
func (s *Server) setupTask(ctx context.Context, id string, st *tasks.Setup) error {
	if st == nil {
		return nil
	}
	fail := func(format string, a ...any) error {
		return faults.Newf(faults.CodeTaskSetupFailed, faults.Unavailable, faults.Task, "task setup: "+format, a...)
	}
	for _, f := range st.Files {
		content := f.Base64
		if content == "" {
			content = base64.StdEncoding.EncodeToString([]byte(f.Content))
		}
		path := f.Path
		if _, err := s.mgr.Upload(ctx, id, api.UploadRequest{Path: &path, Content: &content}); err != nil {
			return fail("write %s: %s", f.Path, faults.Of(err).Message)
		}
	}
	for _, cmd := range st.Exec {
		job, err := s.execIn(ctx, id, cmd, 120)
		if err != nil {
			if f := faults.Of(err); f.Source != faults.Client && f.Source != faults.Task {
				return err
			}
			return fail("%q: %s", cmd, faults.Of(err).Message)
		}
		if job.Status != api.JobSucceeded {
			code := -1
			if job.ExitCode != nil {
				code = *job.ExitCode
			}
			return fail("%q exited %d: %s", cmd, code, strings.TrimSpace(job.Stderr))
		}
	}
	return nil
}

// execIn runs cmd in sandbox id and waits up to timeout seconds for it. A
// command that failed because the sandbox failed under it (its agent
// died, it ran out of memory) is the environment's fault, returned as the
// error; a non-zero exit or a timeout is the job's result.
func (s *Server) execIn(ctx context.Context, id, cmd string, timeout int) (api.Job, error) {
	job, err := s.mgr.Exec(ctx, id, manager.ExecParams{Command: cmd, TimeoutSeconds: timeout, Wait: true})
	if err != nil {
		return job, err
	}
	if f := job.Fault; f != nil {
		info := faults.Info{Category: faults.Category(f.Category), Source: faults.Source(f.Source), Code: f.Code,
			Message: f.Message, Retryable: f.Retryable}
		if isEnvFault(&info) {
			return job, faults.FromInfo(info, 0)
		}
	}
	if job.Status != api.JobSucceeded {
		if d := s.mgr.DeathFault(ctx, id); d != nil {
			return job, d
		}
	}
	return job, nil
}

// runStep sends one actions request for ep (its lock held) to its
// sandbox's browser or desktop daemon and records it. Failures are the
// step's info, not an error: the trainer gets them as the step's outcome.
func (s *Server) runStep(ctx context.Context, ep *episode, req map[string]any, reset bool) gin.H {
	start := time.Now()
	var action json.RawMessage
	var list []json.RawMessage
	if acts, ok := req["actions"]; ok {
		action, _ = json.Marshal(acts)
		_ = json.Unmarshal(action, &list)
	}
	// What the policy sent, as the recording and the judge keep it: the
	// action object itself when it sent one (the replay marks its x, y),
	// nothing for the reset, whose start-page load is ours, not the
	// policy's (FORMAT.md: no action on step 0).
	if len(list) == 1 {
		action = list[0]
	}
	if reset {
		action = nil
	}
	// answer ends the episode with the policy's final answer. The browser
	// takes it as an action that does nothing; the desktop has no such
	// action, so it is kept from the desktop, which gets the rest.
	answered := false
	var rest []json.RawMessage
	for _, a := range list {
		var v map[string]any
		if json.Unmarshal(a, &v) == nil && v["type"] == "answer" {
			ep.Answer, _ = v["text"].(string)
			answered = true
			continue
		}
		rest = append(rest, a)
	}
	path, body := "/browser/actions", req
	if ep.desktop() {
		path, body = "/desktop/actions", map[string]any{"actions": rest, "observe": req["observe"]}
		if len(rest) == 0 {
			// Only an observation is wanted (step 0, an answer): the
			// desktop takes no request without actions.
			body["actions"] = []map[string]any{{"type": "wait", "ms": 0}}
		}
	}
	sctx, cancel := context.WithTimeoutCause(ctx, ep.StepTimeout,
		faults.Newf(faults.CodeEpisodeDeadline, faults.Timeout, faults.Policy, "step %d ran past its %s budget", ep.Steps+1, ep.StepTimeout))
	defer cancel()
	status, hdr, raw, err := s.agentCallHeader(sctx, ep.SandboxID, path, body)
	info := episodeInfo{Step: ep.Steps}
	if kind := hdr.Get(egress.HeaderInjected); kind != "" && !faults.IsNetwork(kind) {
		// A step fault (a browser crash or hang) is tagged on the response
		// only: its truth depends on its kind alone. Network faults come
		// with their truth in the results.
		truth := faults.TruthOf(faults.Injection{Kind: kind})
		info.Injected = &truth
	}
	var resp struct {
		OK      bool `json:"ok"`
		Results []struct {
			Type     string        `json:"type"`
			OK       bool          `json:"ok"`
			Error    *faults.Info  `json:"error"`
			Injected *faults.Truth `json:"injected"`
		} `json:"results"`
		Observation json.RawMessage `json:"observation"`
	}
	switch {
	case err != nil:
		// The agent call fails as a broken connection whenever its context
		// ends; the context's cause says why, and it was not the agent.
		f := faults.Of(err)
		switch {
		case ctx.Err() != nil:
			// The caller went away (its client timed out) or the lock was
			// lost: neither is the sandbox's fault.
			f = faults.Of(context.Cause(ctx))
		case sctx.Err() != nil:
			// The step's own budget ran out: the step's timeout.
			f = faults.Of(context.Cause(sctx))
		}
		i := f.Info()
		info.Error = &i
	case status != http.StatusOK:
		i := envelopeError(status, raw).Info()
		info.Error = &i
	default:
		if err := json.Unmarshal(raw, &resp); err != nil {
			i := faults.Wrap(err, faults.CodeBadResponse, faults.Unavailable, faults.Platform, "bad "+ep.Kind+" answer").Info()
			info.Error = &i
		}
		for _, r := range resp.Results {
			if r.Error != nil {
				info.Error = r.Error
			}
			if r.Injected != nil {
				info.Injected = r.Injected
			}
		}
	}
	if !reset {
		ep.Steps++
		info.Step = ep.Steps
	}
	info.StepMS = float64(time.Since(start).Microseconds()) / 1000
	done := false
	if isEnvFault(info.Error) {
		s.endEnvError(ep, *info.Error, info.Step)
		done = true
	}
	if answered {
		done = true
	}
	if ep.Steps >= ep.MaxSteps || time.Now().After(ep.Deadline) {
		done = true
	}
	if done && ep.Status == "running" {
		ep.Status = "done"
	}
	var obs struct {
		URL        string  `json:"url"`
		Title      string  `json:"title"`
		Text       string  `json:"text"`
		AXTree     string  `json:"axtree"`
		Frame      int64   `json:"frame"`
		Scale      float64 `json:"scale"`
		Screenshot *struct {
			Format string  `json:"format"`
			Data   []byte  `json:"data"`
			Width  int     `json:"width"`
			Height int     `json:"height"`
			Frame  int64   `json:"frame"` // the desktop's frame and scale are the screenshot's
			Scale  float64 `json:"scale"`
		} `json:"screenshot"`
	}
	_ = json.Unmarshal(resp.Observation, &obs)
	if sc := obs.Screenshot; sc != nil && obs.Frame == 0 && obs.Scale == 0 {
		obs.Frame, obs.Scale = sc.Frame, sc.Scale
	}
	if obs.URL != "" {
		ep.LastURL = obs.URL
	}
	errText := ""
	if info.Error != nil {
		errText = info.Error.Code
	}
	if !reset {
		ep.History = append(ep.History, evaluate.Step{N: info.Step, Action: action, URL: obs.URL, Error: errText})
	}
	var shot []byte
	ext := ""
	if obs.Screenshot != nil && len(obs.Screenshot.Data) > 0 {
		shot, ext = obs.Screenshot.Data, obs.Screenshot.Format
		ep.screens = append(ep.screens, shot)
		if len(ep.screens) > judgeScreenshots {
			ep.screens = ep.screens[len(ep.screens)-judgeScreenshots:]
		}
		ep.screensDirty = true
	}
	if ep.Recording != "" && s.recs != nil {
		st := recordings.Step{N: info.Step, Time: start.UTC(), Action: action, Result: raw, URL: obs.URL, Title: obs.Title,
			Text: obs.Text, AXTree: obs.AXTree, Frame: obs.Frame, Scale: obs.Scale, StepMS: info.StepMS, Error: info.Error, Injected: info.Injected}
		if obs.Screenshot != nil {
			st.Width, st.Height = obs.Screenshot.Width, obs.Screenshot.Height
		}
		if err := s.appendRecording(ep.Recording, st, shot, ext); err != nil {
			s.log.Warn("episode: record step", "episode_id", ep.ID, "err", err)
		}
	}
	return gin.H{"observation": resp.Observation, "done": done, "info": info}
}

// appendRecording appends one step to an episode's recording, reopened
// for the step: the previous call may have been served by another replica.
func (s *Server) appendRecording(id string, st recordings.Step, shot []byte, ext string) error {
	w, err := s.recs.Resume(id)
	if err != nil {
		return err
	}
	defer w.Close()
	return w.Append(st, shot, ext)
}

// endEnvError ends ep as the environment's fault (ep.mu held).
func (s *Server) endEnvError(ep *episode, f faults.Info, step int) {
	if ep.Outcome != "" {
		return
	}
	ep.Outcome, ep.Attrib = OutcomeEnvError, &attribution{Info: f, Step: step}
	zero := 0.0
	ep.Reward = &zero
}

func (s *Server) stepEpisode(c *gin.Context) error {
	var req struct {
		Action  json.RawMessage   `json:"action"`
		Actions []json.RawMessage `json:"actions"`
		Observe map[string]any    `json:"observe"`
	}
	if err := decodeJSON(body(c), &req); err != nil {
		return err
	}
	actions := req.Actions
	if len(req.Action) > 0 {
		actions = append(actions, req.Action)
	}
	if len(actions) == 0 {
		return errValidation(validationItem{Type: "missing", Loc: []any{"body", "action"}, Msg: "Field required", Input: nil})
	}
	ctx, ep, lease, unlock, err := s.eps.acquire(c.Request.Context(), c.Param("id"), true)
	if err != nil {
		return err
	}
	defer unlock()
	if ep.Status != "running" {
		return faults.Newf(faults.CodeEpisodeDone, faults.Conflict, faults.Client, "episode %s is %s: finish it or start another", ep.ID, ep.Status)
	}
	observe := ep.Observe
	if req.Observe != nil {
		observe = req.Observe
	}
	out := s.runStep(ctx, ep, map[string]any{"actions": actions, "observe": observe}, false)
	// Saved even when the caller went away mid-step: the step ran (in part)
	// and is recorded, so a retry must be the next step, not this one
	// again. The lease still fences the write.
	if err := s.eps.save(context.WithoutCancel(ctx), lease, ep); err != nil {
		return err
	}
	c.JSON(http.StatusOK, out)
	return nil
}

// episodePage is the live page an evaluator looks at.
type episodePage struct {
	s   *Server
	ep  *episode
	url string
}

func (p episodePage) URL() string { return p.url }

func (p episodePage) Eval(ctx context.Context, expr string) (json.RawMessage, error) {
	status, raw, err := p.s.agentCall(ctx, p.ep.SandboxID, "/browser/evaluate", map[string]string{"expression": expr})
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, envelopeError(status, raw)
	}
	var v struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return v.Value, nil
}

// episodeSandbox is the sandbox an exec eval runs its command in.
type episodeSandbox struct {
	s  *Server
	id string
}

func (sb episodeSandbox) Exec(ctx context.Context, command string) (evaluate.ExecResult, error) {
	job, err := sb.s.execIn(ctx, sb.id, command, execEvalTimeout)
	if err != nil {
		return evaluate.ExecResult{}, err
	}
	res := evaluate.ExecResult{ExitCode: -1, Stdout: job.Stdout, Stderr: job.Stderr}
	if job.ExitCode != nil {
		res.ExitCode = *job.ExitCode
	}
	return res, nil
}

func (s *Server) finishEpisode(c *gin.Context) error {
	var req struct {
		Answer *string `json:"answer"`
	}
	if b := body(c); len(bytes.TrimSpace(b)) > 0 {
		if err := decodeJSON(b, &req); err != nil {
			return err
		}
	}
	ctx, ep, lease, unlock, err := s.eps.acquire(c.Request.Context(), c.Param("id"), true)
	if err != nil {
		return err
	}
	defer unlock()
	if ep.ended() {
		c.JSON(http.StatusOK, ep.result())
		return nil
	}
	if req.Answer != nil {
		ep.Answer = *req.Answer
	}
	if ep.Outcome == "" {
		if ep.Task.Eval == nil {
			return faults.Newf(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, "task %s has no eval block", ep.Task.ID)
		}
		tr := evaluate.Trajectory{Question: ep.Task.Question, Answer: ep.Answer, StartURL: ep.Task.StartURL, Steps: ep.History, Screenshots: ep.screens}
		env := evaluate.Env{Sandbox: episodeSandbox{s: s, id: ep.SandboxID}}
		if !ep.desktop() {
			env.Page = episodePage{s: s, ep: ep, url: ep.LastURL}
		}
		res, err := s.evaluator.Evaluate(ctx, *ep.Task.Eval, tr, env)
		switch {
		case err != nil:
			f := faults.Of(err)
			if f.Source == faults.Client || f.Source == faults.Policy {
				return err
			}
			s.endEnvError(ep, f.Info(), ep.Steps)
		default:
			ep.Eval = &res
			ep.Outcome = OutcomeFailure
			if res.Success {
				ep.Outcome = OutcomeSuccess
			}
			r := res.Reward
			ep.Reward = &r
		}
	}
	ep.Status = "finished"
	if err := s.closeEpisode(ctx, lease, ep); err != nil {
		return err
	}
	c.JSON(http.StatusOK, ep.result())
	return nil
}

// closeEpisode stores the ended episode, finishes its recording and
// releases its sandbox (its lock held). The state is stored first: a
// replica that lost the lock leaves both to the holder.
func (s *Server) closeEpisode(ctx context.Context, lease store.Lease, ep *episode) error {
	if err := s.eps.save(ctx, lease, ep); err != nil {
		return err
	}
	if ep.Recording != "" && s.recs != nil {
		if err := s.finishRecording(ep); err != nil {
			s.log.Warn("episode: finish recording", "episode_id", ep.ID, "err", err)
		}
	}
	_ = s.mgr.Delete(context.Background(), ep.SandboxID)
	return nil
}

func (s *Server) finishRecording(ep *episode) error {
	w, err := s.recs.Resume(ep.Recording)
	if err != nil {
		return err
	}
	defer w.Close()
	evalJSON, _ := json.Marshal(ep.Eval)
	return w.Finish(func(m *recordings.Manifest) {
		now := time.Now().UTC()
		m.FinishedAt, m.Outcome, m.Reward, m.Answer = &now, ep.Outcome, ep.Reward, ep.Answer
		if ep.Attrib != nil {
			info := ep.Attrib.Info
			m.Attribution, m.AttributionStep = &info, ep.Attrib.Step
		}
		if ep.Eval != nil {
			m.Evaluation = evalJSON
		}
	})
}

func (ep *episode) result() gin.H {
	return gin.H{"episode_id": ep.ID, "outcome": ep.Outcome, "reward": ep.Reward, "evaluation": ep.Eval,
		"attribution": ep.Attrib, "steps": ep.Steps, "answer": ep.Answer, "recording_id": ep.Recording}
}

// getEpisode reads without the lock: a step in progress must not block a
// look at the episode, and the stored state is always a whole one.
func (s *Server) getEpisode(c *gin.Context) error {
	ep, err := s.eps.load(c.Request.Context(), c.Param("id"), false)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, ep.episodeView)
	return nil
}

func (s *Server) listEpisodes(c *gin.Context) error {
	docs, err := s.eps.docs.ListDocs(c.Request.Context(), episodeDoc)
	if err != nil {
		return err
	}
	list := make([]episodeView, 0, len(docs))
	for _, b := range docs {
		var v episodeView
		if json.Unmarshal(b, &v) == nil {
			list = append(list, v)
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].CreatedAt.After(list[j].CreatedAt) })
	out := make([]gin.H, len(list))
	for i, v := range list {
		out[i] = gin.H{"episode_id": v.ID, "task_id": v.TaskID, "sandbox_id": v.SandboxID, "kind": v.Kind, "status": v.Status,
			"steps": v.Steps, "outcome": v.Outcome, "created_at": v.CreatedAt}
	}
	c.JSON(http.StatusOK, gin.H{"episodes": out})
	return nil
}

func (s *Server) deleteEpisode(c *gin.Context) error {
	ctx, ep, lease, unlock, err := s.eps.acquire(c.Request.Context(), c.Param("id"), false)
	if err != nil {
		return err
	}
	defer unlock()
	if !ep.ended() {
		ep.Status = "aborted"
		if err := s.closeEpisode(ctx, lease, ep); err != nil {
			return err
		}
	}
	c.JSON(http.StatusOK, gin.H{"episode_id": ep.ID, "status": ep.Status})
	return nil
}

// Suites loaded with POST /tasks are kept in the store too, so that every
// replica knows them; each replica's registry follows the store. A suite's
// hash is a document of its own, so the check made before each episode
// reads a few bytes per suite, and a suite only when it changed.
const (
	suiteDoc    = "task-suite"
	suiteSumDoc = "task-suite-sum"
)

// syncSuites loads into the registry the suites of the store that it does
// not have in their stored version.
func (s *Server) syncSuites(ctx context.Context) error {
	sums, err := s.eps.docs.ListDocs(ctx, suiteSumDoc)
	if err != nil {
		return err
	}
	s.suitesMu.Lock()
	defer s.suitesMu.Unlock()
	for name, sum := range sums {
		if s.suiteSums[name] == string(sum) {
			continue
		}
		b, ok, err := s.eps.docs.GetDoc(ctx, suiteDoc, name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		var list []tasks.Task
		if err := json.Unmarshal(b, &list); err != nil {
			s.log.Warn("tasks: stored suite does not decode", "suite", name, "err", err)
			continue
		}
		if err := s.tasks.Add(name, list); err != nil {
			s.log.Warn("tasks: stored suite does not load", "suite", name, "err", err)
			continue
		}
		s.suiteSums[name] = string(sum)
	}
	return nil
}

func (s *Server) listTasks(c *gin.Context) error {
	if err := s.syncSuites(c.Request.Context()); err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"suites": s.tasks.List()})
	return nil
}

func (s *Server) suiteTasks(c *gin.Context) error {
	if err := s.syncSuites(c.Request.Context()); err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"suite": c.Param("suite"), "tasks": s.tasks.Tasks(c.Param("suite"))})
	return nil
}

func (s *Server) loadTasks(c *gin.Context) error {
	suite := c.Query("suite")
	if suite == "" {
		return errValidation(validationItem{Type: "missing", Loc: []any{"query", "suite"}, Msg: "Field required", Input: nil})
	}
	name := c.Query("name")
	if name == "" {
		name = suite + ".jsonl"
	}
	list, err := tasks.Parse(bytes.NewReader(body(c)), name)
	if err != nil {
		return err
	}
	if err := s.tasks.Add(suite, list); err != nil {
		return err
	}
	b, err := json.Marshal(s.tasks.Tasks(suite))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	hexSum := hex.EncodeToString(sum[:])
	// The suite before its hash: a replica that sees the new hash finds
	// the new suite.
	if err := s.eps.docs.PutDoc(c.Request.Context(), suiteDoc, suite, b, 0); err != nil {
		return err
	}
	if err := s.eps.docs.PutDoc(c.Request.Context(), suiteSumDoc, suite, []byte(hexSum), 0); err != nil {
		return err
	}
	s.suitesMu.Lock()
	s.suiteSums[suite] = hexSum
	s.suitesMu.Unlock()
	c.JSON(http.StatusOK, gin.H{"suite": suite, "tasks": len(list)})
	return nil
}

func (s *Server) recStore() (*recordings.Store, error) {
	if s.recs == nil {
		return nil, faults.New(faults.CodeKindUnsupported, faults.NotImplemented, faults.Platform, "this server keeps no recordings")
	}
	return s.recs, nil
}

func (s *Server) openRecording(id string) (*recordings.Recording, error) {
	st, err := s.recStore()
	if err != nil {
		return nil, err
	}
	return st.Open(id)
}

func (s *Server) listRecordings(c *gin.Context) error {
	st, err := s.recStore()
	if err != nil {
		return err
	}
	list, err := st.List()
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"recordings": list})
	return nil
}

func (s *Server) getRecording(c *gin.Context) error {
	r, err := s.openRecording(c.Param("id"))
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"manifest": r.Manifest(), "steps": r.Steps()})
	return nil
}

func (s *Server) recordingScreenshot(c *gin.Context) error {
	r, err := s.openRecording(c.Param("id"))
	if err != nil {
		return err
	}
	var n int
	if _, err := fmt.Sscanf(c.Param("n"), "%d", &n); err != nil {
		return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "step %q is not a number", c.Param("n"))
	}
	img, ct, err := r.Image(n)
	if err != nil {
		return err
	}
	c.Data(http.StatusOK, ct, img)
	return nil
}

func (s *Server) exportRecording(c *gin.Context) error {
	r, err := s.openRecording(c.Param("id"))
	if err != nil {
		return err
	}
	format := c.Query("format")
	ct, err := recordings.ContentType(format)
	if err != nil {
		return err
	}
	// Written as it is made: a long recording's screenshots, inlined in
	// the jsonl or HTML export, never sit in memory whole. An error before
	// the first byte is answered as an error.
	w := &lazyResponse{c: c, contentType: ct}
	if _, err := r.Export(c.Request.Context(), format, w); err != nil {
		if !w.started {
			return err
		}
		// Too late for an error body: break the connection so that the
		// client sees a failed transfer, not a short file.
		s.log.Warn("recording export aborted", "recording_id", c.Param("id"), "format", format, "err", err)
		panic(http.ErrAbortHandler)
	}
	if !w.started {
		w.start() // an empty export
	}
	return nil
}

// lazyResponse answers 200 with its content type at the first write.
type lazyResponse struct {
	c           *gin.Context
	contentType string
	started     bool
}

func (w *lazyResponse) start() {
	w.started = true
	w.c.Header("Content-Type", w.contentType)
	w.c.Status(http.StatusOK)
	w.c.Writer.WriteHeaderNow()
}

func (w *lazyResponse) Write(p []byte) (int, error) {
	if !w.started {
		w.start()
	}
	return w.c.Writer.Write(p)
}
