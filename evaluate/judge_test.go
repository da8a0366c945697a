package evaluate

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/tasks"
)

var (
	pngShot  = []byte("\x89PNG\r\n\x1a\n0000shot-png")
	jpegShot = []byte("\xff\xd8\xff\xe0shot-jpeg")
)

type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// judgeServer is an OpenAI-compatible endpoint; reply answers each
// request, numbered from 1.
type judgeServer struct {
	t     *testing.T
	mu    sync.Mutex // guards reqs
	reqs  []chatRequest
	calls atomic.Int32
	reply func(n int, req chatRequest) (status int, content string)
}

func (s *judgeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		s.t.Errorf("request %s %s", r.Method, r.URL.Path)
	}
	if got := r.Header.Get("Authorization"); got != "Bearer sk-test" {
		s.t.Errorf("Authorization = %q", got)
	}
	var req chatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		s.t.Errorf("decode request: %v", err)
	}
	if req.Model != "judge-model" {
		s.t.Errorf("model = %q", req.Model)
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	status, content := s.reply(int(s.calls.Add(1)), req)
	if status != http.StatusOK {
		http.Error(w, `{"error":{"message":"overloaded"}}`, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"choices": []any{map[string]any{"message": map[string]any{"role": "assistant", "content": content}}},
	})
}

func newJudge(t *testing.T, reply func(n int, req chatRequest) (int, string)) (*judgeServer, *Evaluator) {
	s := &judgeServer{t: t, reply: reply}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, &Evaluator{Judge: &JudgeConfig{
		URL: srv.URL + "/v1", Model: "judge-model", APIKey: "sk-test",
		Timeout: 2 * time.Second, Attempts: 3, MaxScreenshots: 2, Backoff: time.Millisecond,
		HTTPClient: srv.Client(),
	}}
}

// isVerdictCall tells the two calls apart by their user content: only the
// verdict call sends parts.
func isVerdictCall(req chatRequest) bool {
	return len(req.Messages) == 2 && strings.HasPrefix(strings.TrimSpace(string(req.Messages[1].Content)), "[")
}

var judgeTraj = Trajectory{
	Question: "Find the price of the cheapest red shoe.",
	Answer:   "The cheapest red shoe costs $19.99.",
	StartURL: "https://shop.example/",
	Steps: []Step{
		{N: 1, Action: json.RawMessage(`{"type": "click", "element": 12}`), URL: "https://shop.example/"},
		{N: 2, Action: json.RawMessage(`{"type":"type","text":"red shoe"}`), URL: "https://shop.example/search", Error: "element detached"},
	},
	Screenshots: [][]byte{[]byte("old-one-dropped"), pngShot, jpegShot},
}

func TestJudge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		keyPoints string
		verdict   string
		want      bool
		points    []string
	}{
		{"success", "**Key Points**:\n1. Red shoe\n2. Sort by lowest price", "The filter was applied.\nStatus: SUCCESS", true, []string{"Red shoe", "Sort by lowest price"}},
		{"failure", `["red shoe", "cheapest"]`, "Price not shown.\n\nStatus: FAILURE", false, []string{"red shoe", "cheapest"}},
		{"not success", "- red shoe\n- cheapest", "The agent did not sort. NOT SUCCESS", false, []string{"red shoe", "cheapest"}},
		{"fenced json, bold status", "```json\n[\"red shoe\"]\n```", "Everything checks out. **Status:** success", true, []string{"red shoe"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, e := newJudge(t, func(n int, req chatRequest) (int, string) {
				if isVerdictCall(req) {
					return http.StatusOK, tt.verdict
				}
				return http.StatusOK, tt.keyPoints
			})
			r, err := e.Evaluate(context.Background(), tasks.Eval{Type: "judge", Criteria: "Prices must include cents."}, judgeTraj, Env{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Success != tt.want || r.Type != "judge" || (r.Reward == 1) != tt.want {
				t.Errorf("result = %+v", r)
			}
			v := r.Judge
			if v == nil || strings.Join(v.KeyPoints, "|") != strings.Join(tt.points, "|") || len(v.Raw) != 2 || v.Raw[1] != tt.verdict {
				t.Fatalf("verdict = %+v", v)
			}
			if s.calls.Load() != 2 {
				t.Fatalf("%d calls, want 2", s.calls.Load())
			}

			// Call 1 carries the task; call 2 the task, key points,
			// answer, actions and the last two screenshots as data URLs.
			if kp := string(s.reqs[0].Messages[1].Content); !strings.Contains(kp, "cheapest red shoe") {
				t.Errorf("key points call lacks the question: %s", kp)
			}
			var parts []contentPart
			if err := json.Unmarshal(s.reqs[1].Messages[1].Content, &parts); err != nil {
				t.Fatal(err)
			}
			text := parts[0].Text
			for _, want := range []string{judgeTraj.Question, judgeTraj.Answer, tt.points[0], `{"type":"click","element":12}`, "element detached", "Prices must include cents."} {
				if !strings.Contains(text, want) {
					t.Errorf("verdict prompt lacks %q:\n%s", want, text)
				}
			}
			var imgs []string
			for _, p := range parts[1:] {
				if p.Type == "image_url" && p.ImageURL != nil {
					imgs = append(imgs, p.ImageURL.URL)
				}
			}
			want := []string{
				"data:image/png;base64," + base64.StdEncoding.EncodeToString(pngShot),
				"data:image/jpeg;base64," + base64.StdEncoding.EncodeToString(jpegShot),
			}
			if strings.Join(imgs, " ") != strings.Join(want, " ") {
				t.Errorf("images = %q, want %q", imgs, want)
			}
		})
	}
}

func TestJudgeRetries(t *testing.T) {
	t.Parallel()
	_, e := newJudge(t, func(n int, req chatRequest) (int, string) {
		if n <= 2 {
			return http.StatusInternalServerError, ""
		}
		if isVerdictCall(req) {
			return http.StatusOK, "Status: SUCCESS"
		}
		return http.StatusOK, "1. red shoe"
	})
	r, err := e.Evaluate(context.Background(), tasks.Eval{Type: "judge"}, judgeTraj, Env{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Success {
		t.Errorf("result = %+v", r)
	}
}

func TestJudgeFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		reply     func(n int, req chatRequest) (int, string)
		calls     int32
		retryable bool
	}{
		{"garbage verdict", func(n int, req chatRequest) (int, string) {
			if isVerdictCall(req) {
				return http.StatusOK, "I cannot tell from these images."
			}
			return http.StatusOK, "1. red shoe"
		}, 1 + 3, true},
		{"always 503", func(int, chatRequest) (int, string) { return http.StatusServiceUnavailable, "" }, 3, true},
		{"429", func(int, chatRequest) (int, string) { return http.StatusTooManyRequests, "" }, 3, true},
		{"401 not retried", func(int, chatRequest) (int, string) { return http.StatusUnauthorized, "" }, 1, false},
		{"no key points", func(int, chatRequest) (int, string) { return http.StatusOK, "  \n " }, 3, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, e := newJudge(t, tt.reply)
			_, err := e.Evaluate(context.Background(), tasks.Eval{Type: "judge"}, judgeTraj, Env{})
			checkJudgeFailed(t, err, tt.retryable)
			if got := s.calls.Load(); got != tt.calls {
				t.Errorf("%d calls, want %d", got, tt.calls)
			}
		})
	}
}

