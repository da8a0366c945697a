// Package runner runs many episodes concurrently against an Orchard server
// over its REST API: a suite of tasks, a policy per episode (scripted,
// random, or one served at a URL), re-queuing episodes that end env_error
// within a budget, and a Summary of outcomes, attributions, step latency
// and throughput. `orchard run` and `orchard demo` are built on it.
package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/tasks"
)

// Defaults and bounds of a run, each with its reason.
const (
	// serverMaxSteps is the server's step budget when neither the run nor
	// the task sets one (WebVoyager's, episodes.DefaultMaxSteps).
	serverMaxSteps = 30
	// abortTimeout bounds the DELETE of an episode the run gives up on:
	// the server answers at once and tears the sandbox down behind it.
	abortTimeout = 15 * time.Second
)

// Requeue says how episodes that end env_error are run again. The zero
// value never re-queues.
type Requeue struct {
	// MaxAttempts caps the episodes of one sample of a task (of one task
	// when Config.Samples is 1), the first included; 0 or 1 means one
	// episode.
	MaxAttempts int
	// Budget caps the re-queues of the whole run, so a broken environment
	// cannot multiply the run's length; 0 means none.
	Budget int
}

// Config is one run.
type Config struct {
	// Client talks to the server.
	Client *client.Client
	// Tasks are run in order (up to Concurrency at a time). A task with a
	// Suite (as GET /tasks/{suite} returns it) is started by id; one
	// without is sent inline.
	Tasks []tasks.Task
	// Policy makes each episode's policy.
	Policy Factory
	// Concurrency is how many episodes run at once; 0 means 1.
	Concurrency int
	// MaxSteps caps each episode's steps; 0 means the task's max_steps or
	// the server's default (30).
	MaxSteps int
	// StepTimeout bounds one step on the server; 0 means its default.
	StepTimeout time.Duration
	// Observe chooses the parts of each observation; nil means the
	// server's default (screenshot and set-of-marks elements).
	Observe *api.Observe
	// Sandbox is merged over each task's sandbox settings: a fault plan
	// ({"faults": {"faults": [...]}}), memory, browser options.
	Sandbox json.RawMessage
	// Record keeps a recording of each episode on the server.
	Record bool
	// Requeue is the env_error re-queue budget.
	Requeue Requeue
	// Samples is how many scored episodes each task gets, for pass@1 and
	// pass@Samples (Summary.PassAtK); 0 means 1. An episode that ends
	// env_error is not a sample: it is re-queued as Requeue allows.
	Samples int
	// OnEvent, when set, is called as episodes start, step and end. Calls
	// are serialized: it need not be safe for concurrent use, but it
	// should return quickly.
	OnEvent func(Event)
}

// Event types.
const (
	EventStarted  = "started"  // an episode was created
	EventStep     = "step"     // an episode took a step
	EventEnded    = "ended"    // an episode ended (Result set)
	EventRequeued = "requeued" // an env_error episode's task was queued again
	EventTaskDone = "task_done"
)

// Event reports progress.
type Event struct {
	Type      string
	TaskID    string
	Attempt   int
	EpisodeID string
	Step      int
	// Result is the episode's result, for EventEnded.
	Result *EpisodeResult
	// Progress is the run's state after the event.
	Progress Progress
}

// Progress is the state of a run.
type Progress struct {
	Total    int // tasks
	Done     int // tasks with a final outcome
	Running  int // episodes in flight
	Episodes int // episodes ended
	Success  int
	Failure  int
	EnvError int
	Error    int
	Elapsed  time.Duration
}

// EpisodesPerMinute is the rate at which episodes ended so far.
func (p Progress) EpisodesPerMinute() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Episodes) / p.Elapsed.Minutes()
}

// ETA estimates the time left from the pace of tasks done so far; zero
// until one is done.
func (p Progress) ETA() time.Duration {
	if p.Done == 0 || p.Done >= p.Total {
		return 0
	}
	return time.Duration(float64(p.Elapsed) / float64(p.Done) * float64(p.Total-p.Done))
}

