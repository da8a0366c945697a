package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/orchard/orchard/agentbin"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/runner"
	"github.com/orchard/orchard/runtime/local"
	"github.com/orchard/orchard/sites"
	"github.com/orchard/orchard/swe"
	"github.com/orchard/orchard/tasks"
)

// runOptions are the flags of `orchard run`.
type runOptions struct {
	policy      string
	concurrency int
	limit       int
	taskIDs     []string
	requeue     int
	attempts    int
	requeueTask int
	maxSteps    int
	faultsFile  string
	scriptsFile string
	jsonOut     string
	seed        int64
	record      bool
	inProcess   bool
}

func runCmd(conn *connection) *cobra.Command {
	var (
		o     runOptions
		suite string
	)
	cmd := &cobra.Command{
		Use:   "run SUITE | --suite SUITE",
		Short: "Run a task suite's episodes with a policy and summarize the outcomes",
		Long: `Run every task of SUITE as an episode, several at a time, and print a summary:
outcome, reward, steps and attribution per task; success rate; env_errors
by source and code; step latency percentiles; episodes per minute.

SUITE is a suite already loaded on the server, a task file (JSONL, JSON or
YAML, uploaded to the server as the suite named after the file),
"bundled", the browser suite built into Orchard, or "swe", the built-in
software-engineering suite (shell episodes over small repositories); it is
given as the argument or as --suite, as orchard demo takes it.

--policy is "scripted" (replays the bundled suites' scripts, or those of
--scripts FILE: {"task_id": [action, ...]}), "random" (a seeded random
baseline) or the URL of a policy server, which is POSTed {task,
observation, step, max_steps, history} before each step and answers
{"action": {...}}.

--attempts K runs every task K times and scores pass@1 and pass@K with the
unbiased estimator 1 - C(n-c,k)/C(n,k) (n the task's scored episodes, c
those that succeeded), per task and over the tasks, in the table and in
--json ("attempts", "pass_at_k").

Episodes that end env_error (the environment's fault) are not scored: they
are run again as new episodes, up to --requeue-attempts per attempt and
--requeue in all. The command exits 0 when the run completed, whatever the
outcomes; non-zero when something stopped it.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 1 && suite != "" && args[0] != suite:
				return fmt.Errorf("two suites: %q and --suite %q", args[0], suite)
			case len(args) == 1:
				suite = args[0]
			case suite == "":
				return fmt.Errorf("no suite: give it as the argument or as --suite")
			}
			ctx := cmd.Context()
			c := conn.client()
			if o.inProcess {
				emb, err := startEmbedded(ctx, conn.getenv, cmd.ErrOrStderr())
				if err != nil {
					return err
				}
				defer emb.stop(cmd.ErrOrStderr())
				c = emb.client
			}
			return runSuite(ctx, c, suite, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&suite, "suite", "", "the suite, instead of the argument")
	f.StringVar(&o.policy, "policy", "scripted", "scripted, random, or the URL of a policy server")
	f.IntVar(&o.concurrency, "concurrency", 2, "episodes at once")
	f.IntVar(&o.limit, "limit", 0, "run only the first N tasks (0: all)")
	f.StringSliceVar(&o.taskIDs, "tasks", nil, "run only these task ids (comma separated)")
	f.IntVar(&o.requeue, "requeue", 10, "re-queues of env_error episodes allowed in the whole run")
	f.IntVar(&o.attempts, "attempts", 1, "scored episodes per task (K of pass@K)")
	f.IntVar(&o.requeueTask, "requeue-attempts", 3, "episodes per attempt at most, env_error re-queues included")
	f.IntVar(&o.maxSteps, "max-steps", 0, "steps per episode at most (0: the task's, or 30)")
	f.StringVar(&o.faultsFile, "faults", "", "a fault plan (JSON) injected into every episode's sandbox")
	f.StringVar(&o.scriptsFile, "scripts", "", "scripts of the scripted policy: a JSON object of task id to actions")
	f.StringVar(&o.jsonOut, "json", "", "also write the summary as JSON to this file, and as an HTML report beside it (FILE.html)")
	f.Int64Var(&o.seed, "seed", 1, "seed of the random policy")
	f.BoolVar(&o.record, "record", false, "record every episode on the server")
	f.BoolVar(&o.inProcess, "in-process", false, "start an embedded server for the run (local runtime, memory store, temporary state; needs root)")
	return cmd
}

// runSuite runs suite against c and prints the summary to out, progress
// to errOut.
func runSuite(ctx context.Context, c *client.Client, suite string, o runOptions, out, errOut io.Writer) error {
	s, err := runSummary(ctx, c, suite, o, errOut)
	if s == nil {
		return err
	}
	if werr := s.WriteTable(out); werr != nil && err == nil {
		err = werr
	}
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(s, "", "  ")
		if werr := os.WriteFile(o.jsonOut, append(b, '\n'), 0o644); werr != nil && err == nil {
			err = fmt.Errorf("write summary: %w", werr)
		}
		if werr := writeReport(reportPath(o.jsonOut), "orchard run "+suite, s); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

// reportPath is the HTML report's file beside the JSON summary:
// run.json → run.html.
func reportPath(jsonPath string) string {
	return strings.TrimSuffix(jsonPath, filepath.Ext(jsonPath)) + ".html"
}

// writeReport writes the summary as a self-contained HTML page, so a run
// can be shared as one file.
func writeReport(path, title string, s *runner.Summary) error {
	var b bytes.Buffer
	if err := s.WriteReport(&b, title); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// runSummary loads the suite, runs it and returns the summary: nil when
// nothing ran.
func runSummary(ctx context.Context, c *client.Client, suite string, o runOptions, errOut io.Writer) (*runner.Summary, error) {
	if o.attempts < 1 {
		return nil, fmt.Errorf("--attempts must be at least 1")
	}
	ts, err := loadSuite(ctx, c, suite)
	if err != nil {
		return nil, err
	}
	if ts, err = selectTasks(ts, o.taskIDs, o.limit); err != nil {
		return nil, err
	}
	policy, err := policyFactory(o)
	if err != nil {
		return nil, err
	}
	cfg := runner.Config{
		Client: c, Tasks: ts, Policy: policy, Concurrency: o.concurrency, MaxSteps: o.maxSteps, Record: o.record,
		Requeue: runner.Requeue{MaxAttempts: o.requeueTask, Budget: o.requeue}, Samples: o.attempts,
	}
	if o.faultsFile != "" {
		plan, err := os.ReadFile(o.faultsFile)
		if err != nil {
			return nil, fmt.Errorf("--faults: %w", err)
		}
		if !json.Valid(plan) {
			return nil, fmt.Errorf("--faults %s: not JSON", o.faultsFile)
		}
		cfg.Sandbox, _ = json.Marshal(map[string]json.RawMessage{"faults": plan})
	}
	p := newProgressPrinter(errOut)
	cfg.OnEvent = p.event
	fmt.Fprintf(errOut, "running %d %s of %s with policy %s, %d at a time\n", len(ts), plural(len(ts), "task"), suite, o.policy, min(max(o.concurrency, 1), len(ts)))
	s, err := runner.Run(ctx, cfg)
	p.done()
	if len(s.Tasks) == 0 {
		return nil, err
	}
	return &s, err
}

// loadSuite returns the tasks of suite, loading it into the server first
// when it is the bundled suite or a file.
func loadSuite(ctx context.Context, c *client.Client, suite string) ([]tasks.Task, error) {
	name, data := "", []byte(nil)
	switch st, err := os.Stat(suite); {
	case suite == sites.SuiteName:
		list, err := sites.Suite()
		if err != nil {
			return nil, fmt.Errorf("bundled suite: %w", err)
		}
		var b bytes.Buffer
		for _, t := range list {
			line, _ := json.Marshal(t)
			b.Write(append(line, '\n'))
		}
		name, data = sites.SuiteName+".jsonl", b.Bytes()
	case suite == swe.SuiteName:
		b, err := swe.SuiteJSONL()
		if err != nil {
			return nil, fmt.Errorf("swe suite: %w", err)
		}
		name, data = swe.SuiteName+".jsonl", b
	case err == nil && st.Mode().IsRegular():
		if data, err = os.ReadFile(suite); err != nil {
			return nil, err
		}
		base := filepath.Base(suite)
		name, suite = base, strings.TrimSuffix(base, filepath.Ext(base))
	}
	if data != nil {
		if _, err := c.LoadTasks(ctx, suite, name, data); err != nil {
			return nil, fmt.Errorf("load %s: %w", name, err)
		}
	}
	ts, err := c.SuiteTasks(ctx, suite)
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("suite %q is not loaded on the server and is not a task file", suite)
	}
	return ts, nil
}

// selectTasks keeps the tasks named by ids (all when empty), then the
// first limit (all when 0).
func selectTasks(ts []tasks.Task, ids []string, limit int) ([]tasks.Task, error) {
	if len(ids) > 0 {
		var keep []tasks.Task
		for _, id := range ids {
			i := slices.IndexFunc(ts, func(t tasks.Task) bool { return t.ID == id })
			if i < 0 {
				return nil, fmt.Errorf("--tasks: no task %q in the suite", id)
			}
			keep = append(keep, ts[i])
		}
		ts = keep
	}
	if limit > 0 && limit < len(ts) {
		ts = ts[:limit]
	}
	return ts, nil
}

// bundledScript is the reference script of a task of a bundled suite:
// the sites' or the SWE suite's.
func bundledScript(id string) ([]json.RawMessage, bool) {
	if s, ok := sites.Script(id); ok {
		return s, true
	}
	return swe.Script(id)
}

// policyFactory is the policy --policy names.
func policyFactory(o runOptions) (runner.Factory, error) {
	switch p := o.policy; {
	case p == "scripted":
		lookup := bundledScript
		if o.scriptsFile != "" {
			raw, err := os.ReadFile(o.scriptsFile)
			if err != nil {
				return nil, fmt.Errorf("--scripts: %w", err)
			}
			var scripts map[string][]json.RawMessage
			if err := json.Unmarshal(raw, &scripts); err != nil {
				return nil, fmt.Errorf("--scripts %s: want a JSON object of task id to a list of actions: %w", o.scriptsFile, err)
			}
			lookup = func(id string) ([]json.RawMessage, bool) {
				if s, ok := scripts[id]; ok {
					return s, true
				}
				return bundledScript(id)
			}
		}
		return runner.Scripted(lookup), nil
	case p == "random":
		return runner.Random(o.seed), nil
	case strings.HasPrefix(p, "http://") || strings.HasPrefix(p, "https://"):
		return runner.HTTP(p, runner.HTTPOptions{}), nil
	}
	return nil, fmt.Errorf("--policy %q: want scripted, random, or an http(s) URL", o.policy)
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// Progress output intervals: a terminal's line is redrawn often; a log
// (CI, a file) gets a line now and then, so it stays readable.
const (
	progressRedraw = 200 * time.Millisecond
	progressLog    = 10 * time.Second
)

// progressPrinter reports a run's progress on w: one redrawn line on a
// terminal, periodic plain lines otherwise. The runner serializes events,
// so it needs no lock.
type progressPrinter struct {
	w        io.Writer
	terminal bool
	last     time.Time
	p        runner.Progress
	drawn    bool
}

func newProgressPrinter(w io.Writer) *progressPrinter {
	pp := &progressPrinter{w: w}
	if f, ok := w.(*os.File); ok {
		pp.terminal = term.IsTerminal(int(f.Fd()))
	}
	return pp
}

func (pp *progressPrinter) line() string {
	p := pp.p
	s := fmt.Sprintf("%d/%d done: %d success, %d failure, %d env_error, %d error; %d running; %.1f episodes/min",
		p.Done, p.Total, p.Success, p.Failure, p.EnvError, p.Error, p.Running, p.EpisodesPerMinute())
	if eta := p.ETA(); eta > 0 {
		s += fmt.Sprintf("; ETA %s", eta.Round(time.Second))
	}
	return s
}

func (pp *progressPrinter) event(e runner.Event) {
	pp.p = e.Progress
	ended := e.Type == runner.EventEnded && e.Result != nil
	if pp.terminal {
		if ended && e.Result.Outcome != runner.OutcomeSuccess {
			// Keep what went wrong on screen above the progress line.
			fmt.Fprintf(pp.w, "\r\033[K%s\n", episodeLine(e))
			pp.drawn = false
		}
		if time.Since(pp.last) >= progressRedraw || e.Type == runner.EventTaskDone {
			pp.last = time.Now()
			fmt.Fprintf(pp.w, "\r\033[K%s", pp.line())
			pp.drawn = true
		}
		return
	}
	if ended {
		fmt.Fprintln(pp.w, episodeLine(e))
	}
	if time.Since(pp.last) >= progressLog {
		pp.last = time.Now()
		fmt.Fprintln(pp.w, pp.line())
	}
}

// episodeLine describes an ended episode.
func episodeLine(e runner.Event) string {
	r := e.Result
	s := fmt.Sprintf("%s (attempt %d): %s", e.TaskID, e.Attempt, r.Outcome)
	if a := r.Attribution; a != nil {
		s += fmt.Sprintf(" — %s/%s at step %d: %s", a.Source, a.Code, a.Step, a.Message)
	}
	return s
}

// done ends the progress output.
func (pp *progressPrinter) done() {
	if pp.terminal {
		if pp.drawn {
			fmt.Fprintf(pp.w, "\r\033[K%s\n", pp.line())
		}
		return
	}
	fmt.Fprintln(pp.w, pp.line())
}

// embedded is a server started in this process for one command.
type embedded struct {
	client *client.Client
	srv    *instance
	cancel context.CancelFunc
	dir    string
	agent  string
}

// startEmbedded starts a server in this process: the local runtime, the
// memory store, a temporary state directory, a fresh API key, a free
// loopback port. It outlives ctx, so that a canceled run can still abort
// its episodes; stop ends it and removes its state.
func startEmbedded(ctx context.Context, getenv func(string) string, log io.Writer) (*embedded, error) {
	if err := local.ReexecSealed(); err != nil {
		return nil, err
	}
	cfg := defaultConfig(getenv)
	if getenv("LOG_LEVEL") == "" {
		// The server shares the terminal with the progress line.
		cfg.LogLevel = "WARN"
	}
	if err := loadEnv(&cfg, getenv, func(string) bool { return false }); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "orchard-run-")
	if err != nil {
		return nil, err
	}
	key := make([]byte, 24)
	_, _ = rand.Read(key)
	cfg.Addr, cfg.StateDir, cfg.Store = "127.0.0.1:0", dir, "memory"
	cfg.Server.APIKeys, cfg.Server.RequireAPIKey = []string{base64.RawURLEncoding.EncodeToString(key)}, true
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	srv, err := startServer(sctx, cfg, io.Discard)
	if err != nil {
		cancel()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded server: %w", err)
	}
	agent, _ := agentbin.Resolve(filepath.Join(dir, "bin"), cfg.AgentPath)
	fmt.Fprintf(log, "embedded server on %s (state in %s)\n", srv.URL, dir)
	return &embedded{client: client.New(srv.URL, srv.Keys[0], client.WithUserAgent("orchard-cli/"+version)),
		srv: srv, cancel: cancel, dir: dir, agent: agent}, nil
}

// stop shuts the embedded server down, deletes the sandboxes it left and
// removes its state directory.
func (e *embedded) stop(log io.Writer) {
	e.cancel()
	if err := e.srv.wait(); err != nil {
		fmt.Fprintf(log, "embedded server: %v\n", err)
	}
	// Sandbox teardown runs behind the API's answers; what is still there
	// goes now, before its directory.
	if rt, err := local.New(local.Config{StateDir: filepath.Join(e.dir, "runtime"), AgentPath: e.agent, Logger: slog.New(slog.DiscardHandler)}); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		insts, _ := rt.List(ctx)
		for _, in := range insts {
			if err := rt.Delete(ctx, in.ID); err != nil {
				fmt.Fprintf(log, "embedded server: delete sandbox %s: %v\n", in.ID, err)
			}
		}
		cancel()
		_ = rt.Close()
	}
	_ = os.RemoveAll(e.dir)
}
