package evaluate

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/tasks"
)

// fakePage answers Eval with a fixed result and records the expression.
type fakePage struct {
	url    string
	result string
	err    error
	exprs  []string
}

func (p *fakePage) URL() string { return p.url }

func (p *fakePage) Eval(_ context.Context, expr string) (json.RawMessage, error) {
	p.exprs = append(p.exprs, expr)
	return json.RawMessage(p.result), p.err
}

func intp(n int) *int { return &n }

func TestEvaluate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		ev     tasks.Eval
		answer string
		page   *fakePage
		want   bool
	}{
		{"contains", tasks.Eval{Type: "answer_match", References: []string{"Spinach  Lasagna"}}, "I found\nSPINACH lasagna here", nil, true},
		{"contains miss", tasks.Eval{Type: "answer_match", References: []string{"lasagna"}}, "pizza", nil, false},
		{"contains any", tasks.Eval{Type: "answer_match", References: []string{"x", "pizza"}}, "pizza", nil, true},
		{"empty answer", tasks.Eval{Type: "answer_match", References: []string{"a"}}, "  ", nil, false},
		{"exact", tasks.Eval{Type: "answer_match", Mode: "exact", References: []string{"Hello World"}}, " hello   world ", nil, true},
		{"exact miss", tasks.Eval{Type: "answer_match", Mode: "exact", References: []string{"Hello"}}, "Hello World", nil, false},
		{"case sensitive", tasks.Eval{Type: "answer_match", Mode: "exact", CaseSensitive: true, References: []string{"Hello"}}, "hello", nil, false},
		{"regex", tasks.Eval{Type: "answer_match", Mode: "regex", References: []string{`^\d+ reviews$`}}, "152 Reviews", nil, true},
		{"regex miss", tasks.Eval{Type: "answer_match", Mode: "regex", References: []string{`^\d+ reviews$`}}, "many reviews", nil, false},
		{"numeric", tasks.Eval{Type: "answer_match", Mode: "numeric", References: []string{"1,234.5"}, Tolerance: 0.5}, "about 1234.9 dollars", nil, true},
		{"numeric miss", tasks.Eval{Type: "answer_match", Mode: "numeric", References: []string{"42"}}, "43", nil, false},
		{"numeric none", tasks.Eval{Type: "answer_match", Mode: "numeric", References: []string{"42"}}, "no idea", nil, false},
		{"numeric negative", tasks.Eval{Type: "answer_match", Mode: "numeric", References: []string{"-3"}}, "it is -3 degrees", nil, true},

		{"url prefix", tasks.Eval{Type: "url_match", URL: "https://example.com/a/"}, "", &fakePage{url: "HTTPS://Example.COM/a/b?x=1"}, true},
		{"url prefix slash", tasks.Eval{Type: "url_match", URL: "https://example.com/about"}, "", &fakePage{url: "https://example.com/about/"}, true},
		{"url prefix miss", tasks.Eval{Type: "url_match", URL: "https://example.com/a"}, "", &fakePage{url: "https://example.org/a"}, false},
		{"url exact", tasks.Eval{Type: "url_match", Mode: "exact", URL: "https://example.com/"}, "", &fakePage{url: "https://EXAMPLE.com"}, true},
		{"url exact miss", tasks.Eval{Type: "url_match", Mode: "exact", URL: "https://example.com/"}, "", &fakePage{url: "https://example.com/x"}, false},
		{"url contains", tasks.Eval{Type: "url_match", Mode: "contains", URL: "q=shoes"}, "", &fakePage{url: "https://shop.com/s?q=shoes&p=2"}, true},
		{"url regex", tasks.Eval{Type: "url_match", Mode: "regex", URL: `/item/\d+$`}, "", &fakePage{url: "https://shop.com/item/77"}, true},
		{"url regex miss", tasks.Eval{Type: "url_match", Mode: "regex", URL: `/item/\d+$`}, "", &fakePage{url: "https://shop.com/item/x"}, false},

		{"dom any", tasks.Eval{Type: "dom_match", Selector: "#done", Text: "Thanks"}, "", &fakePage{result: `{"count":1,"matched":1,"texts":["thanks!"]}`}, true},
		{"dom none", tasks.Eval{Type: "dom_match", Selector: "#done", Text: "Thanks"}, "", &fakePage{result: `{"count":1,"matched":0,"texts":[]}`}, false},
		{"dom count", tasks.Eval{Type: "dom_match", Selector: "li", Count: intp(3)}, "", &fakePage{result: `{"count":3,"matched":3}`}, true},
		{"dom count miss", tasks.Eval{Type: "dom_match", Selector: "li", Count: intp(3)}, "", &fakePage{result: `{"count":4,"matched":4}`}, false},
		{"dom count zero", tasks.Eval{Type: "dom_match", Selector: ".error", Count: intp(0)}, "", &fakePage{result: `{"count":0,"matched":0}`}, true},

		{"js true", tasks.Eval{Type: "js", Script: "document.title === 'Done'"}, "", &fakePage{result: `{"value":true}`}, true},
		{"js false", tasks.Eval{Type: "js", Script: "document.title === 'Done'"}, "", &fakePage{result: `{"value":false}`}, false},
		{"js truthy is not true", tasks.Eval{Type: "js", Script: "1"}, "", &fakePage{result: `{"value":1}`}, false},
		{"js throws", tasks.Eval{Type: "js", Script: "document.querySelector('#x').checked"}, "", &fakePage{result: `{"error":"Cannot read properties of null"}`}, false},
	}
	var e Evaluator
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var page Page
			if tt.page != nil {
				page = tt.page
			}
			r, err := e.Evaluate(context.Background(), tt.ev, Trajectory{Answer: tt.answer}, Env{Page: page})
			if err != nil {
				t.Fatal(err)
			}
			if r.Success != tt.want || r.Type != tt.ev.Type || (r.Reward == 1) != tt.want {
				t.Errorf("result = %+v, want success %v", r, tt.want)
			}
			if r.Details == nil {
				t.Error("no details")
			}
		})
	}
}

