package server

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/uuid"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/episodes"
	"github.com/orchard/orchard/evaluate"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/recordings"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/tasks"
)

// Episodes: the RL loop, one call per step (API.md "Episodes"). An episode
// owns a browser, desktop or shell sandbox from create to finish; its
// steps are forwarded to the sandbox's browser or desktop daemon, or run
// as commands, file writes and patches in a shell sandbox, and recorded;
// finish runs the task's evaluator. The episode's state, its rules and its
// persistence are package episodes'; these handlers decode, drive the
// sandbox and render.

// Episode sandbox budgets, each with its reason.
const (
	// episodeFinishGrace is how long past its deadline an episode's sandbox
	// is kept (at most the episode's own length) for a finish to evaluate
	// the final page; then the cleanup sweep removes it.
	episodeFinishGrace = 5 * time.Minute
	// execEvalTimeout bounds an exec eval's command: a check of files or
	// settings, not a build.
	execEvalTimeout = 60
)

func (s *Server) episodeRoutes() []route {
	return append([]route{
		{method: "POST", path: "/episodes", summary: "Start an episode: a browser sandbox on the task's start URL, a desktop sandbox (setup.sandbox or sandbox kind \"desktop\") or a shell sandbox (kind \"shell\"); returns the first observation",
			request: episodeRequestDoc{}, response: api.EpisodeStart{}, handler: s.createEpisode},
		{method: "GET", path: "/episodes", summary: "List episodes", response: api.EpisodeList{}, handler: s.listEpisodes},
		{method: "GET", path: "/episodes/:id", summary: "An episode: status, steps so far, outcome", response: api.EpisodeStatus{}, handler: s.getEpisode},
		{method: "POST", path: "/episodes/:id/step", summary: "One action → the observation, done and info (classified error, step, timing)",
			request: api.StepRequest{}, response: api.StepResult{}, handler: s.stepEpisode},
		{method: "POST", path: "/episodes/:id/finish", summary: "Evaluate: outcome (success, failure, env_error), reward, evaluation, attribution",
			request: api.FinishEpisodeRequest{}, response: api.EpisodeResult{}, handler: s.finishEpisode},
		{method: "DELETE", path: "/episodes/:id", summary: "Abort an episode and release its sandbox", response: api.EpisodeDeleted{}, handler: s.deleteEpisode},
		{method: "GET", path: "/tasks", summary: "Loaded task suites", response: suiteList{}, handler: s.listTasks},
		{method: "POST", path: "/tasks", summary: "Load a task suite: the body is the file (our JSONL/YAML, WebVoyager JSONL, Online-Mind2Web JSON); ?suite=NAME&name=FILE.ext",
			query:   []queryParam{{"suite", "string", "suite name", true}, {"name", "string", "file name (its extension picks the format)", false}},
			rawBody: true, response: suiteLoaded{}, handler: s.loadTasks},
		{method: "GET", path: "/tasks/:suite", summary: "The tasks of a suite", response: suiteTasks{}, handler: s.suiteTasks},
		{method: "GET", path: "/recordings", summary: "Episode recordings, newest first", response: recordingList{}, handler: s.listRecordings},
		{method: "GET", path: "/recordings/:id", summary: "A recording's manifest and its own steps (a branch's first steps are its manifest's parent's)", response: recordingDoc{}, handler: s.getRecording},
		{method: "GET", path: "/recordings/:id/steps/:n/screenshot", summary: "The screenshot of a recorded step (a branch's first steps: its parent's)", produces: "image/jpeg", handler: s.recordingScreenshot},
		{method: "GET", path: "/recordings/:id/export", summary: "Export: jsonl, parquet, gif, mp4 or html (a self-contained replay); a branch's export is its whole trajectory, its parent's first steps included",
			query: []queryParam{{"format", "string", "jsonl, parquet, gif, mp4 or html", true}}, produces: "application/octet-stream", handler: s.exportRecording},
	}, s.forkEpisodeRoutes()...)
}

// agentCall posts one request to path on a sandbox's agent, which serves
// it or forwards it to the sandbox's browser or desktop daemon.
func (s *Server) agentCall(ctx context.Context, sandboxID, path string, body any) (int, []byte, error) {
	status, _, raw, err := s.agentCallHeader(ctx, sandboxID, path, body)
	return status, raw, err
}