// job is one episode to run: the task's index, which of its samples
// and the how-many-th episode of that sample it is.
type job struct {
	task   int
	sample int
	tries  int
}

// run is the state of one Run.
type run struct {
	cfg   Config
	start time.Time

	mu       sync.Mutex // guards progress and budget, and serializes OnEvent
	progress Progress
	budget   int // re-queues left

	resMu    sync.Mutex        // guards results, finals, episodes and left
	results  []TaskResult      // by task
	finals   [][]EpisodeResult // by task, by sample: the sample's last episode
	episodes []int             // by task: episodes started
	left     []int             // by task: samples not yet final
}

// Run runs every task of cfg and summarizes the results. It returns an
// error only when the run could not complete: a bad Config, or ctx ending
// (then episodes in flight are aborted, tasks not started are reported
// canceled, and the Summary covers what ran). Episode failures of any kind
// are results, in the Summary.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	switch {
	case cfg.Client == nil:
		return Summary{}, errors.New("run: no client")
	case cfg.Policy == nil:
		return Summary{}, errors.New("run: no policy")
	case len(cfg.Tasks) == 0:
		return Summary{}, errors.New("run: no tasks")
	}
	samples := max(cfg.Samples, 1)
	workers := min(max(cfg.Concurrency, 1), len(cfg.Tasks)*samples)
	r := &run{cfg: cfg, start: time.Now(), budget: max(cfg.Requeue.Budget, 0)}
	r.progress.Total = len(cfg.Tasks)
	r.results = make([]TaskResult, len(cfg.Tasks))
	r.finals = make([][]EpisodeResult, len(cfg.Tasks))
	r.episodes = make([]int, len(cfg.Tasks))
	r.left = make([]int, len(cfg.Tasks))
	for i, t := range cfg.Tasks {
		r.results[i] = TaskResult{TaskID: t.ID, Outcome: OutcomeCanceled}
		r.finals[i] = make([]EpisodeResult, samples)
		r.left[i] = samples
	}
	results := r.results

	// A sample has at most one job queued or running, so the queue never
	// holds more than one job per sample and a re-queue never blocks.
	// Samples of one task are queued apart, so they run side by side.
	queue := make(chan job, len(cfg.Tasks)*samples)
	for s := range samples {
		for i := range cfg.Tasks {
			queue <- job{task: i, sample: s + 1, tries: 1}
		}
	}
	var (
		wg        sync.WaitGroup
		remaining = len(cfg.Tasks) * samples
		remMu     sync.Mutex // guards remaining
	)
	taskDone := func() {
		remMu.Lock()
		defer remMu.Unlock()
		if remaining--; remaining == 0 {
			close(queue)
		}
	}
	for range workers {
		wg.Go(func() {
			for j := range queue {
				if ctx.Err() != nil {
					taskDone()
					continue
				}
				res := r.episode(ctx, cfg.Tasks[j.task], r.nextEpisode(j.task))
				res.Sample = j.sample
				r.resMu.Lock()
				r.results[j.task].Episodes = append(r.results[j.task].Episodes, res)
				r.resMu.Unlock()
				if r.requeue(res, j.tries) {
					queue <- job{task: j.task, sample: j.sample, tries: j.tries + 1}
					continue
				}
				if !r.sampleDone(j.task, j.sample, res) {
					taskDone()
					continue
				}
				r.event(Event{Type: EventTaskDone, TaskID: res.TaskID, Attempt: res.Attempt}, func(p *Progress) {
					if res.Outcome != OutcomeCanceled {
						p.Done++
					}
					switch r.results[j.task].Outcome {
					case OutcomeSuccess:
						p.Success++
					case OutcomeFailure:
						p.Failure++
					case OutcomeEnvError:
						p.EnvError++
					case OutcomeError:
						p.Error++
					}
				})
				taskDone()
			}
		})
	}
	wg.Wait()
	s := Summarize(results, time.Since(r.start))
	s.ScorePassAtK(samples)
	if err := ctx.Err(); err != nil {
		return s, fmt.Errorf("run canceled after %d of %d tasks: %w", s.Total-s.Canceled, s.Total, context.Cause(ctx))
	}
	return s, nil
}