func TestEvaluateErrors(t *testing.T) {
	t.Parallel()
	crashed := faults.New(faults.CodeBrowserCrashed, faults.Unavailable, faults.Browser, "browser crashed")
	tests := []struct {
		name string
		ev   tasks.Eval
		page Page
		code string
	}{
		{"unknown type", tasks.Eval{Type: "vibes"}, nil, faults.CodeTaskInvalid},
		{"bad regex", tasks.Eval{Type: "answer_match", Mode: "regex", References: []string{"("}}, nil, faults.CodeTaskInvalid},
		{"url no page", tasks.Eval{Type: "url_match", URL: "https://e.com"}, nil, faults.CodeTaskInvalid},
		{"dom no page", tasks.Eval{Type: "dom_match", Selector: "a"}, nil, faults.CodeTaskInvalid},
		{"js no page", tasks.Eval{Type: "js", Script: "true"}, nil, faults.CodeTaskInvalid},
		{"dom bad selector", tasks.Eval{Type: "dom_match", Selector: "a[[["}, &fakePage{result: `{"error":"not a valid selector"}`}, faults.CodeTaskInvalid},
		{"dom page crashed", tasks.Eval{Type: "dom_match", Selector: "a"}, &fakePage{err: crashed}, faults.CodeBrowserCrashed},
		{"js page crashed", tasks.Eval{Type: "js", Script: "true"}, &fakePage{err: crashed}, faults.CodeBrowserCrashed},
		{"judge not configured", tasks.Eval{Type: "judge"}, nil, faults.CodeJudgeFailed},
	}
	var e Evaluator
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := e.Evaluate(context.Background(), tt.ev, Trajectory{Answer: "x"}, Env{Page: tt.page})
			if !faults.Is(err, tt.code) {
				t.Errorf("err = %v (%+v), want %s", err, faults.Of(err), tt.code)
			}
		})
	}
}

// TestDOMExprQuotes checks that a selector and text are embedded only as
// JSON string literals, whatever they hold.
func TestDOMExprQuotes(t *testing.T) {
	t.Parallel()
	sel := `a[title="x"]'); alert(1); //` + "\u2028"
	text := "</script>\"`${x}`"
	expr := DOMExpr(sel, text, true)
	selLit, _ := json.Marshal(sel)
	textLit, _ := json.Marshal(text)
	if !strings.Contains(expr, "const sel = "+string(selLit)+",") || !strings.Contains(expr, "needle = "+string(textLit)+",") {
		t.Errorf("literals not embedded as JSON:\n%s", expr)
	}
	if strings.Contains(expr, "\u2028") || strings.Count(expr, "alert(1)") != 1 {
		t.Errorf("raw text leaked into the expression:\n%s", expr)
	}
	// Case-folding normalises the needle before it is embedded.
	if !strings.Contains(DOMExpr("p", "  Hello\n World ", false), `needle = "hello world"`) {
		t.Error("needle not normalised")
	}
}

func TestJSExprWrapsScript(t *testing.T) {
	t.Parallel()
	p := &fakePage{result: `{"value":true}`}
	var e Evaluator
	if _, err := e.Evaluate(context.Background(), tasks.Eval{Type: "js", Script: "x // comment"}, Trajectory{}, Env{Page: p}); err != nil {
		t.Fatal(err)
	}
	if len(p.exprs) != 1 || !strings.Contains(p.exprs[0], "x // comment\n)") || !strings.Contains(p.exprs[0], "catch (e)") {
		t.Errorf("expr = %q", p.exprs)
	}
}

// fakeSandbox answers Exec with a fixed result and records the command.
type fakeSandbox struct {
	res  ExecResult
	err  error
	cmds []string
}

func (f *fakeSandbox) Exec(_ context.Context, command string) (ExecResult, error) {
	f.cmds = append(f.cmds, command)
	return f.res, f.err
}