func TestJudgeServerDown(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	e := &Evaluator{Judge: &JudgeConfig{URL: url, Model: "m", Attempts: 2, Backoff: time.Millisecond}}
	_, err := e.Evaluate(context.Background(), tasks.Eval{Type: "judge"}, judgeTraj, Env{})
	checkJudgeFailed(t, err, true)
}

func TestJudgeTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	e := &Evaluator{Judge: &JudgeConfig{URL: srv.URL, Model: "m", Attempts: 2, Timeout: 50 * time.Millisecond, Backoff: time.Millisecond}}
	_, err := e.Evaluate(context.Background(), tasks.Eval{Type: "judge"}, judgeTraj, Env{})
	checkJudgeFailed(t, err, true)
}

func checkJudgeFailed(t *testing.T, err error, retryable bool) {
	t.Helper()
	f := faults.Of(err)
	if f == nil || f.Code != faults.CodeJudgeFailed || f.Source != faults.Platform || f.Category != faults.Unavailable || f.Retryable != retryable {
		t.Errorf("err = %v, class %+v; want platform.judge_failed retryable=%v", err, f, retryable)
	}
}

func TestParseVerdict(t *testing.T) {
	t.Parallel()
	tests := []struct {
		reply, want string
		ok          bool
	}{
		{"Status: SUCCESS", VerdictSuccess, true},
		{"Thoughts: it failed at first but then succeeded.\nStatus: \"success\"", VerdictSuccess, true},
		{"Some SUCCESS in the middle.\nStatus: FAILURE", VerdictFailure, true},
		{"NOT SUCCESS", VerdictFailure, true},
		{"The task was successful", VerdictSuccess, true},
		{"unsure", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		got, ok := parseVerdict(tt.reply)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseVerdict(%q) = %q, %v; want %q, %v", tt.reply, got, ok, tt.want, tt.ok)
		}
	}
}

// A shell episode's judge reads each command's result from the
// trajectory: there are no screenshots.
func TestJudgeShellOutput(t *testing.T) {
	t.Parallel()
	s, e := newJudge(t, func(n int, req chatRequest) (int, string) {
		if isVerdictCall(req) {
			return http.StatusOK, "Status: SUCCESS"
		}
		return http.StatusOK, `["tests pass"]`
	})
	tr := Trajectory{Question: "Fix add.", Steps: []Step{
		{N: 1, Action: json.RawMessage(`{"type":"exec","command":"pytest -x"}`), Output: "exit 1: FAILED test_add\n1 failed"},
		{N: 2, Action: json.RawMessage(`{"type":"submit"}`), Output: "exit 0"},
	}}
	if _, err := e.Evaluate(context.Background(), tasks.Eval{Type: "judge"}, tr, Env{}); err != nil {
		t.Fatal(err)
	}
	var parts []contentPart
	if err := json.Unmarshal(s.reqs[1].Messages[1].Content, &parts); err != nil {
		t.Fatal(err)
	}
	if text := parts[0].Text; !strings.Contains(text, "→ exit 1: FAILED test_add\n     1 failed") || len(parts) != 1 {
		t.Errorf("verdict prompt:\n%s", text)
	}
}
