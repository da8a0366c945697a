package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/failpoint"
	"github.com/orchard/orchard/retry"
	"github.com/orchard/orchard/runtime"
	"github.com/orchard/orchard/store"
)

// waitSlack is how long past its timeout a waiting exec keeps waiting for
// the job (ORCHARD_COMPAT §3.9 step 5).
const waitSlack = 30 * time.Second

// outputFlushInterval bounds how stale a running job's stored output may
// be; it keeps store writes per job to a few per second on chatty commands.
const outputFlushInterval = 250 * time.Millisecond

// sandboxLock serialises the jobs of one sandbox in the order they were
// accepted. A job takes its place in line on the request's goroutine,
// before the job runs on a goroutine of its own, so a job accepted first
// runs first however the goroutines are scheduled (Orchard's asyncio lock
// is FIFO, and clients rely on it).
type sandboxLock struct {
	mu   sync.Mutex
	held bool
	line []chan struct{} // waiting turns, in arrival order
}

// enqueue takes a place in line; the turn's channel is closed when it is
// this caller's turn (at once when the lock is free).
func (l *sandboxLock) enqueue() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	turn := make(chan struct{})
	if !l.held {
		l.held = true
		close(turn)
		return turn
	}
	l.line = append(l.line, turn)
	return turn
}

// release hands the lock to the next in line, or frees it.
func (l *sandboxLock) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.line) == 0 {
		l.held = false
		return
	}
	next := l.line[0]
	l.line = l.line[1:]
	close(next)
}

// leave gives up a place in line; a turn that came meanwhile is passed on.
func (l *sandboxLock) leave(turn chan struct{}) {
	l.mu.Lock()
	if i := slices.Index(l.line, turn); i >= 0 {
		l.line = slices.Delete(l.line, i, i+1)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.release()
}

// execLockTTL bounds how long a replica that died holding a sandbox's exec
// lock blocks the sandbox's next job; holders refresh it every third.
const execLockTTL = 10 * time.Second

// held is the exec lock of one sandbox: the replica-local FIFO (first come,
// first served within a replica) and, when the store coordinates replicas,
// the store's lease, which serialises jobs across replicas and fences
// their writes.
type held struct {
	unlock func()
	lease  store.Lease // nil when the store has no Locker
}

// lock takes the sandbox's exec lock. When the lease is lost while held
// (expired during a stall, then taken by another replica), lost is called
// with the cause.
func (m *Manager) lock(ctx context.Context, id string, lost func(error)) (held, error) {
	l, turn := m.queue(id)
	return m.lockTurn(ctx, id, l, turn, lost)
}

// queue takes a place in the sandbox's line (see sandboxLock).
func (m *Manager) queue(id string) (*sandboxLock, chan struct{}) {
	m.mu.Lock()
	l, ok := m.locks[id]
	if !ok {
		l = &sandboxLock{}
		m.locks[id] = l
	}
	m.mu.Unlock()
	return l, l.enqueue()
}

// lockTurn waits for a turn taken with queue, then takes the store's lease.
func (m *Manager) lockTurn(ctx context.Context, id string, l *sandboxLock, turn chan struct{}, lost func(error)) (held, error) {
	select {
	case <-turn:
	case <-ctx.Done():
		l.leave(turn)
		return held{}, context.Cause(ctx)
	}
	local := l.release
	locker, ok := m.st.(store.Locker)
	if !ok {
		return held{unlock: local}, nil
	}
	lease, release, err := store.Hold(ctx, locker, "sandbox:"+id, execLockTTL, lost)
	if err != nil {
		local()
		return held{}, err
	}
	unlock := func() {
		release()
		local()
	}
	return held{unlock: unlock, lease: lease}, nil
}

// updateJob writes a job, fenced by the exec lease when there is one, so a
// replica that lost the sandbox's lock cannot overwrite its successor's job.
func (m *Manager) updateJob(ctx context.Context, h held, id string, fn func(*api.Job) error) (api.Job, error) {
	if f, ok := m.st.(store.Fenced); ok && h.lease != nil {
		return f.UpdateJobFenced(ctx, h.lease, id, fn)
	}
	return m.st.UpdateJob(ctx, id, fn)
}

// ExecParams is a validated exec request.
type ExecParams struct {
	Command        string
	TimeoutSeconds int
	Cwd            string
	Env            map[string]string
	LoginShell     bool
	Wait           bool
}

// Exec creates a job and starts it. With Wait it returns once the job is
// terminal or its timeout plus slack passes (then with a non-terminal status).
func (m *Manager) Exec(ctx context.Context, id string, p ExecParams) (api.Job, error) {
	rec, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return api.Job{}, err
	}
	if rec, err = m.awaitAgent(ctx, rec); err != nil {
		return api.Job{}, err
	}
	if p.TimeoutSeconds <= 0 {
		p.TimeoutSeconds = m.cfg.DefaultTimeoutSeconds
	}
	job := api.Job{JobID: uuid.NewString(), SandboxID: id, Command: p.Command, Status: api.JobQueued, CreatedAt: m.unix(),
		TimeoutSeconds: p.TimeoutSeconds, Runner: m.cfg.ReplicaID}
	// The job runs in this process, so a waiting exec learns its end from
	// the runner directly rather than through the store's events.
	done := make(chan api.Job, 1)
	jctx, cancel := context.WithCancelCause(context.Background())
	m.mu.Lock()
	if m.jobs[id] == nil {
		m.jobs[id] = map[string]context.CancelCauseFunc{}
	}
	m.jobs[id][job.JobID] = cancel
	m.mu.Unlock()
	// The runner takes the sandbox's lock while the job is being stored:
	// with a network store that saves a round trip on every exec. It
	// starts the command only once the job is stored.
	created := make(chan error, 1)
	l, turn := m.queue(id)
	m.bg.Add(1)
	go m.runJob(jctx, cancel, rec, job, p, l, turn, created, done)
	if err := m.st.CreateJob(ctx, job); err != nil {
		created <- err
		return api.Job{}, err
	}
	created <- nil
	if !p.Wait {
		return job, nil
	}
	t := time.NewTimer(api.Seconds(p.TimeoutSeconds) + waitSlack)
	defer t.Stop()
	select {
	case j := <-done:
		return j, nil
	case <-t.C:
		return m.st.GetJob(ctx, job.JobID)
	case <-ctx.Done():
		return api.Job{}, context.Cause(ctx)
	}
}

