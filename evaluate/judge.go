package evaluate

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/retry"
	"github.com/orchard/orchard/tasks"
)

const (
	// DefaultJudgeTimeout bounds one judge call: a vision model reading a
	// few screenshots answers within tens of seconds; longer is a hang.
	DefaultJudgeTimeout = 90 * time.Second
	// DefaultJudgeAttempts tries each judge call three times: overloaded
	// endpoints (429, 5xx) usually recover within that.
	DefaultJudgeAttempts = 3
	// DefaultMaxScreenshots is how many of the last screenshots the
	// verdict call sees: enough to show the final state and how it was
	// reached, few enough to stay within a vision model's context.
	DefaultMaxScreenshots = 3
	// DefaultJudgeBackoff caps the wait before the second attempt.
	DefaultJudgeBackoff = time.Second
	// maxJudgeReply bounds a judge response body.
	maxJudgeReply = 4 << 20
)

// Verdicts.
const (
	VerdictSuccess = "SUCCESS"
	VerdictFailure = "FAILURE"
)

// JudgeConfig points at an OpenAI-compatible chat completions endpoint.
type JudgeConfig struct {
	URL    string // base URL; requests go to URL + "/chat/completions"
	Model  string
	APIKey string // sent as a bearer token when set
	// Timeout bounds each call attempt; 0 means DefaultJudgeTimeout.
	Timeout time.Duration
	// Attempts per call; 0 means DefaultJudgeAttempts.
	Attempts int
	// MaxScreenshots is how many of the last screenshots are attached; 0
	// means DefaultMaxScreenshots, negative none.
	MaxScreenshots int
	// Backoff caps the wait before the second attempt; 0 means
	// DefaultJudgeBackoff.
	Backoff    time.Duration
	HTTPClient *http.Client // nil means http.DefaultClient
}

// JudgeVerdict is what the judge decided, with its raw replies kept for
// audit (api.JudgeVerdict; Verdict is VerdictSuccess or VerdictFailure).
type JudgeVerdict = api.JudgeVerdict

func judgeFailed(err error, format string, args ...any) *faults.Error {
	msg := fmt.Sprintf("judge: "+format, args...)
	if err == nil {
		return faults.New(faults.CodeJudgeFailed, faults.Unavailable, faults.Platform, msg)
	}
	return faults.Wrap(err, faults.CodeJudgeFailed, faults.Unavailable, faults.Platform, msg)
}

const keyPointsPrompt = `You are an expert tasked with analyzing a given task to identify the key points explicitly stated in the task description.

**Objective**: Carefully analyze the task description and extract the critical elements explicitly mentioned in the task for achieving its goal.

**Instructions**:
1. Read the task description carefully.
2. Identify and extract **key points** directly stated in the task description.
   - A **key point** is a critical element, condition, or step explicitly mentioned in the task description.
   - Do not infer or add any unstated elements.
   - Words such as "best", "highest", "cheapest", "latest", "most recent", "lowest", "closest", "highest-rated", "largest", and "newest" must go through the sort function (e.g., the key point should be "Filter by highest").

**Respond with**:
- **Key Points**: A numbered list of the explicit key points for completing this task, one per line, and nothing else.`

const verdictPrompt = `You are an expert in evaluating the performance of a web navigation agent. The agent is designed to help a human user navigate a website to complete a task. Given the user's task, the key points for task completion, the agent's action history, its final answer and screenshots of the last pages it saw, your goal is to determine whether the agent has completed the task and achieved all requirements.

Your response must strictly follow the following evaluation criteria!
*Important Evaluation Criteria*:
1: The filtered results must be displayed correctly. If filters were not properly applied (i.e., missing selection, missing confirmation, or no visible effect in results), the task is not considered successful.
2: You must carefully check whether the screenshots and the action history confirm each key point. Only actions that visibly took effect count.
3: If the task requires a specific range of values, the applied filter must match it exactly.
4: If the final answer is not supported by the screenshots or the action history, the task is not successful.
5: If the agent did not reach the required final state, or the task could not be completed, it is not successful.

Explain your reasoning briefly, then end your response with a last line of exactly "Status: SUCCESS" or "Status: FAILURE".`

// Ready reports, before an episode starts, why ev cannot be evaluated
// here: a judge eval needs a judge with a URL and a model. Finding that
// out at finish would cost the whole episode.
func (e *Evaluator) Ready(ev tasks.Eval) error {
	if c := e.Judge; ev.Type == tasks.EvalJudge && (c == nil || c.URL == "" || c.Model == "") {
		return faults.New(faults.CodeJudgeFailed, faults.NotImplemented, faults.Platform,
			"judge: the task's eval is judge, and this server has no judge configured (JUDGE_URL and JUDGE_MODEL)").WithRetryable(false)
	}
	return nil
}