// nextEpisode numbers the next episode of task i, from 1.
func (r *run) nextEpisode(i int) int {
	r.resMu.Lock()
	defer r.resMu.Unlock()
	r.episodes[i]++
	return r.episodes[i]
}

// sampleDone keeps res as the final episode of sample of task i and
// reports whether it was the task's last sample; then the task's result
// is its best sample's (success, failure, error, env_error, canceled in
// that order; the first such sample), and with one sample simply its last
// episode's.
func (r *run) sampleDone(i, sample int, res EpisodeResult) bool {
	r.resMu.Lock()
	defer r.resMu.Unlock()
	r.finals[i][sample-1] = res
	if r.left[i]--; r.left[i] > 0 {
		return false
	}
	best := r.finals[i][0]
	for _, f := range r.finals[i][1:] {
		if outcomeRank(f.Outcome) < outcomeRank(best.Outcome) {
			best = f
		}
	}
	tr := &r.results[i]
	tr.Attempts = len(tr.Episodes)
	tr.Outcome, tr.Reward, tr.Steps, tr.Attribution, tr.RecordingID = best.Outcome, best.Reward, best.Steps, best.Attribution, best.RecordingID
	return true
}

func outcomeRank(o string) int {
	switch o {
	case OutcomeSuccess:
		return 0
	case OutcomeFailure:
		return 1
	case OutcomeError:
		return 2
	case OutcomeEnvError:
		return 3
	}
	return 4
}

// requeue reports whether the sample of an ended episode, its tries-th,
// runs again, and takes the re-queue from the budget. Only env_error
// episodes are re-queued, and not those of a task that cannot load (a
// task fault that no retry fixes).
func (r *run) requeue(res EpisodeResult, tries int) bool {
	if res.Outcome != OutcomeEnvError || tries >= r.cfg.Requeue.MaxAttempts {
		return false
	}
	if a := res.Attribution; a != nil && a.Source == faults.Task && !a.Retryable {
		return false
	}
	r.mu.Lock()
	ok := r.budget > 0
	if ok {
		r.budget--
	}
	r.mu.Unlock()
	if ok {
		r.event(Event{Type: EventRequeued, TaskID: res.TaskID, Attempt: res.Attempt + 1}, nil)
	}
	return ok
}

// update changes the progress without reporting an event.
func (r *run) update(fn func(*Progress)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(&r.progress)
}

// event updates the progress with update (when not nil) and reports ev.
func (r *run) event(ev Event, update func(*Progress)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if update != nil {
		update(&r.progress)
	}
	r.progress.Elapsed = time.Since(r.start)
	ev.Progress = r.progress
	if r.cfg.OnEvent != nil {
		r.cfg.OnEvent(ev)
	}
}

// maxSteps is the step budget of an episode of t.
func (r *run) maxSteps(t tasks.Task) int {
	switch {
	case r.cfg.MaxSteps > 0:
		return r.cfg.MaxSteps
	case t.MaxSteps > 0:
		return t.MaxSteps
	}
	return serverMaxSteps
}