// awaitAgent is the live readiness gate of exec: wait up to
// AgentReadyWait for a pending sandbox; "agent not ready" otherwise (which
// the server answers 404, as Orchard Env).
func (m *Manager) awaitAgent(ctx context.Context, rec store.Sandbox) (store.Sandbox, error) {
	if rec.Ready && rec.Status == api.StatusReady && rec.AgentAddr != "" {
		return rec, nil
	}
	if err := pausedFault(rec); err != nil {
		return rec, err
	}
	notReady := faults.Newf(faults.CodeAgentNotReady, faults.Unavailable, faults.Sandbox, "Sandbox %s agent not ready", rec.ID)
	if rec.Status != api.StatusPending {
		notReady.Retryable = false
		return rec, notReady
	}
	wctx, cancel := context.WithTimeout(ctx, m.cfg.AgentReadyWait)
	defer cancel()
	got, err := m.Wait(wctx, rec.ID, int(m.cfg.AgentReadyWait/time.Second)+1)
	if err != nil || got.Status != api.StatusReady {
		return rec, notReady
	}
	return got, nil
}

// WaitJob blocks until the job is terminal or timeout passes and returns
// its state either way (a timeout is not an error: ORCHARD_COMPAT §3.12).
func (m *Manager) WaitJob(ctx context.Context, jobID string, timeout time.Duration) (api.Job, error) {
	if _, err := m.st.GetJob(ctx, jobID); err != nil {
		return api.Job{}, err
	}
	ev, cancel, err := m.st.Subscribe(ctx, store.JobTopic(jobID))
	if err != nil {
		return api.Job{}, err
	}
	defer cancel()
	return m.awaitJob(ctx, jobID, ev, timeout)
}

func (m *Manager) awaitJob(ctx context.Context, jobID string, events <-chan struct{}, timeout time.Duration) (api.Job, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		j, err := m.st.GetJob(ctx, jobID)
		if err != nil || j.Terminal() {
			return j, err
		}
		select {
		case <-events:
		case <-t.C:
			return m.st.GetJob(ctx, jobID)
		case <-ctx.Done():
			return api.Job{}, context.Cause(ctx)
		}
	}
}

// cancelWait bounds how long CancelJob waits for the runner to end the
// job: killing a command takes the agent milliseconds, so a job still
// running after this has a runner that is not answering.
const cancelWait = 10 * time.Second