// agentCallHeader is agentCall that also returns the response's header.
func (s *Server) agentCallHeader(ctx context.Context, sandboxID, path string, body any) (int, http.Header, []byte, error) {
	a, err := s.mgr.Agent(ctx, sandboxID)
	if err != nil {
		return 0, nil, nil, err
	}
	base, rt := a.HTTP()
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

// episodeRequest is the body of POST /episodes with its inline task
// decoded as a task (package api does not know tasks); the OpenAPI
// document names its schema after it.
type episodeRequest struct {
	api.CreateEpisodeRequest // its Task is decoded by tasks.ParseInline, as strictly as a task file
}

// episodeRequestDoc is episodeRequest as the OpenAPI document shows it:
// the inline task with its schema.
type episodeRequestDoc struct {
	api.CreateEpisodeRequest
	Task *tasks.Task `json:"task,omitempty"`
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
	task, err := s.episodeTask(c.Request.Context(), req)
	if err != nil {
		return err
	}
	if task.Eval != nil {
		if err := s.evaluator.Ready(*task.Eval); err != nil {
			return err
		}
	}
	total := time.Duration(req.EpisodeTimeoutMS) * time.Millisecond
	if total <= 0 {
		total = episodes.DefaultTimeout
	}
	p, err := s.episodeSandbox(task, req.Sandbox, total)
	if err != nil {
		return err
	}
	ep := episodes.New(uuid.NewString()[:12], task, p.Kind, req.Observe, episodes.Limits{MaxSteps: req.MaxSteps,
		StepTimeout: time.Duration(req.StepTimeoutMS) * time.Millisecond, Total: total}, time.Now())
	p.Labels["orchard.episode"] = ep.EpisodeID
	// Nobody knows the id yet: the lock is free, and held from here so the
	// first state written is the whole first step's.
	ctx, lease, unlock, err := s.eps.Lock(c.Request.Context(), ep.EpisodeID)
	if err != nil {
		return err
	}
	defer unlock()
	id, err := s.startEpisodeSandbox(ctx, p, task.Setup)
	if err != nil {
		return err
	}
	ep.SandboxID = id
	release := func() { _ = s.mgr.Delete(context.Background(), id) }
	if (req.Record == nil || *req.Record) && s.recs != nil {
		s.startRecording(ep)
	}
	out := s.runStep(ctx, ep, ep.FirstStep())
	if err := s.eps.Save(ctx, lease, ep); err != nil {
		release()
		return err
	}
	c.JSON(http.StatusOK, api.EpisodeStart{EpisodeID: ep.EpisodeID, SandboxID: ep.SandboxID, StepResult: out})
	return nil
}

// startEpisodeSandbox creates the sandbox p, waits for it and sets the
// task up in it; a sandbox that fails on the way is removed.
func (s *Server) startEpisodeSandbox(ctx context.Context, p manager.CreateParams, setup *tasks.Setup) (string, error) {
	rec, err := s.mgr.Create(ctx, p)
	if err != nil {
		return "", err
	}
	release := func() { _ = s.mgr.Delete(context.Background(), rec.ID) }
	if sb, err := s.mgr.Wait(ctx, rec.ID, 120); err != nil || sb.Status != api.StatusReady {
		release()
		if err == nil {
			err = faults.Newf(faults.CodeSandboxDied, faults.Unavailable, faults.Sandbox, "episode sandbox did not start: %s", sb.StatusMessage)
		}
		return "", err
	}
	if err := s.setupTask(ctx, rec.ID, setup); err != nil {
		release()
		return "", err
	}
	return rec.ID, nil
}

// startRecording opens ep's recording; an episode whose recording cannot
// be made runs unrecorded.
func (s *Server) startRecording(ep *episodes.Episode) {
	w, err := s.recs.Create(recordings.Manifest{ID: ep.EpisodeID, EpisodeID: ep.EpisodeID, TaskID: ep.Task.ID, Suite: ep.Task.Suite, Question: ep.Task.Question,
		StartURL: ep.Task.StartURL, SandboxID: ep.SandboxID, Kind: ep.Kind, CreatedAt: ep.CreatedAt})
	if err != nil {
		s.log.Warn("episode: recording", "episode_id", ep.EpisodeID, "err", err)
		return
	}
	_ = w.Close()
	ep.RecordingID = ep.EpisodeID
}

// episodeTask is the task a create names: inline, or loaded (from any
// replica's POST /tasks).
func (s *Server) episodeTask(ctx context.Context, req episodeRequest) (tasks.Task, error) {
	switch {
	case len(req.Task) > 0 && string(req.Task) != "null":
		return tasks.ParseInline(req.Task, "inline-"+uuid.NewString()[:8])
	case req.TaskID != "":
		if err := s.syncSuites(ctx); err != nil {
			return tasks.Task{}, err
		}
		return s.tasks.Get(req.TaskID)
	}
	return tasks.Task{}, faults.Validation(faults.FieldError{Type: "missing", Loc: []any{"body", "task_id"}, Msg: "task or task_id is required", Input: nil})
}

// episodeSandbox is the sandbox of an episode of task lasting total: the
// request's settings (raw) over the task's over ours. It lives no longer
// than the episode, and a grace for a late finish to evaluate in: one its
// trainer abandons is not kept until the server-wide TTL (hours).
func (s *Server) episodeSandbox(task tasks.Task, raw json.RawMessage, total time.Duration) (manager.CreateParams, error) {
	p := manager.CreateParams{Kind: api.KindBrowser, Image: "host", BlockNetwork: false}
	var spec api.CreateSandboxRequest
	for _, raw := range []json.RawMessage{taskSandbox(task), raw} {
		if len(raw) > 0 && string(raw) != "null" {
			if err := json.Unmarshal(raw, &spec); err != nil {
				return p, faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "sandbox: "+err.Error())
			}
		}
	}
	if err := s.sandboxParams(&p, spec, "body", "sandbox"); err != nil {
		return p, err
	}
	if err := episodeKind(&p, task); err != nil {
		return p, err
	}
	if ttl := int(math.Ceil((total + min(total, episodeFinishGrace)).Seconds())); p.TTLSeconds <= 0 || p.TTLSeconds > ttl {
		p.TTLSeconds = ttl
	}
	p.Labels = maps.Clone(p.Labels)
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	return p, nil
}