// episode runs one episode of task to its end.
func (r *run) episode(ctx context.Context, task tasks.Task, attempt int) (res EpisodeResult) {
	start := time.Now()
	res = EpisodeResult{TaskID: task.ID, Attempt: attempt, StartedAt: start.UTC()}
	c := r.cfg.Client
	step := 0
	// end classifies the error that stopped the episode, aborts the
	// episode on the server when there is one, and reports the end.
	end := func(err error) EpisodeResult {
		switch {
		case err == nil:
		case ctx.Err() != nil:
			res.Outcome = OutcomeCanceled
		default:
			f := faults.Of(err)
			res.Outcome = OutcomeError
			if envError(f) {
				res.Outcome = OutcomeEnvError
			}
			res.Attribution = &Attribution{Info: f.Info(), Step: step}
		}
		if err != nil && res.EpisodeID != "" {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
			_ = c.DeleteEpisode(actx, res.EpisodeID)
			cancel()
		}
		res.DurationMS = float64(time.Since(start).Microseconds()) / 1000
		r.event(Event{Type: EventEnded, TaskID: task.ID, Attempt: attempt, EpisodeID: res.EpisodeID, Step: res.Steps, Result: &res},
			func(p *Progress) { p.Running--; p.Episodes++ })
		return res
	}
	r.update(func(p *Progress) { p.Running++ })

	pol, err := r.cfg.Policy(task, attempt)
	if err != nil {
		return end(policyError(err))
	}
	req := api.CreateEpisodeRequest{Sandbox: r.cfg.Sandbox, Observe: r.cfg.Observe, MaxSteps: r.cfg.MaxSteps,
		StepTimeoutMS: int(r.cfg.StepTimeout.Milliseconds()), Record: &r.cfg.Record}
	if task.Suite != "" {
		req.TaskID = task.Suite + "/" + task.ID
	} else {
		b, err := json.Marshal(task)
		if err != nil {
			return end(err)
		}
		req.Task = b
	}
	ep, err := c.CreateEpisode(ctx, req)
	if err != nil {
		return end(err)
	}
	res.EpisodeID = ep.EpisodeID
	r.event(Event{Type: EventStarted, TaskID: task.ID, Attempt: attempt, EpisodeID: ep.EpisodeID}, nil)

	obs, done := observationJSON(ep.Observation), ep.Done
	maxSteps := r.maxSteps(task)
	var history []Turn
	for !done && step < maxSteps {
		action, err := pol.Next(ctx, Input{Task: task, Observation: obs, Step: step + 1, MaxSteps: maxSteps, History: history})
		if errors.Is(err, ErrStop) {
			break
		}
		if err != nil {
			return end(policyError(err))
		}
		t0 := time.Now()
		sr, err := c.StepEpisode(ctx, ep.EpisodeID, action)
		res.StepMS = append(res.StepMS, float64(time.Since(t0).Microseconds())/1000)
		if err != nil {
			return end(err)
		}
		step = sr.Info.Step
		res.Steps = step
		history = append(history, Turn{Step: step, Action: action, Error: sr.Info.Error})
		obs, done = observationJSON(sr.Observation), sr.Done
		r.event(Event{Type: EventStep, TaskID: task.ID, Attempt: attempt, EpisodeID: ep.EpisodeID, Step: step}, nil)
	}
	fr, err := c.FinishEpisode(ctx, ep.EpisodeID, nil)
	if err != nil {
		return end(err)
	}
	res.Outcome, res.Reward, res.Steps, res.Answer, res.RecordingID = fr.Outcome, fr.Reward, fr.Steps, fr.Answer, fr.RecordingID
	res.Attribution = fr.Attribution
	return end(nil)
}

// policyError classifies a policy's error: its own class when it has one,
// else policy.failed.
func policyError(err error) error {
	var fe *faults.Error
	if errors.As(err, &fe) {
		return err
	}
	return faults.Wrap(err, faults.CodePolicyFailed, faults.Internal, faults.Policy, "policy: "+err.Error())
}

// envError reports whether a failure to run an episode is the
// environment's (env_error) rather than the policy's or the caller's
// (error); the registry decides for known codes.
func envError(f *faults.Error) bool {
	switch f.Source {
	case faults.Policy, faults.Client:
		return false
	}
	if info, ok := faults.Lookup(f.Code); ok {
		return info.EnvError
	}
	return f.Category != faults.ActionFailed && f.Category != faults.InvalidRequest
}

// observationJSON is o as a policy reads it: the observation's JSON, as the
// episode API returned it.
func observationJSON(o api.StepObservation) json.RawMessage {
	b, err := json.Marshal(o)
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}