var errCanceled = faults.New(faults.CodeJobCanceled, faults.Canceled, faults.Client, "Command was canceled by request")

// CancelJob ends a job that has not finished: a queued one never starts, a
// running one has its process group killed by the agent, and the job fails
// with code job.canceled and the output it had so far. It returns the job
// once ended, or as it stands after cancelWait if its runner has not ended
// it by then. A finished job is returned unchanged.
//
// The job may run on another replica: the request is recorded on the job
// and that replica is told to look (ReplicaTopic), so any replica can
// cancel any job.
func (m *Manager) CancelJob(ctx context.Context, jobID string) (api.Job, error) {
	// Subscribed before the request is recorded, so that the job's end
	// cannot come between the two unseen.
	ev, unsubscribe, err := m.st.Subscribe(ctx, store.JobTopic(jobID))
	if err != nil {
		return api.Job{}, err
	}
	defer unsubscribe()
	j, err := m.st.UpdateJob(ctx, jobID, func(j *api.Job) error {
		if !j.Terminal() {
			j.CancelRequested = true
		}
		return nil
	})
	if err != nil || j.Terminal() {
		return j, err
	}
	if !m.cancelLocal(j.SandboxID, j.JobID) && j.Runner != "" && j.Runner != m.cfg.ReplicaID {
		if err := m.st.Publish(ctx, store.ReplicaTopic(j.Runner)); err != nil {
			return api.Job{}, err
		}
	}
	return m.awaitJob(ctx, jobID, ev, cancelWait)
}

// cancelLocal cancels a job this replica runs and reports whether it does.
func (m *Manager) cancelLocal(sandboxID, jobID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	cancel, ok := m.jobs[sandboxID][jobID]
	if ok {
		cancel(errCanceled)
	}
	return ok
}

// serveCancels ends the local jobs whose cancel was requested through
// another replica, each time one is (ReplicaTopic), until ctx ends.
func (m *Manager) serveCancels(ctx context.Context) {
	ev, unsubscribe, err := m.st.Subscribe(ctx, store.ReplicaTopic(m.cfg.ReplicaID))
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("job cancels from other replicas will not be seen", "err", err)
		}
		return
	}
	defer unsubscribe()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ev:
		}
		type ref struct{ sandbox, job string }
		var local []ref
		m.mu.Lock()
		for sb, js := range m.jobs {
			for id := range js {
				local = append(local, ref{sb, id})
			}
		}
		m.mu.Unlock()
		for _, r := range local {
			if j, err := m.st.GetJob(ctx, r.job); err == nil && j.CancelRequested && !j.Terminal() {
				m.cancelLocal(r.sandbox, r.job)
			}
		}
	}
}

// GetJob returns a job.
func (m *Manager) GetJob(ctx context.Context, jobID string) (api.Job, error) {
	return m.st.GetJob(ctx, jobID)
}

// output accumulates a job's streams and flushes them to the store at a
// bounded rate. The flush timer is armed by output, not by the job: most
// commands finish within the first interval, and a job that has written
// nothing by then has nothing to flush, so it never starts a timer.
type output struct {
	flush func() // stores a snapshot; called on the timer's goroutine

	mu      sync.Mutex // guards the fields below
	stdout  []byte
	stderr  []byte
	dirty   bool
	timer   *time.Timer // pending flush; nil when none is armed
	stopped bool        // the job is over: no more flushes
	// flushing counts flushes in progress, which stop waits for so that
	// none lands after the job's final write.
	flushing sync.WaitGroup
}

func (o *output) add(ev api.ExecEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch ev.Stream {
	case "stdout":
		o.stdout = append(o.stdout, ev.Data...)
	case "stderr":
		o.stderr = append(o.stderr, ev.Data...)
	}
	o.dirty = true
	if o.timer == nil && !o.stopped && o.flush != nil {
		o.flushing.Add(1)
		o.timer = time.AfterFunc(outputFlushInterval, o.fire)
	}
}

