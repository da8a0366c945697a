package server

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/episodes"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/tasks"
)

// Shell episodes: a step's actions are run here, against the sandbox's
// agent (exec, files, patch), not by a daemon in the sandbox; the
// observation is how the last action ended (api.ShellObservation).

// Shell step budgets, each with its reason.
const (
	// shellOutputCap caps each of a command's streams in an observation:
	// a failing test run's report fits, and a policy's context and a
	// recording's size stay bounded when a command floods its output.
	shellOutputCap = 64 << 10
	// shellExecTimeout is an exec action's timeout when it names none:
	// a test run of a small repository.
	shellExecTimeout = 60
	// repoSetupTimeout bounds unpacking a repository into the sandbox and
	// committing it as the base.
	repoSetupTimeout = 300
	// repoArchive is where a repository's archive is uploaded in the
	// sandbox, removed once unpacked.
	repoArchive = "/tmp/.orchard-repo.tar"
)

// runShellStep runs st's shell actions in order in ep's sandbox; the
// observation is the last one's that ran something (answer and submit
// do not). An action the policy got wrong (an unknown type, a missing
// field) stops the step with its classified error; a command that exits
// non-zero, a patch that does not apply and a file that cannot be
// written are results, in the observation. The error returned is the
// environment's (the sandbox's agent did not answer) or the step's
// context's.
func (s *Server) runShellStep(ctx context.Context, ep *episodes.Episode, st episodes.Step) (episodes.Outcome, []byte, error) {
	var o episodes.Outcome
	obs := api.ShellObservation{}
	for _, raw := range st.Actions {
		a, ferr := decodeShellAction(raw)
		if ferr != nil {
			i := ferr.Info()
			o.Error = &i
			break
		}
		if a.Type == "answer" || a.Type == "submit" {
			// They end the episode and run nothing: the observation stays
			// the step's last command's.
			continue
		}
		res, err := s.shellAction(ctx, ep.SandboxID, a)
		if err != nil {
			return o, nil, err
		}
		obs = res
	}
	o.Observation = api.StepObservation{Shell: &obs}
	raw, err := json.Marshal(obs)
	return o, raw, err
}

// decodeShellAction reads one action of a shell step as strictly as a
// task: an unknown field or type, or a missing argument, is the policy's
// action.invalid.
func decodeShellAction(raw json.RawMessage) (api.ShellAction, *faults.Error) {
	var a api.ShellAction
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return a, actionInvalid("shell action: %v", err)
	}
	switch a.Type {
	case "exec":
		if strings.TrimSpace(a.Command) == "" {
			return a, actionInvalid("exec needs command")
		}
		if a.Timeout < 0 {
			return a, actionInvalid("exec timeout %d is negative", a.Timeout)
		}
	case "write_file":
		if strings.TrimSpace(a.Path) == "" {
			return a, actionInvalid("write_file needs path")
		}
	case "apply_patch":
		if strings.TrimSpace(a.Patch) == "" {
			return a, actionInvalid("apply_patch needs patch")
		}
	case "answer", "submit":
	case "":
		return a, actionInvalid("shell action without type")
	default:
		return a, actionInvalid("unknown shell action %q (want exec, write_file, apply_patch, answer or submit)", a.Type)
	}
	return a, nil
}

func actionInvalid(format string, args ...any) *faults.Error {
	return faults.Newf(faults.CodeActionInvalid, faults.InvalidRequest, faults.Policy, format, args...)
}

// shellAction runs one decoded action in sandbox id.
func (s *Server) shellAction(ctx context.Context, id string, a api.ShellAction) (api.ShellObservation, error) {
	start := time.Now()
	var obs api.ShellObservation
	switch a.Type {
	case "exec":
		timeout := a.Timeout
		if timeout == 0 {
			timeout = shellExecTimeout
		}
		if dl, ok := ctx.Deadline(); ok {
			// The command ends by its own timeout before the step's budget
			// does, so the policy gets its output and exit code 124.
			timeout = max(1, min(timeout, int(math.Floor(time.Until(dl).Seconds()))-1))
		}
		job, err := s.execJob(ctx, id, manager.ExecParams{Command: a.Command, TimeoutSeconds: timeout, Cwd: a.Cwd, Env: a.Env, Wait: true})
		if err != nil {
			if f := faults.Of(err); f.Category == faults.InvalidRequest {
				// A cwd or env the sandbox refuses: the policy's to fix.
				return api.ShellObservation{Stderr: f.Message, ExitCode: 1}, nil
			}
			return obs, err
		}
		obs.ExitCode = -1
		if job.ExitCode != nil {
			obs.ExitCode = *job.ExitCode
		}
		obs.Stdout, obs.StdoutTruncated = capOutput(job.Stdout, job.Truncated)
		obs.Stderr, obs.StderrTruncated = capOutput(job.Stderr, job.Truncated)
	case "write_file":
		content := base64.StdEncoding.EncodeToString([]byte(a.Content))
		path := a.Path
		if _, err := s.mgr.Upload(ctx, id, api.UploadRequest{Path: &path, Content: &content}); err != nil {
			// A path the sandbox refuses (outside it, a directory, read
			// only) is the policy's to fix; the sandbox gone is not.
			if f := faults.Of(err); f.Category == faults.InvalidRequest || f.Category == faults.ActionFailed ||
				f.Category == faults.NotFound && f.Code != faults.CodeSandboxNotFound {
				return api.ShellObservation{Stderr: f.Message, ExitCode: 1}, nil
			}
			return obs, err
		}
	case "apply_patch":
		res, err := s.mgr.ApplyPatch(ctx, id, a.Patch, shellExecTimeout)
		if err != nil {
			return obs, err
		}
		obs.Stdout, obs.StdoutTruncated = capOutput(res.Stdout, false)
		obs.Stderr, obs.StderrTruncated = capOutput(res.Stderr, false)
		obs.ExitCode = 1
		switch {
		case res.ExitCode != nil:
			obs.ExitCode = *res.ExitCode
		case res.Error != nil:
			obs.Stderr += *res.Error
		}
	}
	obs.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	return obs, nil
}

