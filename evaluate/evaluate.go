// Package evaluate scores a finished episode against its task's eval: the
// final answer, the final page's URL and DOM, a script run in the page, a
// command run in the sandbox, or an LLM judge reading the trajectory.
package evaluate

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/tasks"
)

// Page is what the evaluators need of the live page at the end of an
// episode.
type Page interface {
	URL() string
	// Eval runs the JavaScript expression expr in the page and returns its
	// value as JSON. Failures should come classified (browser.crashed ...).
	Eval(ctx context.Context, expr string) (json.RawMessage, error)
}

// Sandbox is what the exec evaluator needs of the episode's sandbox.
type Sandbox interface {
	// Exec runs command in the sandbox and waits for it. A command that
	// exits non-zero (or runs past its time) is a result, not an error;
	// errors are failures to run it and should come classified
	// (sandbox.agent_unreachable ...).
	Exec(ctx context.Context, command string) (ExecResult, error)
}

// ExecResult is how a command ended. ExitCode is -1 when the command did
// not exit by itself (it was killed at its timeout).
type ExecResult struct {
	ExitCode       int
	Stdout, Stderr string
}

// Env is the live environment at the end of an episode, for the
// evaluators that look at it. Page is nil when the episode has no browser
// (a desktop episode); Sandbox is nil when there is no sandbox to run in.
type Env struct {
	Page    Page
	Sandbox Sandbox
}

// Step is one action of a trajectory.
type Step struct {
	N      int             `json:"n"`
	Action json.RawMessage `json:"action"`
	URL    string          `json:"url,omitempty"`
	Error  string          `json:"error,omitempty"`
	// Output is how a shell step ended, for a judge to read: its exit
	// code and the end of its output.
	Output string `json:"output,omitempty"`
}

// Trajectory is what the policy did in an episode.
type Trajectory struct {
	Question, Answer, StartURL string
	Steps                      []Step
	// Screenshots are the last few screenshots, oldest first, JPEG or PNG.
	Screenshots [][]byte
}

// Result is the score of an episode (api.Evaluation, its wire form).
type Result = api.Evaluation

// Evaluator scores episodes. Judge is needed only for judge evals.
type Evaluator struct {
	Judge *JudgeConfig
}

// Evaluate scores tr against ev, and env: the final page for url_match,
// dom_match and js, the sandbox for exec. An error means no verdict could
// be reached — a bad eval (task.invalid), a missing page or sandbox, a
// page, sandbox or judge failure — never that the policy failed.
func (e *Evaluator) Evaluate(ctx context.Context, ev tasks.Eval, tr Trajectory, env Env) (Result, error) {
	if err := ev.Validate(); err != nil {
		return Result{}, taskInvalid("%v", err)
	}
	var (
		ok      bool
		details map[string]any
		verdict *JudgeVerdict
		err     error
	)
	page := env.Page
	switch ev.Type {
	case tasks.EvalAnswerMatch:
		ok, details, err = answerMatch(ev, tr.Answer)
	case tasks.EvalURLMatch:
		if page == nil {
			return Result{}, noPage(ev.Type)
		}
		ok, details, err = urlMatch(ev, page.URL())
	case tasks.EvalDOMMatch:
		if page == nil {
			return Result{}, noPage(ev.Type)
		}
		ok, details, err = domMatch(ctx, ev, page)
	case tasks.EvalJS:
		if page == nil {
			return Result{}, noPage(ev.Type)
		}
		ok, details, err = jsCheck(ctx, ev, page)
	case tasks.EvalExec:
		if env.Sandbox == nil {
			return Result{}, taskInvalid("exec needs the episode's sandbox, and there is none")
		}
		ok, details, err = execCheck(ctx, ev, env.Sandbox)
	case tasks.EvalJudge:
		verdict, err = e.Judge.judge(ctx, ev, tr)
		if err == nil {
			ok = verdict.Verdict == VerdictSuccess
			details = map[string]any{"model": e.Judge.Model}
		}
	}
	if err != nil {
		return Result{}, err
	}
	r := Result{Success: ok, Type: ev.Type, Details: details, Judge: verdict}
	if ok {
		r.Reward = 1
	}
	return r, nil
}

func taskInvalid(format string, args ...any) error {
	return faults.Newf(faults.CodeTaskInvalid, faults.InvalidRequest, faults.Task, "evaluate: "+format, args...)
}