// fire runs a flush. The timer stays set while it runs, so flushes never
// overlap (an older snapshot cannot land after a newer one); output that
// arrived meanwhile arms it again.
func (o *output) fire() {
	defer o.flushing.Done()
	o.mu.Lock()
	stopped := o.stopped
	o.mu.Unlock()
	if !stopped {
		o.flush()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.timer = nil
	if o.dirty && !o.stopped {
		o.flushing.Add(1)
		o.timer = time.AfterFunc(outputFlushInterval, o.fire)
	}
}

// stop ends flushing and waits for a flush in progress.
func (o *output) stop() {
	o.mu.Lock()
	o.stopped = true
	if o.timer != nil && o.timer.Stop() {
		o.flushing.Done() // never fired
	}
	o.timer = nil
	o.mu.Unlock()
	o.flushing.Wait()
}

func (o *output) snapshot() (stdout, stderr string, dirty bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := o.dirty
	o.dirty = false
	return DecodeUTF8(o.stdout), DecodeUTF8(o.stderr), d
}

// runningMarkDelay is how long a job runs before its "running" state is
// stored: most commands finish sooner and go from queued to their end in
// one write, which saves the store round trips of a second write and event
// on every short exec (it matters with Redis). started_at is exact either way.
const runningMarkDelay = 50 * time.Millisecond

// runJob runs job once created says it is stored (nil); an error on
// created means it was not, and the runner leaves without a trace.
func (m *Manager) runJob(ctx context.Context, cancel context.CancelCauseFunc, rec store.Sandbox, job api.Job, p ExecParams,
	l *sandboxLock, turn chan struct{}, created <-chan error, done chan<- api.Job) {
	defer m.bg.Done()
	defer cancel(nil)
	defer func() {
		m.mu.Lock()
		delete(m.jobs[rec.ID], job.JobID)
		if len(m.jobs[rec.ID]) == 0 {
			delete(m.jobs, rec.ID)
		}
		m.mu.Unlock()
	}()
	bg := context.Background()
	publish := func() { _ = m.st.Publish(bg, store.JobTopic(job.JobID)) }

	h, err := m.lockTurn(ctx, rec.ID, l, turn, func(err error) { cancel(err) })
	if cerr := <-created; cerr != nil {
		if err == nil {
			h.unlock()
		}
		return
	}
	if err != nil {
		done <- m.finishJob(held{}, job.JobID, m.unix(), nil, "", "", err, p.TimeoutSeconds)
		publish()
		return
	}
	defer h.unlock()
	started := m.unix()
	var marking sync.WaitGroup
	marking.Add(1)
	markRunning := time.AfterFunc(runningMarkDelay, func() {
		defer marking.Done()
		_, _ = m.updateJob(bg, h, job.JobID, func(j *api.Job) error {
			if !j.Terminal() {
				j.Status, j.StartedAt = api.JobRunning, &started
			}
			return nil
		})
		publish()
	})

	out := &output{}
	out.flush = func() {
		if so, se, dirty := out.snapshot(); dirty {
			_, _ = m.updateJob(bg, h, job.JobID, func(j *api.Job) error {
				j.Stdout, j.Stderr = so, se
				return nil
			})
		}
	}

	oomBefore, oomCounted := m.oomKills(rec.RuntimeName())
	req := api.AgentExecRequest{
		Command: p.Command, TimeoutSeconds: p.TimeoutSeconds, Cwd: p.Cwd, Env: p.Env,
		LoginShell: p.LoginShell, MaxOutputBytes: m.cfg.MaxOutputBytes,
	}
	exit, err := m.execWithRetry(ctx, rec, req, out.add)
	if markRunning.Stop() {
		marking.Done() // never ran
	}
	marking.Wait()
	out.stop()
	stdout, stderr, _ := out.snapshot()
	var ex *api.ExecExit
	if err == nil {
		ex = &exit
		if oomCounted && (exit.ExitCode == -9 || exit.ExitCode == 137) {
			if after, ok := m.oomKills(rec.RuntimeName()); ok && after > oomBefore {
				err = faults.New(faults.CodeOOM, faults.ActionFailed, faults.Sandbox,
					fmt.Sprintf("Command was killed: out of memory (sandbox memory limit %s)", rec.Memory))
			}
		}
	}
	if p.LoginShell {
		stderr = JoinLines(stderr)
	}
	done <- m.finishJob(h, job.JobID, started, ex, stdout, stderr, err, p.TimeoutSeconds)
	publish()
}

// JoinLines is Python's "\n".join(s.splitlines()): Orchard Env re-joins a
// login shell's filtered stderr so, and its clients see the result (no
// trailing newline; other line breaks become "\n").
func JoinLines(s string) string {
	var lines []string
	start := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		brk := 0
		switch r {
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			brk = size
		case '\r':
			brk = size
			if i+1 < len(s) && s[i+1] == '\n' {
				brk = 2
			}
		}
		if brk > 0 {
			lines = append(lines, s[start:i])
			i += brk
			start = i
			continue
		}
		i += size
	}
	if start < len(s) {
		lines = append(lines, s[start:])
	}
	return strings.Join(lines, "\n")
}

