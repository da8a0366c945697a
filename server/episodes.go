package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/evaluate"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/recordings"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/tasks"
)

// Episodes: the RL loop, one call per step (API.md "Episodes"). An episode
// owns a browser sandbox from create to finish; its steps are forwarded to
// the sandbox's browser and recorded; finish runs the task's evaluator.
// Episode state lives in this server process.

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
	// judgeScreenshots are the last screenshots kept for a judge.
	judgeScreenshots = 3
)

type episodeRequest struct {
	TaskID           string          `json:"task_id,omitempty"`
	Task             *tasks.Task     `json:"task,omitempty"`
	Sandbox          json.RawMessage `json:"sandbox,omitempty"` // POST /sandboxes fields (browser, memory, faults, block_network, egress)
	Observe          map[string]any  `json:"observe,omitempty"`
	MaxSteps         int             `json:"max_steps,omitempty"`
	StepTimeoutMS    int             `json:"step_timeout_ms,omitempty"`
	EpisodeTimeoutMS int             `json:"episode_timeout_ms,omitempty"`
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

type episode struct {
	mu sync.Mutex // serialises steps and guards every field below

	ID        string           `json:"episode_id"`
	SandboxID string           `json:"sandbox_id"`
	TaskID    string           `json:"task_id"`
	Status    string           `json:"status"` // running, done, finished, aborted
	Steps     int              `json:"steps"`
	Outcome   string           `json:"outcome,omitempty"`
	Reward    *float64         `json:"reward,omitempty"`
	Answer    string           `json:"answer,omitempty"`
	Attrib    *attribution     `json:"attribution,omitempty"`
	Eval      *evaluate.Result `json:"evaluation,omitempty"`
	CreatedAt time.Time        `json:"created_at"`
	Recording string           `json:"recording_id,omitempty"`

	task        tasks.Task
	observe     map[string]any
	maxSteps    int
	stepTimeout time.Duration
	deadline    time.Time
	lastURL     string
	history     []evaluate.Step
	screens     [][]byte
	rec         *recordings.Writer
}

type episodeStore struct {
	mu  sync.Mutex // guards eps
	eps map[string]*episode
}

func (st *episodeStore) get(id string) (*episode, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	ep, ok := st.eps[id]
	if !ok {
		return nil, faults.Newf(faults.CodeEpisodeNotFound, faults.NotFound, faults.Client, "Episode %s not found", id)
	}
	return ep, nil
}

func (s *Server) episodeRoutes() []route {
	return []route{
		{method: "POST", path: "/episodes", summary: "Start an episode: a browser sandbox on the task's start URL; returns the first observation",
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

// browserCall forwards one request to a sandbox's browser daemon.
func (s *Server) browserCall(ctx context.Context, sandboxID, path string, body any) (int, []byte, error) {
	if s.agentHTTP == nil {
		return 0, nil, faults.New(faults.CodeKindUnsupported, faults.NotImplemented, faults.Platform, "this server does not forward to agents")
	}
	addr, err := s.mgr.AgentAddr(ctx, sandboxID)
	if err != nil {
		return 0, nil, err
	}
	base, rt := s.agentHTTP(addr)
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base.String(), "/")+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		if d := s.mgr.DeathFault(ctx, sandboxID); d != nil {
			return 0, nil, d
		}
		return 0, nil, faults.Wrap(err, faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "the sandbox's agent did not answer")
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	return resp.StatusCode, raw, err
}

// envelopeError decodes an error answer of the agent.
func envelopeError(status int, raw []byte) *faults.Error {
	var env faults.Envelope
	if json.Unmarshal(raw, &env) == nil && env.Error != nil {
		return faults.FromInfo(*env.Error, status)
	}
	return faults.Newf(faults.CodeBadResponse, faults.Unavailable, faults.Platform, "browser answered %d", status)
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
	var task tasks.Task
	switch {
	case req.Task != nil:
		task = *req.Task
		if task.ID == "" {
			task.ID = "inline-" + uuid.NewString()[:8]
		}
	case req.TaskID != "":
		t, err := s.tasks.Get(req.TaskID)
		if err != nil {
			return err
		}
		task = t
	default:
		return errValidation(validationItem{Type: "missing", Loc: []any{"body", "task_id"}, Msg: "task or task_id is required", Input: nil})
	}
	ep := &episode{
		ID: uuid.NewString()[:12], TaskID: task.ID, Status: "running", CreatedAt: time.Now().UTC(),
		task: task, observe: req.Observe, maxSteps: req.MaxSteps, stepTimeout: time.Duration(req.StepTimeoutMS) * time.Millisecond,
	}
	if ep.maxSteps <= 0 {
		ep.maxSteps = task.MaxSteps
	}
	if ep.maxSteps <= 0 {
		ep.maxSteps = defaultMaxSteps
	}
	if ep.stepTimeout <= 0 {
		ep.stepTimeout = defaultStepTimeout
	}
	total := time.Duration(req.EpisodeTimeoutMS) * time.Millisecond
	if total <= 0 {
		total = defaultEpisodeTimeout
	}
	ep.deadline = time.Now().Add(total)
	if ep.observe == nil {
		ep.observe = map[string]any{"screenshot": "jpeg", "som": true}
	}

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
	if spec.Image != "" {
		p.Image = spec.Image
	}
	if spec.BlockNetwork != nil {
		p.BlockNetwork = *spec.BlockNetwork
	}
	if spec.Memory != nil {
		p.Memory = *spec.Memory
	}
	if spec.CPU != nil {
		p.CPU = *spec.CPU
	}
	p.KindOptions = spec.Browser
	if spec.Egress != nil {
		p.EgressAllow = spec.Egress.Allow
	}
	if len(spec.Faults) > 0 && string(spec.Faults) != "null" {
		var plan faults.Plan
		if err := json.Unmarshal(spec.Faults, &plan); err != nil {
			return faults.Wrap(err, faults.CodeFaultPlanInvalid, faults.InvalidRequest, faults.Client, "faults: "+err.Error())
		}
		if err := plan.Validate(); err != nil {
			return err
		}
		p.Faults, _ = json.Marshal(plan)
	}
	p.Labels = map[string]string{"orchard.episode": ep.ID}
	ctx := c.Request.Context()
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
	if req.Record == nil || *req.Record {
		if s.recs != nil {
			w, err := s.recs.Create(recordings.Manifest{ID: ep.ID, EpisodeID: ep.ID, TaskID: task.ID, Question: task.Question,
				StartURL: task.StartURL, SandboxID: rec.ID, Kind: api.KindBrowser, CreatedAt: ep.CreatedAt})
			if err != nil {
				s.log.Warn("episode: recording", "episode_id", ep.ID, "err", err)
			} else {
				ep.rec, ep.Recording = w, ep.ID
			}
		}
	}
	s.eps.mu.Lock()
	s.eps.eps[ep.ID] = ep
	s.eps.mu.Unlock()

	// Step 0: the start page, loaded with the navigation retry policy.
	first := map[string]any{"observe": ep.observe}
	if task.StartURL != "" {
		first["actions"] = []map[string]any{{"type": "navigate", "url": task.StartURL,
			"retry": map[string]any{"attempts": 3, "initial_ms": 500, "max_ms": 4000}}}
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	out, err := s.runStep(ctx, ep, first, true)
	if err != nil {
		return err
	}
	out["episode_id"], out["sandbox_id"] = ep.ID, ep.SandboxID
	c.JSON(http.StatusOK, out)
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
		job, err := s.mgr.Exec(ctx, id, manager.ExecParams{Command: cmd, TimeoutSeconds: 120, Wait: true})
		if err != nil {
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

// runStep sends one browser request for ep (ep.mu held) and records it.
func (s *Server) runStep(ctx context.Context, ep *episode, req map[string]any, reset bool) (gin.H, error) {
	start := time.Now()
	sctx, cancel := context.WithTimeoutCause(ctx, ep.stepTimeout,
		faults.Newf(faults.CodeEpisodeDeadline, faults.Timeout, faults.Policy, "step %d ran past its %s budget", ep.Steps+1, ep.stepTimeout))
	defer cancel()
	status, raw, err := s.browserCall(sctx, ep.SandboxID, "/browser/actions", req)
	info := episodeInfo{Step: ep.Steps}
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
		i := faults.Of(err).Info()
		info.Error = &i
	case status != http.StatusOK:
		i := envelopeError(status, raw).Info()
		info.Error = &i
	default:
		if err := json.Unmarshal(raw, &resp); err != nil {
			i := faults.Wrap(err, faults.CodeBadResponse, faults.Unavailable, faults.Platform, "bad browser answer").Info()
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
	var action json.RawMessage
	if acts, ok := req["actions"]; ok {
		action, _ = json.Marshal(acts)
		var list []map[string]any
		_ = json.Unmarshal(action, &list)
		for _, a := range list {
			if a["type"] == "answer" {
				ep.Answer, _ = a["text"].(string)
				done = true
			}
		}
	}
	if ep.Steps >= ep.maxSteps || time.Now().After(ep.deadline) {
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
			Format string `json:"format"`
			Data   []byte `json:"data"`
			Width  int    `json:"width"`
			Height int    `json:"height"`
		} `json:"screenshot"`
	}
	_ = json.Unmarshal(resp.Observation, &obs)
	if obs.URL != "" {
		ep.lastURL = obs.URL
	}
	errText := ""
	if info.Error != nil {
		errText = info.Error.Code
	}
	if !reset {
		ep.history = append(ep.history, evaluate.Step{N: info.Step, Action: action, URL: obs.URL, Error: errText})
	}
	var shot []byte
	ext := ""
	if obs.Screenshot != nil && len(obs.Screenshot.Data) > 0 {
		shot, ext = obs.Screenshot.Data, obs.Screenshot.Format
		ep.screens = append(ep.screens, shot)
		if len(ep.screens) > judgeScreenshots {
			ep.screens = ep.screens[len(ep.screens)-judgeScreenshots:]
		}
	}
	if ep.rec != nil {
		st := recordings.Step{N: info.Step, Time: start.UTC(), Action: action, Result: raw, URL: obs.URL, Title: obs.Title,
			Text: obs.Text, AXTree: obs.AXTree, Frame: obs.Frame, Scale: obs.Scale, StepMS: info.StepMS, Error: info.Error, Injected: info.Injected}
		if obs.Screenshot != nil {
			st.Width, st.Height = obs.Screenshot.Width, obs.Screenshot.Height
		}
		if err := ep.rec.Append(st, shot, ext); err != nil {
			s.log.Warn("episode: record step", "episode_id", ep.ID, "err", err)
		}
	}
	return gin.H{"observation": resp.Observation, "done": done, "info": info}, nil
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
	ep, err := s.eps.get(c.Param("id"))
	if err != nil {
		return err
	}
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
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.Status != "running" {
		return faults.Newf(faults.CodeEpisodeDone, faults.Conflict, faults.Client, "episode %s is %s: finish it or start another", ep.ID, ep.Status)
	}
	observe := ep.observe
	if req.Observe != nil {
		observe = req.Observe
	}
	out, err := s.runStep(c.Request.Context(), ep, map[string]any{"actions": actions, "observe": observe}, false)
	if err != nil {
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
	status, raw, err := p.s.browserCall(ctx, p.ep.SandboxID, "/browser/evaluate", map[string]string{"expression": expr})
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

func (s *Server) finishEpisode(c *gin.Context) error {
	ep, err := s.eps.get(c.Param("id"))
	if err != nil {
		return err
	}
	var req struct {
		Answer *string `json:"answer"`
	}
	if b := body(c); len(bytes.TrimSpace(b)) > 0 {
		if err := decodeJSON(b, &req); err != nil {
			return err
		}
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.Status == "finished" || ep.Status == "aborted" {
		c.JSON(http.StatusOK, ep.result())
		return nil
	}
	if req.Answer != nil {
		ep.Answer = *req.Answer
	}
	ctx := c.Request.Context()
	if ep.Outcome == "" {
		if ep.task.Eval == nil {
			return faults.Newf(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, "task %s has no eval block", ep.task.ID)
		}
		tr := evaluate.Trajectory{Question: ep.task.Question, Answer: ep.Answer, StartURL: ep.task.StartURL, Steps: ep.history, Screenshots: ep.screens}
		res, err := s.evaluator.Evaluate(ctx, *ep.task.Eval, tr, episodePage{s: s, ep: ep, url: ep.lastURL})
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
	s.closeEpisode(ep)
	c.JSON(http.StatusOK, ep.result())
	return nil
}

// closeEpisode finishes the recording and releases the sandbox (ep.mu held).
func (s *Server) closeEpisode(ep *episode) {
	if ep.rec != nil {
		evalJSON, _ := json.Marshal(ep.Eval)
		err := ep.rec.Finish(func(m *recordings.Manifest) {
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
		if err != nil {
			s.log.Warn("episode: finish recording", "episode_id", ep.ID, "err", err)
		}
		ep.rec = nil
	}
	_ = s.mgr.Delete(context.Background(), ep.SandboxID)
}

func (ep *episode) result() gin.H {
	return gin.H{"episode_id": ep.ID, "outcome": ep.Outcome, "reward": ep.Reward, "evaluation": ep.Eval,
		"attribution": ep.Attrib, "steps": ep.Steps, "answer": ep.Answer, "recording_id": ep.Recording}
}

func (s *Server) getEpisode(c *gin.Context) error {
	ep, err := s.eps.get(c.Param("id"))
	if err != nil {
		return err
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	c.JSON(http.StatusOK, ep)
	return nil
}

func (s *Server) listEpisodes(c *gin.Context) error {
	s.eps.mu.Lock()
	list := make([]gin.H, 0, len(s.eps.eps))
	for _, ep := range s.eps.eps {
		list = append(list, gin.H{"episode_id": ep.ID, "task_id": ep.TaskID, "sandbox_id": ep.SandboxID, "created_at": ep.CreatedAt})
	}
	s.eps.mu.Unlock()
	c.JSON(http.StatusOK, gin.H{"episodes": list})
	return nil
}

func (s *Server) deleteEpisode(c *gin.Context) error {
	ep, err := s.eps.get(c.Param("id"))
	if err != nil {
		return err
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.Status != "finished" && ep.Status != "aborted" {
		ep.Status = "aborted"
		s.closeEpisode(ep)
	}
	c.JSON(http.StatusOK, gin.H{"episode_id": ep.ID, "status": ep.Status})
	return nil
}

func (s *Server) listTasks(c *gin.Context) error {
	c.JSON(http.StatusOK, gin.H{"suites": s.tasks.List()})
	return nil
}

func (s *Server) suiteTasks(c *gin.Context) error {
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
	var buf bytes.Buffer
	ct, err := r.Export(c.Request.Context(), c.Query("format"), &buf)
	if err != nil {
		return err
	}
	c.Data(http.StatusOK, ct, buf.Bytes())
	return nil
}