func noPage(typ string) error {
	return taskInvalid("%s needs the final page, and there is none", typ)
}

// normalize collapses whitespace and, unless caseSensitive, lowers case.
func normalize(s string, caseSensitive bool) string {
	s = strings.Join(strings.Fields(s), " ")
	if !caseSensitive {
		s = strings.ToLower(s)
	}
	return s
}

func answerMatch(ev tasks.Eval, answer string) (bool, map[string]any, error) {
	mode := ev.MatchMode()
	a := normalize(answer, ev.CaseSensitive)
	d := map[string]any{"mode": mode, "answer": answer, "references": ev.References}
	if a == "" {
		d["reason"] = "empty answer"
		return false, d, nil
	}
	for _, ref := range ev.References {
		var hit bool
		switch mode {
		case tasks.ModeExact:
			hit = a == normalize(ref, ev.CaseSensitive)
		case tasks.ModeContains:
			r := normalize(ref, ev.CaseSensitive)
			hit = r != "" && containsWhole(a, r)
		case tasks.ModeRegex:
			expr := ref
			if !ev.CaseSensitive {
				expr = "(?i)" + expr
			}
			re, err := regexp.Compile(expr)
			if err != nil {
				return false, nil, taskInvalid("answer_match reference %q: %v", ref, err)
			}
			hit = re.MatchString(strings.Join(strings.Fields(answer), " "))
		case tasks.ModeNumeric:
			x, okA := firstNumber(answer)
			y, okR := firstNumber(ref)
			if !okR {
				return false, nil, taskInvalid("answer_match reference %q holds no number", ref)
			}
			if okA {
				d["answer_number"] = x
				hit = math.Abs(x-y) <= ev.Tolerance
			}
		}
		if hit {
			d["matched"] = ref
			return true, d, nil
		}
	}
	return false, d, nil
}

// containsWhole reports whether r occurs in a without cutting a number: a
// reference that starts or ends with a digit must not continue a number
// of the answer, so "3 results" is not found in "13 results", nor "17" in
// "170", "2017" or "17.5".
func containsWhole(a, r string) bool {
	for off := 0; ; {
		i := strings.Index(a[off:], r)
		if i < 0 {
			return false
		}
		i += off
		j := i + len(r)
		if !(isDigit(r[0]) && numberBefore(a[:i])) && !(isDigit(r[len(r)-1]) && numberAfter(a[j:])) {
			return true
		}
		off = i + 1
	}
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// numberBefore reports whether s ends in a digit, or in a decimal point or
// thousands separator after one.
func numberBefore(s string) bool {
	n := len(s)
	return n > 0 && (isDigit(s[n-1]) || (n > 1 && (s[n-1] == '.' || s[n-1] == ',') && isDigit(s[n-2])))
}

// numberAfter reports whether s starts with a digit, or with a decimal
// point or thousands separator before one.
func numberAfter(s string) bool {
	return len(s) > 0 && (isDigit(s[0]) || (len(s) > 1 && (s[0] == '.' || s[0] == ',') && isDigit(s[1])))
}

// number is a decimal with optional sign, thousands separators and
// fraction.
var number = regexp.MustCompile(`[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+`)

// firstNumber reads the first number of s. U+2212 MINUS SIGN (how
// Wikipedia and many pages print negatives) is a minus; a sign glued to a
// letter or digit before it ("COVID-19", "B-12") is a hyphen, not a sign.
func firstNumber(s string) (float64, bool) {
	s = strings.ReplaceAll(s, "\u2212", "-")
	loc := number.FindStringIndex(s)
	if loc == nil {
		return 0, false
	}
	m := s[loc[0]:loc[1]]
	if (m[0] == '-' || m[0] == '+') && loc[0] > 0 {
		if r, _ := utf8.DecodeLastRuneInString(s[:loc[0]]); unicode.IsLetter(r) || unicode.IsDigit(r) {
			m = m[1:]
		}
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(m, ",", ""), 64)
	return f, err == nil
}

func urlMatch(ev tasks.Eval, got string) (bool, map[string]any, error) {
	mode := ev.MatchMode()
	d := map[string]any{"mode": mode, "url": got, "want": ev.URL}
	if mode == tasks.ModeRegex {
		re, err := regexp.Compile(ev.URL)
		if err != nil {
			return false, nil, taskInvalid("url_match url %q: %v", ev.URL, err)
		}
		return re.MatchString(got), d, nil
	}
	g, w := normalizeURL(got), normalizeURL(ev.URL)
	switch mode {
	case tasks.ModeExact:
		return g == w, d, nil
	case tasks.ModeContains:
		return strings.Contains(g, w), d, nil
	}
	return hasURLPrefix(g, w), d, nil
}

// hasURLPrefix reports whether the normalised URL g starts with w and
// goes on, if at all, at a boundary: "https://a.com" is a prefix of
// "https://a.com/x" and "https://a.com?q=1", not of "https://a.com.evil.net"
// or "https://a.com:8443"; "https://a.com/item/12" is not a prefix of
// "https://a.com/item/123". A w that ends in a delimiter ("/search?q=")
// may go on with anything.
func hasURLPrefix(g, w string) bool {
	if !strings.HasPrefix(g, w) {
		return false
	}
	rest := g[len(w):]
	if rest == "" || w == "" || strings.ContainsRune("/?#&=", rune(w[len(w)-1])) {
		return true
	}
	return strings.ContainsRune("/?#", rune(rest[0]))
}

// normalizeURL lowers the scheme and host and drops a trailing slash of
// the path, so "HTTPS://Example.com/a/" and "https://example.com/a" agree.
func normalizeURL(s string) string {
	s = strings.TrimSpace(s)
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return strings.TrimSuffix(s, "/")
	}
	u.Scheme = strings.ToLower(u.Scheme)
	u.Host = strings.ToLower(u.Host)
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = strings.TrimSuffix(u.RawPath, "/")
	return strings.TrimSuffix(u.String(), "/")
}