func TestEvaluateExec(t *testing.T) {
	t.Parallel()
	gone := faults.New(faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "the sandbox's agent did not answer")
	tests := []struct {
		name string
		ev   tasks.Eval
		sb   *fakeSandbox // nil: no sandbox
		want bool
		code string // the error's code, when no verdict
	}{
		{"exit 0", tasks.Eval{Type: "exec", Command: "test -s /tmp/out.txt"}, &fakeSandbox{}, true, ""},
		{"exit 1", tasks.Eval{Type: "exec", Command: "test -s /tmp/out.txt"}, &fakeSandbox{res: ExecResult{ExitCode: 1}}, false, ""},
		{"killed", tasks.Eval{Type: "exec", Command: "sleep 1000"}, &fakeSandbox{res: ExecResult{ExitCode: -1}}, false, ""},
		{"text", tasks.Eval{Type: "exec", Command: "cat /tmp/out.txt", Text: "Hello  World"}, &fakeSandbox{res: ExecResult{Stdout: "say hello\nworld!\n"}}, true, ""},
		{"text miss", tasks.Eval{Type: "exec", Command: "cat /tmp/out.txt", Text: "hello"}, &fakeSandbox{res: ExecResult{Stdout: "goodbye\n"}}, false, ""},
		{"text case sensitive", tasks.Eval{Type: "exec", Command: "cat /tmp/out.txt", Text: "Hello", CaseSensitive: true}, &fakeSandbox{res: ExecResult{Stdout: "hello"}}, false, ""},
		{"text but exit 2", tasks.Eval{Type: "exec", Command: "grep -r hello /tmp", Text: "hello"}, &fakeSandbox{res: ExecResult{ExitCode: 2, Stdout: "hello", Stderr: "grep: /tmp/x: Permission denied"}}, false, ""},
		{"no command", tasks.Eval{Type: "exec", Text: "x"}, &fakeSandbox{}, false, faults.CodeTaskInvalid},
		{"no sandbox", tasks.Eval{Type: "exec", Command: "true"}, nil, false, faults.CodeTaskInvalid},
		{"sandbox gone", tasks.Eval{Type: "exec", Command: "true"}, &fakeSandbox{err: gone}, false, faults.CodeAgentUnreachable},
	}
	var e Evaluator
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var env Env
			if tt.sb != nil {
				env.Sandbox = tt.sb
			}
			r, err := e.Evaluate(context.Background(), tt.ev, Trajectory{}, env)
			if tt.code != "" {
				if !faults.Is(err, tt.code) {
					t.Fatalf("err = %v (%+v), want %s", err, faults.Of(err), tt.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Success != tt.want || r.Type != "exec" || (r.Reward == 1) != tt.want {
				t.Errorf("result = %+v, want success %v", r, tt.want)
			}
			if len(tt.sb.cmds) != 1 || tt.sb.cmds[0] != tt.ev.Command {
				t.Errorf("ran %q, want %q", tt.sb.cmds, tt.ev.Command)
			}
			if r.Details["command"] != tt.ev.Command || r.Details["exit_code"] != tt.sb.res.ExitCode {
				t.Errorf("details = %v", r.Details)
			}
		})
	}
}

// scriptSandbox exits 0 for the commands in pass, 1 for any other.
type scriptSandbox struct{ pass map[string]bool }

func (s scriptSandbox) Exec(_ context.Context, command string) (ExecResult, error) {
	if s.pass[command] {
		return ExecResult{}, nil
	}
	return ExecResult{ExitCode: 1, Stdout: "FAILED " + command}, nil
}

func TestExecTestLists(t *testing.T) {
	t.Parallel()
	ev := tasks.Eval{Type: "exec", Command: "run {test}", FailToPass: []string{"a", "it's"}, PassToPass: []string{"b"}}
	tests := []struct {
		name string
		pass []string
		ok   bool
		f2p  map[string]string
		p2p  map[string]string
	}{
		{"all pass", []string{"run 'a'", `run 'it'\''s'`, "run 'b'"}, true, map[string]string{"a": "pass", "it's": "pass"}, map[string]string{"b": "pass"}},
		{"fix missing", []string{"run 'b'"}, false, map[string]string{"a": "fail", "it's": "fail"}, map[string]string{"b": "pass"}},
		{"regression", []string{"run 'a'", `run 'it'\''s'`}, false, map[string]string{"a": "pass", "it's": "pass"}, map[string]string{"b": "fail"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pass := map[string]bool{}
			for _, c := range tt.pass {
				pass[c] = true
			}
			var e Evaluator
			res, err := e.Evaluate(context.Background(), ev, Trajectory{}, Env{Sandbox: scriptSandbox{pass}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Success != tt.ok {
				t.Errorf("success = %v, want %v (%v)", res.Success, tt.ok, res.Details)
			}
			if got := res.Details["fail_to_pass"]; !reflect.DeepEqual(got, tt.f2p) {
				t.Errorf("fail_to_pass = %v, want %v", got, tt.f2p)
			}
			if got := res.Details["pass_to_pass"]; !reflect.DeepEqual(got, tt.p2p) {
				t.Errorf("pass_to_pass = %v, want %v", got, tt.p2p)
			}
		})
	}
}