// episodeKind checks the sandbox kind of an episode (p as the request and
// the task set it, settings already checked against it): a browser, or a
// desktop whose chromium app opens the task's start URL unless told
// otherwise.
func episodeKind(p *manager.CreateParams, task tasks.Task) error {
	switch p.Kind {
	case api.KindBrowser:
	case api.KindShell:
		if err := task.CheckKind(api.KindShell); err != nil {
			return faults.Newf(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, "task %s: %v", task.ID, err)
		}
	case api.KindDesktop:
		if err := task.CheckKind(api.KindDesktop); err != nil {
			return faults.Newf(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, "task %s: %v", task.ID, err)
		}
		if task.StartURL != "" {
			opts := map[string]any{}
			if len(p.KindOptions) > 0 && string(p.KindOptions) != "null" {
				if err := json.Unmarshal(p.KindOptions, &opts); err != nil || opts == nil {
					return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "sandbox", "desktop"},
						Msg: "desktop settings must be an object", Input: jsonInput(p.KindOptions)})
				}
			}
			if _, ok := opts["url"]; !ok {
				opts["url"] = task.StartURL
				p.KindOptions, _ = json.Marshal(opts)
			}
		}
	default:
		return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body", "sandbox", "kind"},
			Msg: "episodes run in a \"browser\", \"desktop\" or \"shell\" sandbox", Input: p.Kind})
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
	if st.Repo != nil {
		if err := s.setupRepo(ctx, id, st.Repo); err != nil {
			return err
		}
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
	return s.execJob(ctx, id, manager.ExecParams{Command: cmd, TimeoutSeconds: timeout, Wait: true})
}