// jsLiteral is v as a JavaScript literal. JSON is a subset of JavaScript
// (json.Marshal escapes U+2028 and U+2029), so a task's strings never
// become code.
func jsLiteral(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // strings and bools always marshal
	}
	return string(b)
}

// maxDOMTexts bounds the element texts a dom_match reports back.
const maxDOMTexts = 10

// DOMExpr is the expression dom_match evaluates: for the elements matching
// selector, {count, matched, texts} — how many there are, how many contain
// text (whitespace-normalised, case-folded unless caseSensitive) and the
// first texts of those. A selector the page rejects gives {error}.
func DOMExpr(selector, text string, caseSensitive bool) string {
	return `(() => {
  const sel = ` + jsLiteral(selector) + `, needle = ` + jsLiteral(normalize(text, caseSensitive)) + `, cs = ` + jsLiteral(caseSensitive) + `;
  const norm = (s) => { s = String(s ?? "").replace(/\s+/g, " ").trim(); return cs ? s : s.toLowerCase(); };
  let els;
  try { els = Array.from(document.querySelectorAll(sel)); } catch (e) { return {error: String((e && e.message) || e)}; }
  const hits = els.map((e) => norm(e.innerText ?? e.textContent)).filter((t) => t.includes(needle));
  return {count: els.length, matched: hits.length, texts: hits.slice(0, ` + strconv.Itoa(maxDOMTexts) + `).map((t) => t.slice(0, 300))};
})()`
}

