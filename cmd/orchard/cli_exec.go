package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/client"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/server/manager"
)

// execPollInterval is how often exec polls a running job for new output:
// fast enough to feel live, slow enough to cost the server little.
const execPollInterval = 200 * time.Millisecond

func execCmd(conn *connection) *cobra.Command {
	var (
		timeout int
		cwd     string
		env     []string
		login   bool
	)
	cmd := &cobra.Command{
		Use:   "exec [flags] SANDBOX [--] COMMAND [ARG...]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox as a job, stream its stdout and stderr, and exit
with its exit code (128+N when signal N killed it).

A single COMMAND argument is a shell command line ("ls | wc -l"); several
arguments are an argv whose words are quoted for the shell.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return fmt.Errorf("exec: no command")
			}
			envMap, err := parseKV("env", env)
			if err != nil {
				return err
			}
			req := api.ExecRequest{Command: client.Command(commandLine(argv)), Env: envMap, LoginShell: login}
			if timeout > 0 {
				req.TimeoutSeconds = &timeout
			}
			if cwd != "" {
				req.Cwd = &cwd
			}
			return runJob(cmd.Context(), conn.client(), id, req, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	// Everything after SANDBOX belongs to the command, its flags included.
	cmd.Flags().SetInterspersed(false)
	f := cmd.Flags()
	f.IntVar(&timeout, "timeout", 0, "seconds before the command is killed (exit 124; default: the server's, 300)")
	f.StringVar(&cwd, "cwd", "", "working directory (default /workspace)")
	f.StringArrayVar(&env, "env", nil, "environment KEY=VALUE (repeatable)")
	f.BoolVar(&login, "login", false, "run in a login shell (~/.bash_profile, ~/.bashrc)")
	return cmd
}

// commandLine is the shell command for argv: one argument is taken as a
// command line; several are quoted so that the remote shell sees them as
// the same words (the API joins a list with spaces, unquoted).
func commandLine(argv []string) string {
	if len(argv) == 1 {
		return argv[0]
	}
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./_-", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// runJob starts the command, streams the job's output while it runs and
// turns its end into the process's exit status.
func runJob(ctx context.Context, c *client.Client, id string, req api.ExecRequest, stdout, stderr io.Writer) error {
	jobID, err := c.ExecNoWait(ctx, id, req)
	if err != nil {
		return err
	}
	var outP, errP string // what has been written of each stream
	t := time.NewTicker(execPollInterval)
	defer t.Stop()
	for {
		job, err := c.GetJob(ctx, jobID)
		if err != nil {
			if ctx.Err() != nil {
				return interrupted(c, id, jobID, stdout, stderr, outP, errP)
			}
			return err
		}
		done := job.Terminal()
		outP = emit(stdout, job.Stdout, outP, done)
		errP = emit(stderr, job.Stderr, errP, done)
		if done {
			return jobExit(job, stderr)
		}
		select {
		case <-ctx.Done():
			return interrupted(c, id, jobID, stdout, stderr, outP, errP)
		case <-t.C:
		}
	}
}

// cancelTimeout bounds the cancel an interrupted exec sends: the server
// waits up to 10 s for the command to die.
const cancelTimeout = 15 * time.Second

// interrupted cancels the job of an interrupted exec, so that Ctrl-C stops
// the remote command as it would a local one, prints the output that came
// before its end, and exits 130.
func interrupted(c *client.Client, id, jobID string, stdout, stderr io.Writer, outP, errP string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
	defer cancel()
	job, err := c.CancelJob(ctx, jobID)
	switch {
	case err != nil:
		printError(stderr, fmt.Sprintf("interrupted; job %s may still be running in sandbox %s: cancel failed: %v", jobID, id, err), faults.Of(err).Code)
	case !job.Terminal():
		printError(stderr, fmt.Sprintf("interrupted; job %s was asked to stop but is still %s in sandbox %s", jobID, job.Status, id), "")
	default:
		emit(stdout, job.Stdout, outP, true)
		emit(stderr, job.Stderr, errP, true)
		if job.Fault == nil || job.Fault.Code != faults.CodeJobCanceled {
			return jobExit(job, stderr) // it ended by itself first
		}
		printError(stderr, fmt.Sprintf("interrupted; job %s canceled", jobID), faults.CodeJobCanceled)
	}
	return exitError{130}
}

// emit writes what of s lies beyond printed, the text already written,
// and returns the text written so far. While the job runs, replacement
// characters at the end are held back: they may be a multi-byte character
// cut in half, which the next snapshot completes. A login shell's stderr
// is re-joined when the job ends (ORCHARD_COMPAT §4: CRLF and the other
// line breaks become \n, the last one is dropped), so the final text need
// not extend what was printed: it then continues after the same text
// joined that way.
func emit(w io.Writer, s, printed string, final bool) string {
	if !final {
		for i := 0; i < utf8.UTFMax && strings.HasSuffix(s, string(utf8.RuneError)); i++ {
			s = strings.TrimSuffix(s, string(utf8.RuneError))
		}
	}
	if strings.HasPrefix(s, printed) {
		if len(s) > len(printed) {
			_, _ = io.WriteString(w, s[len(printed):])
		}
		return s
	}
	if !final {
		return printed
	}
	joined := manager.JoinLines(printed)
	if !strings.HasPrefix(s, joined) {
		return printed
	}
	rest := s[len(joined):]
	if endsWithLineBreak(printed) {
		rest = strings.TrimPrefix(rest, "\n") // printed already
	}
	_, _ = io.WriteString(w, rest)
	return s
}

// endsWithLineBreak reports whether s ends with a character that Python's
// str.splitlines breaks at.
func endsWithLineBreak(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	switch r {
	case '\n', '\r', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
		return true
	}
	return false
}

// jobExit maps a finished job to the process result: nil for success, the
// command's exit status otherwise, 1 when it has none (it never ran).
func jobExit(job api.Job, stderr io.Writer) error {
	report := func(msg, code string) {
		if job.Stderr != "" && !strings.HasSuffix(job.Stderr, "\n") {
			_, _ = io.WriteString(stderr, "\n") // a line of its own
		}
		printError(stderr, msg, code)
	}
	code := ""
	if job.Fault != nil {
		code = job.Fault.Code
	}
	if job.ExitCode == nil {
		msg := "command failed without an exit code"
		if job.Error != nil && *job.Error != "" {
			msg = *job.Error
		}
		if code == "" {
			code = faults.CodeInternal
		}
		report(msg, code)
		return exitError{1}
	}
	if job.Status == api.JobFailed && job.Error != nil && *job.Error != "" {
		report(*job.Error, code)
	}
	if st := exitStatus(*job.ExitCode); st != 0 {
		return exitError{st}
	}
	return nil
}
