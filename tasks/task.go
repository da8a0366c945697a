// Package tasks loads the tasks an episode runs — Orchard's own JSONL and
// YAML files, and the WebVoyager and Online-Mind2Web files as they are
// published — validates them, and keeps the loaded suites in a Registry.
package tasks

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// Sources of a task: the format it was loaded from.
const (
	SourceOrchard    = "orchard"
	SourceWebVoyager = "webvoyager"
	SourceMind2Web   = "mind2web"
)

// Task is one thing to do in a browser, on a desktop or in a shell: where
// to start, what to do, how to prepare the sandbox and how to tell whether
// it was done.
type Task struct {
	ID              string `json:"id"`
	Suite           string `json:"suite,omitempty"`
	Source          string `json:"source,omitempty"` // SourceOrchard, SourceWebVoyager, SourceMind2Web
	StartURL        string `json:"start_url"`
	Question        string `json:"question"`
	Website         string `json:"website,omitempty"` // WebVoyager's web_name, Mind2Web's website
	Level           string `json:"level,omitempty"`   // Mind2Web: easy, medium, hard
	ReferenceLength int    `json:"reference_length,omitempty"`
	MaxSteps        int    `json:"max_steps,omitempty"`
	Setup           *Setup `json:"setup,omitempty"`
	Eval            *Eval  `json:"eval,omitempty"`
}

// Setup prepares a sandbox before the episode starts.
type Setup struct {
	// Repo is a repository copied into the sandbox first, before Files
	// and Exec.
	Repo  *Repo    `json:"repo,omitempty"`
	Files []File   `json:"files,omitempty"`
	Exec  []string `json:"exec,omitempty"`
	// Sandbox is a fragment of a POST /sandboxes body (kind, browser,
	// desktop, memory, ...) merged into the episode's sandbox request. Its
	// kind is "browser" (the default), "desktop" or "shell".
	Sandbox json.RawMessage `json:"sandbox,omitempty"`
}

// Repo is a repository on the server's host that a task's setup copies
// into the sandbox: a directory (Path) or a tar archive (Tarball: .tar,
// .tar.gz or .tgz), at Commit when set (a directory must then be a git
// repository; an archive must hold one), into Dir (default: the sandbox's
// working directory). The server reads only under the roots its
// operator allows (TASK_REPO_ROOTS).
type Repo struct {
	Path    string `json:"path,omitempty"`
	Tarball string `json:"tarball,omitempty"`
	Commit  string `json:"commit,omitempty"`
	Dir     string `json:"dir,omitempty"`
}