func domMatch(ctx context.Context, ev tasks.Eval, page Page) (bool, map[string]any, error) {
	raw, err := page.Eval(ctx, DOMExpr(ev.Selector, ev.Text, ev.CaseSensitive))
	if err != nil {
		return false, nil, fmt.Errorf("evaluate dom_match: %w", err)
	}
	var out struct {
		Count   int      `json:"count"`
		Matched int      `json:"matched"`
		Texts   []string `json:"texts"`
		Error   string   `json:"error"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return false, nil, faults.Wrap(err, faults.CodeBrowserProtocol, faults.Internal, faults.Browser, "evaluate dom_match: unexpected page result")
	}
	if out.Error != "" {
		return false, nil, taskInvalid("dom_match selector %q: %s", ev.Selector, out.Error)
	}
	d := map[string]any{"selector": ev.Selector, "text": ev.Text, "count": out.Count, "matched": out.Matched, "texts": out.Texts}
	if ev.Count != nil {
		d["want_count"] = *ev.Count
		return out.Matched == *ev.Count, d, nil
	}
	return out.Matched > 0, d, nil
}

// JSExpr is the expression a js eval runs: the task's script, its value
// awaited when it is a promise (a check that fetches the app's state), with
// an exception or a rejection caught and reported as {error} rather than
// failing the call. The script is the task author's code and is embedded
// as such.
func JSExpr(script string) string {
	return "(async () => {\n  try {\n    return {value: await (\n" + script + "\n)};\n  } catch (e) {\n    return {error: String((e && e.message) || e)};\n  }\n})()"
}

func jsCheck(ctx context.Context, ev tasks.Eval, page Page) (bool, map[string]any, error) {
	raw, err := page.Eval(ctx, JSExpr(ev.Script))
	if err != nil {
		if faults.Is(err, faults.CodeActionInvalid) {
			// The page refused the expression (a syntax error): the
			// task's script is wrong, not the policy, which sent nothing.
			return false, nil, taskInvalid("js script %q: %s", ev.Script, faults.Of(err).Message)
		}
		return false, nil, fmt.Errorf("evaluate js: %w", err)
	}
	var out struct {
		Value json.RawMessage `json:"value"`
		Error string          `json:"error"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return false, nil, faults.Wrap(err, faults.CodeBrowserProtocol, faults.Internal, faults.Browser, "evaluate js: unexpected page result")
	}
	d := map[string]any{"script": ev.Script}
	if out.Error != "" {
		// The page is not in the state the script expects (an element is
		// missing): the check fails, it is not an environment error.
		d["error"] = out.Error
		return false, d, nil
	}
	d["value"] = out.Value
	return string(out.Value) == "true", d, nil
}

// maxExecOutput bounds the stdout and stderr an exec eval reports back:
// enough to see why a check failed, not a whole file.
const maxExecOutput = 2000

func clip(s string) string {
	if len(s) <= maxExecOutput {
		return s
	}
	return s[:maxExecOutput] + "…"
}

func execCheck(ctx context.Context, ev tasks.Eval, sb Sandbox) (bool, map[string]any, error) {
	if len(ev.FailToPass)+len(ev.PassToPass) > 0 {
		return testLists(ctx, ev, sb)
	}
	res, err := sb.Exec(ctx, ev.Command)
	if err != nil {
		return false, nil, fmt.Errorf("evaluate exec: %w", err)
	}
	d := map[string]any{"command": ev.Command, "exit_code": res.ExitCode, "stdout": clip(res.Stdout)}
	if res.Stderr != "" {
		d["stderr"] = clip(res.Stderr)
	}
	if ev.Text != "" {
		d["text"] = ev.Text
	}
	if res.ExitCode != 0 {
		return false, d, nil
	}
	return strings.Contains(normalize(res.Stdout, ev.CaseSensitive), normalize(ev.Text, ev.CaseSensitive)), d, nil
}

// Test verdicts of an exec eval's test lists.
const (
	TestPass = "pass"
	TestFail = "fail"
)

// testLists runs ev's command once per test of FailToPass and PassToPass
// (SWE-bench's FAIL_TO_PASS and PASS_TO_PASS) and passes when all of them
// pass. Details report each test's verdict under "fail_to_pass" and
// "pass_to_pass" ({name: "pass"|"fail"}), the counts, and the output of
// the failed tests (clipped).
func testLists(ctx context.Context, ev tasks.Eval, sb Sandbox) (bool, map[string]any, error) {
	d := map[string]any{"command": ev.Command}
	ok := true
	failed := map[string]any{}
	passed, total := 0, 0
	for _, list := range []struct {
		key   string
		tests []string
	}{{"fail_to_pass", ev.FailToPass}, {"pass_to_pass", ev.PassToPass}} {
		verdicts := map[string]string{}
		for _, name := range list.tests {
			cmd := strings.ReplaceAll(ev.Command, tasks.TestPlaceholder, shellQuote(name))
			res, err := sb.Exec(ctx, cmd)
			if err != nil {
				return false, nil, fmt.Errorf("evaluate exec: test %s: %w", name, err)
			}
			total++
			if res.ExitCode == 0 {
				verdicts[name] = TestPass
				passed++
				continue
			}
			verdicts[name] = TestFail
			ok = false
			failed[name] = map[string]any{"exit_code": res.ExitCode, "output": clip(res.Stdout + res.Stderr)}
		}
		d[list.key] = verdicts
	}
	d["passed"], d["total"] = passed, total
	if len(failed) > 0 {
		d["failed"] = failed
	}
	return ok, d, nil
}

// shellQuote quotes s as one word for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
