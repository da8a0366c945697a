package agent

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// gitMissing is the stderr of apply_patch in an image without git.
const gitMissing = "git: command not found (apply_patch needs git in the sandbox image)"

func (s *Server) handlePatch(w http.ResponseWriter, r *http.Request) error {
	var req api.AgentPatchRequest
	if err := decodeJSON(w, r, maxJSONBody, &req); err != nil {
		return err
	}
	res, err := s.patch(r, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// patch applies req.Patch with `git apply` in req.Dir (default Config.Cwd),
// git's defaults being Orchard's semantics (-p1, all or nothing). Failure of
// git, a timeout and a missing git are results; only the agent's own
// failures (no temp file) are errors.
func (s *Server) patch(r *http.Request, req api.AgentPatchRequest) (api.AgentPatchResult, error) {
	timeout := DefaultPatchTimeout
	if req.TimeoutSeconds > 0 {
		timeout = api.Seconds(req.TimeoutSeconds)
	}
	dir := req.Dir
	if dir == "" {
		dir = s.cfg.Cwd
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		// What Orchard's `cd /workspace && git apply` answers.
		return api.AgentPatchResult{ExitCode: 1, Stderr: fmt.Sprintf("cd: %s: No such file or directory\n", dir)}, nil
	}
	env := commandEnv(s.cfg.Env, nil)
	if _, err := lookPath("git", env, dir); errors.Is(err, exec.ErrNotFound) {
		return api.AgentPatchResult{ExitCode: 127, Stderr: gitMissing}, nil
	}

	// The patch travels in a file, not a heredoc, so no line of it can end
	// the input early (Orchard's PATCH_EOF quirk).
	f, err := os.CreateTemp("", "orchard-patch-*.diff")
	if err != nil {
		return api.AgentPatchResult{}, faults.Wrap(fmt.Errorf("patch: create temp file: %w", err), faults.CodeFileIO, faults.Internal, faults.Sandbox, "cannot store patch")
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(req.Patch); err != nil {
		f.Close()
		return api.AgentPatchResult{}, faults.Wrap(fmt.Errorf("patch: write temp file: %w", err), faults.CodeFileIO, faults.Internal, faults.Sandbox, "cannot store patch")
	}
	if err := f.Close(); err != nil {
		return api.AgentPatchResult{}, faults.Wrap(fmt.Errorf("patch: close temp file: %w", err), faults.CodeFileIO, faults.Internal, faults.Sandbox, "cannot store patch")
	}

	var stdout, stderr bytes.Buffer
	exit, err := s.run(r.Context(), runSpec{
		argv:      []string{"git", "apply", f.Name()},
		dir:       dir,
		env:       env,
		timeout:   timeout,
		maxOutput: s.cfg.MaxOutputBytes,
	}, func(stream string, p []byte) {
		if stream == streamStdout {
			stdout.Write(p)
		} else {
			stderr.Write(p)
		}
	})
	if err != nil {
		return api.AgentPatchResult{}, err
	}
	return api.AgentPatchResult{ExitCode: exit.ExitCode, Stdout: stdout.String(), Stderr: stderr.String()}, nil
}