// capOutput cuts out to shellOutputCap bytes on a UTF-8 boundary; cut
// reports a cut, here or by the agent before (agentCut).
func capOutput(out string, agentCut bool) (string, bool) {
	if len(out) <= shellOutputCap {
		return out, agentCut && len(out) > 0
	}
	n := shellOutputCap
	for n > 0 && n > shellOutputCap-4 && !utf8Start(out[n]) {
		n--
	}
	return out[:n], true
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// execJob runs a command in sandbox id (p.Wait: and waits for it). A
// command that failed because the sandbox failed under it is the
// environment's fault, returned as the error (see execIn).
func (s *Server) execJob(ctx context.Context, id string, p manager.ExecParams) (api.Job, error) {
	job, err := s.mgr.Exec(ctx, id, p)
	if err != nil {
		return job, err
	}
	if f := job.Fault; f != nil {
		info := faults.Info{Category: faults.Category(f.Category), Source: faults.Source(f.Source), Code: f.Code,
			Message: f.Message, Retryable: f.Retryable}
		if episodes.IsEnvFault(&info) {
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

// setupRepo copies the task's repository into sandbox id: it reads it on
// this host (only under Config.RepoRoots), uploads it as a tar archive,
// unpacks it into the repo's dir and, when git is there, leaves it a git
// repository at the asked commit (an archive of a plain directory or a
// git archive becomes one commit, "base"), so a policy can diff its work.
func (s *Server) setupRepo(ctx context.Context, id string, r *tasks.Repo) error {
	src := r.Path
	if src == "" {
		src = r.Tarball
	}
	src, err := s.repoSource(src)
	if err != nil {
		return err
	}
	fail := func(format string, a ...any) error {
		return faults.Newf(faults.CodeTaskSetupFailed, faults.Unavailable, faults.Task, "task setup: repo: "+format, a...)
	}
	var archive io.Reader
	var wait func(uploaded bool) error
	switch {
	case r.Tarball != "":
		f, err := os.Open(src)
		if err != nil {
			return fail("%v", err)
		}
		defer f.Close()
		archive = f
	case r.Commit != "":
		// Only the commit's tree: the host repository's history and other
		// branches (a fix, perhaps) stay out of the sandbox. The server
		// reads repositories that others own: git's ownership check is
		// for repositories whose hooks and config it runs, and archive
		// runs neither.
		gctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cmd := exec.CommandContext(gctx, "git", "-c", "safe.directory=*", "-C", src, "archive", "--format=tar", "--end-of-options", r.Commit)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return fail("%v", err)
		}
		if err := cmd.Start(); err != nil {
			return fail("git archive: %v", err)
		}
		archive = out
		wait = func(uploaded bool) error {
			if !uploaded {
				// The upload stopped reading: git would block on its
				// output for ever.
				cancel()
			}
			if err := cmd.Wait(); err != nil {
				return fail("git archive %s: %v: %s", r.Commit, err, strings.TrimSpace(stderr.String()))
			}
			return nil
		}
	default:
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarDir(src, pw)) }()
		defer pr.Close()
		archive = pr
	}
	_, uerr := s.mgr.UploadFrom(ctx, id, repoArchive, archive, func() string { return "" })
	if wait != nil {
		if err := wait(uerr == nil); err != nil && uerr == nil {
			return err
		}
	}
	if uerr != nil {
		return fail("upload: %s", faults.Of(uerr).Message)
	}
	dir := r.Dir
	if dir == "" {
		dir = "."
	}
	script := fmt.Sprintf(`set -e
mkdir -p %[1]s
tar -xf %[2]s -C %[1]s
rm -f %[2]s
cd %[1]s
command -v git >/dev/null || exit 0
git config --global --add safe.directory '*' 2>/dev/null || true
if [ ! -d .git ]; then
  git init -q
  git add -A
  git -c user.name=orchard -c user.email=orchard@localhost commit -q --allow-empty -m base
elif [ -n %[3]s ]; then
  git -c advice.detachedHead=false checkout -q --force %[3]s
fi
`, shellQuote(dir), repoArchive, shellQuote(r.Commit))
	job, err := s.execJob(ctx, id, manager.ExecParams{Command: script, TimeoutSeconds: repoSetupTimeout, Wait: true})
	if err != nil {
		return err
	}
	if job.Status != api.JobSucceeded {
		return fail("unpack into %s: %s", dir, strings.TrimSpace(job.Stderr))
	}
	return nil
}

// repoSource resolves a repository's path on this host and checks that it
// lies under one of the roots the operator allows: a task is the
// client's, and must not read the server's files.
func (s *Server) repoSource(p string) (string, error) {
	refuse := func(why string) error {
		return faults.Newf(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, "setup.repo %s: %s", p, why)
	}
	if len(s.cfg.RepoRoots) == 0 {
		return "", refuse("this server reads no repositories from its host (set TASK_REPO_ROOTS)")
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", refuse(err.Error())
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", refuse("not found")
	}
	for _, root := range s.cfg.RepoRoots {
		r, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(r, real); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return real, nil
		}
	}
	return "", refuse("not under a directory in TASK_REPO_ROOTS")
}

// tarDir writes the directory dir as a tar archive to w: regular files,
// directories and symbolic links, with their modes.
func tarDir(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		} else if !info.Mode().IsRegular() && !info.IsDir() {
			return nil // sockets, devices: not part of a repository
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// shellQuote quotes s as one word for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
