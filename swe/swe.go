// Package swe holds the bundled suite of software-engineering tasks, run
// as shell episodes: small repositories in Python, JavaScript, Perl, Bash
// and C, embedded in the binary, each with a bug, the tests that show it
// (an exec eval over its FAIL_TO_PASS and PASS_TO_PASS tests, as
// SWE-bench reports them) and a reference fix that the scripted policy
// applies. They need only what the sandbox's default image (the host's
// root) has: python3, node, perl, bash and gcc, and no network.
package swe

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"slices"

	"github.com/orchard/orchard/tasks"
)

// SuiteName is the name of the suite.
const SuiteName = "swe"

// workDir is where a task's repository is written in the sandbox: the
// sandbox's working directory, where apply_patch applies patches and exec
// runs commands unless told otherwise.
const workDir = "/workspace"

// maxSteps bounds an episode of a task: room to read the code, run the
// tests, patch and run them again, a few times over.
const maxSteps = 20

// A task is a folder of tasks/: task.json (meta), repo/ (the repository's
// files, written into workDir) and fix.patch (the reference fix, a
// unified diff relative to workDir).
//
//go:embed tasks
var tasksFS embed.FS

// meta is a task's task.json.
type meta struct {
	Question    string   `json:"question"`
	Language    string   `json:"language"`
	TestCommand string   `json:"test_command"`
	FailToPass  []string `json:"fail_to_pass"`
	PassToPass  []string `json:"pass_to_pass"`
}

// Suite builds the suite's tasks, in the order of their ids, validated as
// strictly as a task file's.
func Suite() ([]tasks.Task, error) {
	b, err := SuiteJSONL()
	if err != nil {
		return nil, err
	}
	ts, err := tasks.Parse(bytes.NewReader(b), SuiteName+".jsonl")
	if err != nil {
		return nil, err
	}
	for i := range ts {
		ts[i].Suite = SuiteName
	}
	return ts, nil
}

// SuiteJSONL is the suite as a task file, as POST /tasks takes it.
func SuiteJSONL() ([]byte, error) {
	ids, err := taskIDs()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	for _, id := range ids {
		t, err := build(id)
		if err != nil {
			return nil, err
		}
		line, err := json.Marshal(t)
		if err != nil {
			return nil, err
		}
		out.Write(append(line, '\n'))
	}
	return out.Bytes(), nil
}

func taskIDs() ([]string, error) {
	entries, err := fs.ReadDir(tasksFS, "tasks")
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// build makes the task of folder id.
func build(id string) (tasks.Task, error) {
	dir := path.Join("tasks", id)
	raw, err := tasksFS.ReadFile(path.Join(dir, "task.json"))
	if err != nil {
		return tasks.Task{}, fmt.Errorf("swe: task %s: %w", id, err)
	}
	var m meta
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return tasks.Task{}, fmt.Errorf("swe: task %s: task.json: %w", id, err)
	}
	var files []tasks.File
	repo := path.Join(dir, "repo")
	err = fs.WalkDir(tasksFS, repo, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := tasksFS.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, tasks.File{Path: workDir + p[len(repo):], Content: string(b)})
		return nil
	})
	if err != nil {
		return tasks.Task{}, fmt.Errorf("swe: task %s: %w", id, err)
	}
	return tasks.Task{
		ID: id, Question: m.Question, Website: m.Language, MaxSteps: maxSteps,
		Setup: &tasks.Setup{Files: files, Sandbox: json.RawMessage(`{"kind":"shell","block_network":true}`)},
		Eval: &tasks.Eval{Type: tasks.EvalExec, Command: "cd " + workDir + " && " + m.TestCommand,
			FailToPass: m.FailToPass, PassToPass: m.PassToPass},
	}, nil
}

// Fix is the reference fix of task id, a unified diff relative to the
// sandbox's working directory.
func Fix(id string) (string, bool) {
	b, err := tasksFS.ReadFile(path.Join("tasks", id, "fix.patch"))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// Script is the reference policy of task id: apply the fix, run the tests
// (all of them, as a policy would check its work), submit.
func Script(id string) ([]json.RawMessage, bool) {
	fix, ok := Fix(id)
	if !ok {
		return nil, false
	}
	t, err := build(id)
	if err != nil {
		return nil, false
	}
	all := t.Eval.Command
	// The test command with no test named runs them all: the harnesses
	// of the bundled repositories do, and unittest discovers them.
	all = replaceTest(all)
	actions := []map[string]any{
		{"type": "apply_patch", "patch": fix},
		{"type": "exec", "command": all, "timeout": 60},
		{"type": "submit"},
	}
	out := make([]json.RawMessage, len(actions))
	for i, a := range actions {
		out[i], _ = json.Marshal(a)
	}
	return out, true
}

// replaceTest drops the test placeholder from a test command.
func replaceTest(cmd string) string {
	return string(bytes.ReplaceAll([]byte(cmd), []byte(" "+tasks.TestPlaceholder), nil))
}