// judge runs the two WebJudge calls: key points from the task, then a
// verdict on the trajectory.
func (c *JudgeConfig) judge(ctx context.Context, ev tasks.Eval, tr Trajectory) (*JudgeVerdict, error) {
	if c == nil || c.URL == "" || c.Model == "" {
		return nil, judgeFailed(nil, "no judge is configured (URL and model)").WithRetryable(false)
	}
	v := &JudgeVerdict{}
	// Call 1: key points.
	kp := []message{
		{Role: "system", Content: keyPointsPrompt},
		{Role: "user", Content: "Task: " + tr.Question},
	}
	_, err := c.call(ctx, kp, func(reply string) error {
		v.Raw = append(v.Raw, reply)
		pts := parseKeyPoints(reply)
		if len(pts) == 0 {
			return judgeFailed(nil, "key points reply lists none")
		}
		v.KeyPoints = pts
		return nil
	})
	if err != nil {
		return nil, err
	}

	// Call 2: the verdict.
	var text strings.Builder
	fmt.Fprintf(&text, "User Task: %s\n\nKey Points:\n", tr.Question)
	for i, p := range v.KeyPoints {
		fmt.Fprintf(&text, "%d. %s\n", i+1, p)
	}
	if ev.Criteria != "" {
		fmt.Fprintf(&text, "\nAdditional criteria: %s\n", ev.Criteria)
	}
	if tr.StartURL != "" {
		fmt.Fprintf(&text, "\nStart URL: %s\n", tr.StartURL)
	}
	text.WriteString("\nAction History:\n")
	if len(tr.Steps) == 0 {
		text.WriteString("(no actions)\n")
	}
	for _, s := range tr.Steps {
		fmt.Fprintf(&text, "%d. %s", s.N, compactJSON(s.Action))
		if s.URL != "" {
			fmt.Fprintf(&text, " (at %s)", s.URL)
		}
		if s.Error != "" {
			fmt.Fprintf(&text, " [error: %s]", s.Error)
		}
		if s.Output != "" {
			fmt.Fprintf(&text, "\n   → %s", strings.ReplaceAll(s.Output, "\n", "\n     "))
		}
		text.WriteString("\n")
	}
	answer := tr.Answer
	if strings.TrimSpace(answer) == "" {
		answer = "(none)"
	}
	fmt.Fprintf(&text, "\nFinal Answer: %s\n", answer)
	shots := c.lastScreenshots(tr.Screenshots)
	if len(shots) > 0 {
		fmt.Fprintf(&text, "\nThe last %d screenshots follow, oldest first.\n", len(shots))
	}
	parts := []contentPart{{Type: "text", Text: text.String()}}
	for _, b := range shots {
		parts = append(parts, contentPart{Type: "image_url", ImageURL: &imageURL{URL: dataURL(b)}})
	}
	vm := []message{
		{Role: "system", Content: verdictPrompt},
		{Role: "user", Content: parts},
	}
	_, err = c.call(ctx, vm, func(reply string) error {
		v.Raw = append(v.Raw, reply)
		verdict, ok := parseVerdict(reply)
		if !ok {
			return judgeFailed(nil, "verdict reply ends in neither SUCCESS nor FAILURE")
		}
		v.Verdict = verdict
		return nil
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (c *JudgeConfig) lastScreenshots(all [][]byte) [][]byte {
	n := c.MaxScreenshots
	if n == 0 {
		n = DefaultMaxScreenshots
	}
	if n < 0 {
		return nil
	}
	if len(all) > n {
		all = all[len(all)-n:]
	}
	return all
}

func dataURL(b []byte) string {
	mime := http.DetectContentType(b)
	if mime != "image/png" && mime != "image/webp" && mime != "image/gif" {
		mime = "image/jpeg"
	}
	return "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(b)
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

type message struct {
	Role    string `json:"role"`
	Content any    `json:"content"` // a string or []contentPart
}

type contentPart struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL string `json:"url"`
}

// call posts one chat completion under the retry policy and hands each
// reply to accept, which may refuse it with a retryable judge failure (a
// reply that cannot be parsed is asked for again).
func (c *JudgeConfig) call(ctx context.Context, msgs []message, accept func(reply string) error) (string, error) {
	body, err := json.Marshal(map[string]any{"model": c.Model, "messages": msgs})
	if err != nil {
		return "", judgeFailed(err, "encode request")
	}
	p := retry.Policy{
		Attempts:   c.Attempts,
		PerAttempt: c.Timeout,
		Initial:    c.Backoff,
		Max:        30 * time.Second,
	}
	if p.Attempts == 0 {
		p.Attempts = DefaultJudgeAttempts
	}
	if p.PerAttempt == 0 {
		p.PerAttempt = DefaultJudgeTimeout
	}
	if p.Initial == 0 {
		p.Initial = DefaultJudgeBackoff
	}
	reply, _, err := retry.DoValue(ctx, p, func(ctx context.Context, _ int) (string, error) {
		reply, err := c.post(ctx, body)
		if err != nil {
			return "", err
		}
		return reply, accept(reply)
	})
	if err != nil && !faults.Is(err, faults.CodeJudgeFailed) && !errors.Is(ctx.Err(), context.Canceled) {
		// A timeout the retry loop classified as a platform timeout is
		// still the judge's failure; only the caller canceling is not.
		return "", judgeFailed(err, "no reply")
	}
	return reply, err
}

func (c *JudgeConfig) post(ctx context.Context, body []byte) (string, error) {
	endpoint := strings.TrimSuffix(c.URL, "/") + "/chat/completions"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return "", judgeFailed(err, "build request").WithRetryable(false)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	hc := c.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			// Let the retry loop give it the class of the deadline's cause.
			return "", err
		}
		return "", judgeFailed(err, "request failed")
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJudgeReply))
	if err != nil {
		return "", judgeFailed(err, "read reply")
	}
	if resp.StatusCode != http.StatusOK {
		retryable := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
		return "", judgeFailed(errors.New(snippet(data)), "endpoint answered HTTP %d", resp.StatusCode).WithRetryable(retryable)
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content json.RawMessage `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &out); err != nil || len(out.Choices) == 0 {
		return "", judgeFailed(errors.New(snippet(data)), "reply is not a chat completion")
	}
	return contentText(out.Choices[0].Message.Content), nil
}

// contentText reads a message content given as a string or as parts.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []contentPart
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

var (
	listMarker  = regexp.MustCompile(`^\s*(?:[-*•]|\d+[.)]|\(\d+\))\s*`)
	fence       = regexp.MustCompile("(?s)```(?:json)?\\s*(.*?)```")
	keyPointsHd = regexp.MustCompile(`(?i)^\**\s*key\s*points\s*\**\s*:?\s*\**\s*`)
)

// parseKeyPoints reads a key-points reply: a JSON list (maybe fenced), or
// lines, numbered or bulleted, after an optional "Key Points:" heading.
func parseKeyPoints(reply string) []string {
	s := strings.TrimSpace(reply)
	if m := fence.FindStringSubmatch(s); m != nil {
		s = strings.TrimSpace(m[1])
	}
	var list []string
	if json.Unmarshal([]byte(s), &list) == nil {
		return clean(list)
	}
	var obj struct {
		KeyPoints []string `json:"key_points"`
	}
	if json.Unmarshal([]byte(s), &obj) == nil && len(obj.KeyPoints) > 0 {
		return clean(obj.KeyPoints)
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if keyPointsHd.MatchString(l) {
			lines = lines[i:]
			lines[0] = keyPointsHd.ReplaceAllString(l, "")
			break
		}
	}
	for i, l := range lines {
		lines[i] = strings.Trim(listMarker.ReplaceAllString(l, ""), " *")
	}
	return clean(lines)
}

func clean(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

var verdictWord = regexp.MustCompile(`\b(NOT\s+SUCCESS(?:FUL)?|UNSUCCESSFUL|SUCCESS(?:FUL)?|FAILURE|FAILED|FAIL)\b`)

// statusLabel is the "Status:" label a verdict reply ends with, at the
// start of a line, maybe in markdown emphasis.
var statusLabel = regexp.MustCompile(`(?im)^[\s*_#>-]*status[\s*_]*:`)

// parseVerdict reads the verdict from a reply: the first verdict word
// after the last "Status:" label if there is one (a note after it does not
// count), else the last verdict word of the reply.
func parseVerdict(reply string) (string, bool) {
	up := strings.ToUpper(reply)
	var w string
	if locs := statusLabel.FindAllStringIndex(up, -1); len(locs) > 0 {
		w = verdictWord.FindString(up[locs[len(locs)-1][1]:])
	}
	if w == "" {
		ms := verdictWord.FindAllString(up, -1)
		if len(ms) == 0 {
			return "", false
		}
		w = ms[len(ms)-1]
	}
	if strings.HasPrefix(w, "SUCCESS") {
		return VerdictSuccess, true
	}
	return VerdictFailure, true
}