// runStep runs st in ep's sandbox (ep's lock held), moves ep past it and
// records it. Failures are the step's info, not an error: the trainer gets
// them as the step's outcome.
func (s *Server) runStep(ctx context.Context, ep *episodes.Episode, st episodes.Step) api.StepResult {
	start := time.Now()
	budget, cause := ep.StepTimeoutCause()
	sctx, cancel := context.WithTimeoutCause(ctx, budget, cause)
	defer cancel()
	var (
		o      episodes.Outcome
		raw    []byte
		status = http.StatusOK
		hdr    = http.Header{}
		err    error
	)
	if ep.Shell() {
		o, raw, err = s.runShellStep(sctx, ep, st)
	} else {
		path, body := st.Request(ep.Desktop())
		status, hdr, raw, err = s.agentCallHeader(sctx, ep.SandboxID, path, body)
	}
	if kind := hdr.Get(egress.HeaderInjected); kind != "" && !faults.IsNetwork(kind) {
		// A step fault (a browser crash or hang) is tagged on the response
		// only: its truth depends on its kind alone. Network faults come
		// with their truth in the results.
		truth := faults.TruthOf(faults.Injection{Kind: kind})
		o.Injected = &truth
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
		o.Error = &i
	case status != http.StatusOK:
		i := envelopeError(status, raw).Info()
		o.Error = &i
	case ep.Shell():
	default:
		o.Decode(raw, ep.Kind)
	}
	o.Elapsed = time.Since(start)
	out, obs := ep.Apply(st, o, time.Now())
	if e := out.Info.Error; e != nil && e.Code == faults.CodeSiteBlocked {
		s.reportBlocked(ctx, cmp.Or(obs.URL, ep.LastURL), e.Message)
	}
	if ep.RecordingID != "" && s.recs != nil {
		s.recordStep(ep, st, out.Info, obs, start, raw)
	}
	return out
}

// blockReporter is a site health that counts bot walls.
type blockReporter interface {
	ReportBlocked(ctx context.Context, host, evidence string)
}

// reportBlocked counts a bot wall or CAPTCHA at pageURL in its host's
// site health, so GET /sitehealth shows which sites refuse the
// environment.
func (s *Server) reportBlocked(ctx context.Context, pageURL, evidence string) {
	r, ok := s.cfg.SiteHealth.(blockReporter)
	u, err := url.Parse(pageURL)
	if !ok || err != nil || u.Hostname() == "" {
		return
	}
	r.ReportBlocked(ctx, u.Hostname(), evidence)
}

// recordStep appends a step to ep's recording; a recording that fails is
// logged, the episode goes on.
func (s *Server) recordStep(ep *episodes.Episode, st episodes.Step, info api.StepInfo, obs episodes.Observation, start time.Time, raw []byte) {
	rs := recordings.Step{N: info.Step, Time: start.UTC(), Action: st.Action, Result: raw, URL: obs.URL, Title: obs.Title,
		Text: obs.Text, AXTree: obs.AXTree, Frame: obs.Frame, Scale: obs.Scale, StepMS: info.StepMS, Error: info.Error, Injected: info.Injected}
	var shot []byte
	ext := ""
	if sc := obs.Screenshot; sc != nil {
		rs.Width, rs.Height = sc.Width, sc.Height
		if len(sc.Data) > 0 {
			shot, ext = sc.Data, sc.Format
		}
	}
	if err := s.appendRecording(ep.RecordingID, rs, shot, ext); err != nil {
		s.log.Warn("episode: record step", "episode_id", ep.EpisodeID, "err", err)
	}
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

func (s *Server) stepEpisode(c *gin.Context) error {
	var req api.StepRequest
	if err := decodeJSON(body(c), &req); err != nil {
		return err
	}
	if len(req.Action) == 0 && len(req.Actions) == 0 {
		// Refused before the lock: a malformed step is the same on any
		// episode, known or not.
		return faults.Validation(faults.FieldError{Type: "missing", Loc: []any{"body", "action"}, Msg: "Field required", Input: nil})
	}
	ctx, ep, lease, unlock, err := s.eps.Acquire(c.Request.Context(), c.Param("id"), true)
	if err != nil {
		return err
	}
	defer unlock()
	if err := ep.CheckRunning(); err != nil {
		return err
	}
	st, err := ep.NextStep(req)
	if err != nil {
		return err
	}
	out := s.runStep(ctx, ep, st)
	// Saved even when the caller went away mid-step: the step ran (in part)
	// and is recorded, so a retry must be the next step, not this one
	// again. The lease still fences the write.
	if err := s.eps.Save(context.WithoutCancel(ctx), lease, ep); err != nil {
		return err
	}
	c.JSON(http.StatusOK, out)
	return nil
}

// episodePage is the live page an evaluator looks at.
type episodePage struct {
	s         *Server
	sandboxID string
	url       string
}

func (p episodePage) URL() string { return p.url }

func (p episodePage) Eval(ctx context.Context, expr string) (json.RawMessage, error) {
	status, raw, err := p.s.agentCall(ctx, p.sandboxID, "/browser/evaluate", api.EvaluateRequest{Expression: expr})
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, envelopeError(status, raw)
	}
	var v api.EvaluateResult
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return v.Value, nil
}