// gitRef is what Repo.Commit may hold: a hash, a tag or a branch name; it
// is passed to git as an argument, so never an option. The length is
// checked apart: a bounded repeat in the pattern ({0,199}) compiles into
// 200 copies, which cost every process linking this package 3–5 ms at start.
var gitRef = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._/-]*$`)

const maxGitRef = 200

func (r *Repo) validate() error {
	switch {
	case (r.Path == "") == (r.Tarball == ""):
		return fmt.Errorf("setup.repo: want one of path and tarball")
	case r.Commit != "" && (len(r.Commit) > maxGitRef || !gitRef.MatchString(r.Commit)):
		return fmt.Errorf("setup.repo.commit %q is not a commit, tag or branch name", r.Commit)
	case r.Dir != "" && !strings.HasPrefix(r.Dir, "/"):
		return fmt.Errorf("setup.repo.dir %q is not an absolute path", r.Dir)
	}
	if r.Tarball != "" {
		switch t := strings.ToLower(r.Tarball); {
		case strings.HasSuffix(t, ".tar"), strings.HasSuffix(t, ".tar.gz"), strings.HasSuffix(t, ".tgz"):
		default:
			return fmt.Errorf("setup.repo.tarball %q: want a .tar, .tar.gz or .tgz file", r.Tarball)
		}
	}
	return nil
}

// Kind is the sandbox kind s asks for (api.KindBrowser, api.KindDesktop,
// api.KindShell),
// or "" when it names none or s is nil.
func (s *Setup) Kind() string {
	if s == nil || len(s.Sandbox) == 0 {
		return ""
	}
	var v struct {
		Kind string `json:"kind"`
	}
	_ = json.Unmarshal(s.Sandbox, &v)
	return v.Kind
}

// File is written into the sandbox by Setup; Content is text, Base64 binary.
type File struct {
	Path    string `json:"path"`
	Content string `json:"content,omitempty"`
	Base64  string `json:"base64,omitempty"`
}

// Eval types.
const (
	EvalAnswerMatch = "answer_match"
	EvalURLMatch    = "url_match"
	EvalDOMMatch    = "dom_match"
	EvalJS          = "js"
	EvalJudge       = "judge"
	EvalExec        = "exec"
)

// Eval says how an episode of the task is scored. Which fields apply
// depends on Type:
//
//   - answer_match: the final answer against References (any may match)
//     with Mode exact, contains (default), regex or numeric (the first
//     number of each, within the absolute Tolerance). Whitespace is always
//     normalised; case too unless CaseSensitive.
//   - url_match: the final page URL against URL with Mode exact, prefix
//     (default; the prefix ends at a boundary: the host does not run on
//     into another host or port, a path segment not into a longer one),
//     contains or regex; scheme and host case and a trailing slash are
//     normalised.
//   - dom_match: elements of the final page matching Selector whose text
//     contains Text (whitespace-normalised; case too unless
//     CaseSensitive); there must be exactly Count of them, or at least one
//     when Count is nil.
//   - js: Script, an expression evaluated in the final page, must be true
//     (a promise is awaited). A script the page cannot compile is
//     task.invalid.
//   - judge: an LLM judge reads the trajectory; Criteria adds instructions.
//   - exec: Command runs in the episode's sandbox when the episode
//     finishes (in a desktop sandbox with DISPLAY set); it must exit 0
//     and, when Text is set, print Text on stdout (whitespace-normalised;
//     case too unless CaseSensitive). For checks of what an app left
//     behind: a file it saved, a setting it changed. With FailToPass or
//     PassToPass (SWE-bench's FAIL_TO_PASS and PASS_TO_PASS), Command
//     holds {test} and runs once per listed test with {test} replaced by
//     the test's name (shell-quoted): every test of both lists must exit
//     0, and each is reported pass or fail.
//
// url_match, dom_match and js look at the final page, so they need a
// browser episode; answer_match, judge and exec work in every kind.
type Eval struct {
	Type          string   `json:"type"`
	Mode          string   `json:"mode,omitempty"`
	References    []string `json:"references,omitempty"`
	Tolerance     float64  `json:"tolerance,omitempty"`
	CaseSensitive bool     `json:"case_sensitive,omitempty"`
	URL           string   `json:"url,omitempty"`
	Selector      string   `json:"selector,omitempty"`
	Text          string   `json:"text,omitempty"`
	Count         *int     `json:"count,omitempty"`
	Script        string   `json:"script,omitempty"`
	Criteria      string   `json:"criteria,omitempty"`
	Command       string   `json:"command,omitempty"`
	FailToPass    []string `json:"fail_to_pass,omitempty"`
	PassToPass    []string `json:"pass_to_pass,omitempty"`
}

// TestPlaceholder is what an exec eval's command holds where a test of
// FailToPass or PassToPass goes.
const TestPlaceholder = "{test}"

// NeedsPage reports whether e reads the final page of a browser, which a
// desktop episode does not have.
func (e Eval) NeedsPage() bool {
	switch e.Type {
	case EvalURLMatch, EvalDOMMatch, EvalJS:
		return true
	}
	return false
}

// Answer-match and URL-match modes.
const (
	ModeExact    = "exact"
	ModeContains = "contains"
	ModeRegex    = "regex"
	ModeNumeric  = "numeric"
	ModePrefix   = "prefix"
)

// MatchMode is the effective mode of an answer_match or url_match eval,
// with its default filled in.
func (e Eval) MatchMode() string {
	if e.Mode != "" {
		return e.Mode
	}
	if e.Type == EvalURLMatch {
		return ModePrefix
	}
	return ModeContains
}

// Validate reports what is wrong with e, as a plain error.
func (e Eval) Validate() error {
	if e.Type != EvalExec && len(e.FailToPass)+len(e.PassToPass) > 0 {
		return fmt.Errorf("eval: fail_to_pass and pass_to_pass belong to an exec eval")
	}
	switch e.Type {
	case EvalAnswerMatch:
		switch e.MatchMode() {
		case ModeExact, ModeContains, ModeNumeric:
		case ModeRegex:
			for _, r := range e.References {
				if _, err := regexp.Compile(r); err != nil {
					return fmt.Errorf("eval: reference %q: %w", r, err)
				}
			}
		default:
			return fmt.Errorf("eval: answer_match mode %q is not exact, contains, regex or numeric", e.Mode)
		}
		if len(e.References) == 0 {
			return fmt.Errorf("eval: answer_match needs references")
		}
		if e.Tolerance < 0 {
			return fmt.Errorf("eval: negative tolerance")
		}
	case EvalURLMatch:
		switch e.MatchMode() {
		case ModeExact, ModePrefix, ModeContains:
		case ModeRegex:
			if _, err := regexp.Compile(e.URL); err != nil {
				return fmt.Errorf("eval: url %q: %w", e.URL, err)
			}
		default:
			return fmt.Errorf("eval: url_match mode %q is not exact, prefix, contains or regex", e.Mode)
		}
		if e.URL == "" {
			return fmt.Errorf("eval: url_match needs url")
		}
	case EvalDOMMatch:
		if strings.TrimSpace(e.Selector) == "" {
			return fmt.Errorf("eval: dom_match needs selector")
		}
		if e.Count != nil && *e.Count < 0 {
			return fmt.Errorf("eval: negative count")
		}
	case EvalJS:
		if strings.TrimSpace(e.Script) == "" {
			return fmt.Errorf("eval: js needs script")
		}
	case EvalJudge:
	case EvalExec:
		if strings.TrimSpace(e.Command) == "" {
			return fmt.Errorf("eval: exec needs command")
		}
		lists := len(e.FailToPass) + len(e.PassToPass)
		if has := strings.Contains(e.Command, TestPlaceholder); has != (lists > 0) {
			return fmt.Errorf("eval: exec command holds %s exactly when fail_to_pass or pass_to_pass lists tests", TestPlaceholder)
		}
		for _, t := range append(append([]string(nil), e.FailToPass...), e.PassToPass...) {
			if strings.TrimSpace(t) == "" {
				return fmt.Errorf("eval: empty test name in fail_to_pass or pass_to_pass")
			}
		}
	case "":
		return fmt.Errorf("eval: missing type")
	default:
		return fmt.Errorf("eval: unknown type %q (want answer_match, url_match, dom_match, js, judge or exec)", e.Type)
	}
	return nil
}

// Validate reports what is wrong with t, as a plain error; loaders turn it
// into a task.invalid fault that names the file and line.
func (t Task) Validate() error {
	if strings.TrimSpace(t.ID) == "" {
		return fmt.Errorf("missing id")
	}
	if strings.TrimSpace(t.Question) == "" {
		return fmt.Errorf("task %s: missing question", t.ID)
	}
	if t.StartURL == "" {
		if t.Setup == nil {
			return fmt.Errorf("task %s: missing start_url (allowed only with setup)", t.ID)
		}
	} else if err := checkStartURL(t.StartURL); err != nil {
		return fmt.Errorf("task %s: %w", t.ID, err)
	}
	if t.MaxSteps < 0 || t.ReferenceLength < 0 {
		return fmt.Errorf("task %s: negative max_steps or reference_length", t.ID)
	}
	if t.Setup != nil {
		if err := t.Setup.validate(); err != nil {
			return fmt.Errorf("task %s: %w", t.ID, err)
		}
	}
	if t.Eval != nil {
		if err := t.Eval.Validate(); err != nil {
			return fmt.Errorf("task %s: %w", t.ID, err)
		}
		if err := t.CheckKind(t.Setup.Kind()); err != nil {
			return fmt.Errorf("task %s: %w", t.ID, err)
		}
	}
	return nil
}

// CheckKind reports, as a plain error, why t cannot run in a sandbox of
// kind (api.KindBrowser, api.KindDesktop, api.KindShell; "" is browser):
// an eval that reads the final page needs a browser.
func (t Task) CheckKind(kind string) error {
	if (kind == api.KindDesktop || kind == api.KindShell) && t.Eval != nil && t.Eval.NeedsPage() {
		return fmt.Errorf("eval: %s reads the final page of a browser, and a %s episode has none (use exec, answer_match or judge)", t.Eval.Type, kind)
	}
	return nil
}

func checkStartURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("start_url: %w", err)
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
		if u.Host == "" {
			return fmt.Errorf("start_url %q has no host", s)
		}
	case "file", "data":
	case "about":
		if s != "about:blank" {
			return fmt.Errorf("start_url %q: of about: URLs only about:blank", s)
		}
	default:
		return fmt.Errorf("start_url %q is not an absolute http, https, file or data URL, or about:blank", s)
	}
	return nil
}

func (s *Setup) validate() error {
	if s.Repo != nil {
		if err := s.Repo.validate(); err != nil {
			return err
		}
	}
	for i, f := range s.Files {
		if strings.TrimSpace(f.Path) == "" {
			return fmt.Errorf("setup.files[%d]: missing path", i)
		}
		if f.Content != "" && f.Base64 != "" {
			return fmt.Errorf("setup.files[%d]: both content and base64", i)
		}
		if f.Base64 != "" {
			if _, err := base64.StdEncoding.DecodeString(f.Base64); err != nil {
				return fmt.Errorf("setup.files[%d]: base64: %w", i, err)
			}
		}
	}
	for i, c := range s.Exec {
		if strings.TrimSpace(c) == "" {
			return fmt.Errorf("setup.exec[%d]: empty command", i)
		}
	}
	if len(s.Sandbox) > 0 {
		var m map[string]any
		if err := json.Unmarshal(s.Sandbox, &m); err != nil || m == nil {
			return fmt.Errorf("setup.sandbox: not a JSON object")
		}
		switch k := m["kind"]; k {
		case nil, api.KindBrowser, api.KindDesktop, api.KindShell:
		default:
			return fmt.Errorf("setup.sandbox.kind %v: episodes run in a browser, desktop or shell sandbox", jsonText(k))
		}
		// A POST /sandboxes body, decoded as strictly as the task: a typo
		// here would silently change the sandbox the task runs in.
		dec := json.NewDecoder(bytes.NewReader(s.Sandbox))
		dec.DisallowUnknownFields()
		var req api.CreateSandboxRequest
		if err := dec.Decode(&req); err != nil {
			return fmt.Errorf("setup.sandbox: %v", err)
		}
	}
	return nil
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// invalid is the fault of a malformed task file or task.
func invalid(format string, args ...any) error {
	return faults.Newf(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, format, args...)
}

// clone copies t deeply enough that the copy shares no mutable state.
func (t Task) clone() Task {
	if t.Setup != nil {
		s := *t.Setup
		s.Files = append([]File(nil), s.Files...)
		s.Exec = append([]string(nil), s.Exec...)
		s.Sandbox = append(json.RawMessage(nil), s.Sandbox...)
		if s.Repo != nil {
			r := *s.Repo
			s.Repo = &r
		}
		t.Setup = &s
	}
	if t.Eval != nil {
		e := *t.Eval
		e.References = append([]string(nil), e.References...)
		e.FailToPass = append([]string(nil), e.FailToPass...)
		e.PassToPass = append([]string(nil), e.PassToPass...)
		if e.Count != nil {
			c := *e.Count
			e.Count = &c
		}
		t.Eval = &e
	}
	return t
}