func (m *Manager) oomKills(id string) (uint64, bool) {
	c, ok := m.rt.(runtime.OOMCounter)
	if !ok {
		return 0, false
	}
	n, err := c.OOMKills(id)
	return n, err == nil
}

// execWithRetry runs the command on the agent. Only failures to reach the
// agent before it had the request are retried (the command never started),
// with backoff, inside the connect-retry window; a sandbox the runtime
// reports dead is not retried.
func (m *Manager) execWithRetry(ctx context.Context, rec store.Sandbox, req api.AgentExecRequest, onEvent func(api.ExecEvent)) (api.ExecExit, error) {
	// The agent enforces the command timeout; this bound only catches an
	// agent that stops answering.
	ctx, cancel := context.WithTimeoutCause(ctx, api.Seconds(req.TimeoutSeconds)+waitSlack,
		faults.New(faults.CodeExecTimeout, faults.Timeout, faults.Sandbox, "Execution timed out after "+strconv.Itoa(req.TimeoutSeconds)+"s"))
	defer cancel()
	a := m.agent(rec.AgentAddr)
	b := retry.NewBackoff(retry.Policy{Budget: m.cfg.ExecConnectRetryWindow, Initial: execRetryInitial, Max: execRetryMax})
	for {
		exit, err := a.Exec(ctx, req, onEvent)
		if err == nil {
			return exit, nil
		}
		if c := context.Cause(ctx); c != nil {
			return exit, c
		}
		if !faults.Is(err, faults.CodeAgentUnreachable) {
			return exit, err
		}
		// A request the agent already had may have started the command:
		// running it again could run it twice. Its failure is the
		// sandbox's death when the runtime sees one (the agent is killed
		// with its sandbox, and noticed within deathSettle).
		if delivered(err) {
			if f := m.DeathFault(ctx, rec.ID); f != nil {
				return exit, f
			}
			return exit, err
		}
		wait, ok := b.Next(err)
		if !ok { // the connect-retry window is spent
			return exit, err
		}
		if inst, ierr := m.rt.Inspect(ctx, rec.RuntimeName()); ierr != nil || !inst.Alive {
			if ierr == nil {
				f := deathFault(inst.Reason)
				return exit, faults.FromInfo(faults.Info{Category: faults.Category(f.Category), Source: faults.Source(f.Source),
					Code: f.Code, Message: f.Message, Retryable: f.Retryable}, 0)
			}
			return exit, err
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return exit, err
		}
	}
}

// Backoff of execWithRetry: an agent that is restarting answers again
// within a second; one that stays away is waited for more rarely. A
// Backoff within the connect-retry window rather than retry.Do, whose
// Budget would cancel a command that runs longer than the window.
const (
	execRetryInitial = 500 * time.Millisecond
	execRetryMax     = 8 * time.Second
)

// delivered reports whether a failed exec had reached the agent (the
// agent client marks such errors), so that its command may have run.
func delivered(err error) bool {
	var d interface{ Delivered() bool }
	return errors.As(err, &d) && d.Delivered()
}