// episodeSandbox is the sandbox an exec eval runs its command in.
type evalSandbox struct {
	s  *Server
	id string
}

func (sb evalSandbox) Exec(ctx context.Context, command string) (evaluate.ExecResult, error) {
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
	var req api.FinishEpisodeRequest
	if b := body(c); len(bytes.TrimSpace(b)) > 0 {
		if err := decodeJSON(b, &req); err != nil {
			return err
		}
	}
	ctx, ep, lease, unlock, err := s.eps.Acquire(c.Request.Context(), c.Param("id"), true)
	if err != nil {
		return err
	}
	defer unlock()
	if ep.Ended() {
		c.JSON(http.StatusOK, ep.Result())
		return nil
	}
	err = ep.Finish(req.Answer, func(tr evaluate.Trajectory) (evaluate.Result, error) {
		env := evaluate.Env{Sandbox: evalSandbox{s: s, id: ep.SandboxID}}
		if ep.Browser() {
			env.Page = episodePage{s: s, sandboxID: ep.SandboxID, url: ep.LastURL}
		}
		return s.evaluator.Evaluate(ctx, *ep.Task.Eval, tr, env)
	})
	if err != nil {
		return err
	}
	if err := s.closeEpisode(ctx, lease, ep); err != nil {
		return err
	}
	c.JSON(http.StatusOK, ep.Result())
	return nil
}

// closeEpisode stores the ended episode, finishes its recording and
// releases its sandbox (its lock held). The state is stored first: a
// replica that lost the lock leaves both to the holder.
func (s *Server) closeEpisode(ctx context.Context, lease store.Lease, ep *episodes.Episode) error {
	if err := s.eps.Save(ctx, lease, ep); err != nil {
		return err
	}
	if ep.RecordingID != "" && s.recs != nil {
		if err := s.finishRecording(ep); err != nil {
			s.log.Warn("episode: finish recording", "episode_id", ep.EpisodeID, "err", err)
		}
	}
	_ = s.mgr.Delete(context.Background(), ep.SandboxID)
	return nil
}

func (s *Server) finishRecording(ep *episodes.Episode) error {
	w, err := s.recs.Resume(ep.RecordingID)
	if err != nil {
		return err
	}
	defer w.Close()
	return w.Finish(func(m *recordings.Manifest) {
		now := time.Now().UTC()
		m.FinishedAt, m.Outcome, m.Reward, m.Answer = &now, ep.Outcome, ep.Reward, ep.Answer
		if ep.Attribution != nil {
			info := ep.Attribution.Info
			m.Attribution, m.AttributionStep = &info, ep.Attribution.Step
		}
		if ep.Evaluation != nil {
			m.Evaluation, _ = json.Marshal(ep.Evaluation)
		}
	})
}

// getEpisode reads without the lock: a step in progress must not block a
// look at the episode, and the stored state is always a whole one.
func (s *Server) getEpisode(c *gin.Context) error {
	ep, err := s.eps.Load(c.Request.Context(), c.Param("id"), false)
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, ep.EpisodeStatus)
	return nil
}

func (s *Server) listEpisodes(c *gin.Context) error {
	list, err := s.eps.List(c.Request.Context())
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, api.EpisodeList{Episodes: list})
	return nil
}

func (s *Server) deleteEpisode(c *gin.Context) error {
	ctx, ep, lease, unlock, err := s.eps.Acquire(c.Request.Context(), c.Param("id"), false)
	if err != nil {
		return err
	}
	defer unlock()
	if ep.Abort() {
		if err := s.closeEpisode(ctx, lease, ep); err != nil {
			return err
		}
	}
	c.JSON(http.StatusOK, api.EpisodeDeleted{EpisodeID: ep.EpisodeID, Status: ep.Status})
	return nil
}