// finishJob records the terminal state per ORCHARD_COMPAT §3.11 and §4.
// It returns the final job (as stored, or as meant to be when the store
// refused the write).
func (m *Manager) finishJob(h held, jobID string, started float64, exit *api.ExecExit, stdout, stderr string, err error, timeout int) api.Job {
	now := m.unix()
	var final api.Job
	stored, uerr := m.writeFinal(h, jobID, func(j *api.Job) error {
		defer func() { final = store.CloneJob(*j) }()
		j.Stdout, j.Stderr, j.CompletedAt = stdout, stderr, &now
		if j.StartedAt == nil {
			j.StartedAt = &started
		}
		j.Status = api.JobFailed
		if exit != nil {
			code := exit.ExitCode
			j.ExitCode = &code
			j.Truncated = exit.Truncated
			switch {
			case exit.SpawnError != "" && err == nil:
				f := faults.New(faults.CodeSpawnFailed, faults.ActionFailed, faults.Sandbox, exit.SpawnError)
				if strings.Contains(exit.SpawnError, "resource temporarily unavailable") {
					f = faults.New(faults.CodePidsLimit, faults.ActionFailed, faults.Sandbox,
						"cannot start the command: the sandbox's process limit is reached ("+exit.SpawnError+")")
				}
				fi := toFaultInfo(f)
				j.Fault, j.Error = &fi, &f.Message
			case code == 0 && err == nil:
				j.Status = api.JobSucceeded
			case code == 124:
				msg := fmt.Sprintf("Command timed out after %ds", timeout)
				j.Error = &msg
				if exit.TimedOut {
					fi := toFaultInfo(faults.New(faults.CodeExecTimeout, faults.Timeout, faults.Policy, msg).WithRetryable(false))
					j.Fault = &fi
				}
			}
		}
		if err != nil {
			f := faults.Of(err)
			msg := f.Message
			switch {
			case f.Code == faults.CodeExecTimeout:
				j.Stderr += fmt.Sprintf("Command exceeded timeout of %ds and was forcibly terminated", timeout)
			case f.Code == faults.CodeAgentUnreachable:
				msg = "Agent connection error: " + f.Message
			}
			j.Error = &msg
			fi := toFaultInfo(f)
			j.Fault = &fi
		}
		return nil
	})
	if uerr == nil {
		return stored
	}
	if final.JobID == "" { // the store failed before applying the update
		final = api.Job{JobID: jobID, Status: api.JobFailed, Stdout: stdout, Stderr: stderr, CompletedAt: &now, StartedAt: &started}
	}
	return final
}

var errEndedElsewhere = errors.New("job already ended")

// writeFinal stores a job's final state, through a store outage
// (throughOutage). A lost exec lease only fences the sandbox's other
// writes: the job is still this runner's to end, so its final state is
// written unfenced unless something else (a sweep) ended it meanwhile.
func (m *Manager) writeFinal(h held, jobID string, fn func(*api.Job) error) (j api.Job, err error) {
	ctx := context.Background()
	err = m.throughOutage(func() error {
		if err := failpoint.Eval("manager.job.final"); err != nil {
			if !faults.Is(err, faults.CodeLockLost) {
				return err
			}
		} else if j, err = m.updateJob(ctx, h, jobID, fn); !faults.Is(err, faults.CodeLockLost) {
			return err
		}
		h = held{}
		j, err = m.st.UpdateJob(ctx, jobID, func(j *api.Job) error {
			if j.Terminal() {
				return errEndedElsewhere
			}
			return fn(j)
		})
		if errors.Is(err, errEndedElsewhere) {
			j, err = m.st.GetJob(ctx, jobID)
		}
		return err
	})
	return j, err
}

// DecodeUTF8 decodes b as UTF-8 the way Python's errors="replace" does:
// each maximal invalid subpart (a lone bad byte, or the valid start of a
// truncated sequence) becomes one U+FFFD. strings.ToValidUTF8 would
// collapse whole runs instead.
func DecodeUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 8)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			sb.WriteRune(utf8.RuneError)
			b = b[maximalSubpart(b):]
			continue
		}
		sb.Write(b[:size])
		b = b[size:]
	}
	return sb.String()
}

// maximalSubpart is the length of the invalid sequence at the start of b
// (Unicode's "maximal subpart": a lead byte and the continuation bytes that
// could still have completed it).
func maximalSubpart(b []byte) int {
	lo, hi := byte(0x80), byte(0xBF)
	var need int
	switch lead := b[0]; {
	case lead >= 0xC2 && lead <= 0xDF:
		need = 1
	case lead == 0xE0:
		need, lo = 2, 0xA0
	case lead == 0xED:
		need, hi = 2, 0x9F
	case lead >= 0xE1 && lead <= 0xEF:
		need = 2
	case lead == 0xF0:
		need, lo = 3, 0x90
	case lead == 0xF4:
		need, hi = 3, 0x8F
	case lead >= 0xF1 && lead <= 0xF3:
		need = 3
	default:
		return 1
	}
	n := 1
	for i := 1; i <= need && i < len(b); i++ {
		c := b[i]
		if i == 1 && (c < lo || c > hi) || i > 1 && (c < 0x80 || c > 0xBF) {
			break
		}
		n++
	}
	return n
}
