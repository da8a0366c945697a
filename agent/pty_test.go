package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// ptyClient drives one PTY session the way the SDK does.
type ptyClient struct {
	t    *testing.T
	conn *websocket.Conn
	out  strings.Builder
}

// serverFrame is any frame the agent sends.
type serverFrame struct {
	Type    string `json:"type"`
	PID     int    `json:"pid"`
	Data    []byte `json:"data"`
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (a *testAgent) pty(t *testing.T) *ptyClient {
	t.Helper()
	conn, resp, err := a.DialPTY(context.Background(), nil)
	if err != nil {
		t.Fatalf("DialPTY: %v", err)
	}
	resp.Body.Close()
	t.Cleanup(func() { conn.Close() })
	return &ptyClient{t: t, conn: conn}
}

func (p *ptyClient) send(v any) {
	p.t.Helper()
	if err := p.conn.WriteJSON(v); err != nil {
		p.t.Fatalf("send: %v", err)
	}
}

func (p *ptyClient) init(cmd []string, extra map[string]any) {
	m := map[string]any{"type": "init", "cmd": cmd, "env": map[string]string{}, "cwd": nil, "rows": 24, "cols": 80, "login_shell": false}
	for k, v := range extra {
		m[k] = v
	}
	p.send(m)
}

// next reads the next frame; stdout frames are also collected in out.
func (p *ptyClient) next() serverFrame {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	_, b, err := p.conn.ReadMessage()
	if err != nil {
		p.t.Fatalf("read frame (output so far %q): %v", p.out.String(), err)
	}
	var f serverFrame
	if err := json.Unmarshal(b, &f); err != nil {
		p.t.Fatalf("frame %q: %v", b, err)
	}
	if f.Type == "stdout" {
		p.out.Write(f.Data)
	}
	return f
}

func (p *ptyClient) ready() int {
	p.t.Helper()
	f := p.next()
	if f.Type != "ready" {
		p.t.Fatalf("first frame = %+v, want ready", f)
	}
	return f.PID
}

// until reads frames until output contains s.
func (p *ptyClient) until(s string) {
	p.t.Helper()
	for !strings.Contains(p.out.String(), s) {
		if f := p.next(); f.Type != "stdout" {
			p.t.Fatalf("frame %+v before output %q (got %q)", f, s, p.out.String())
		}
	}
}

// exit reads to the exit frame and the close that must follow it.
func (p *ptyClient) exit() int {
	p.t.Helper()
	for {
		f := p.next()
		if f.Type == "exit" {
			p.closed(websocket.CloseNormalClosure)
			return f.Code
		}
		if f.Type != "stdout" {
			p.t.Fatalf("frame %+v before exit", f)
		}
	}
}

// closed expects the agent to close the socket with code.
func (p *ptyClient) closed(code int) {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, b, err := p.conn.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != code {
		p.t.Fatalf("after last frame: %q, %v; want close %d", b, err, code)
	}
}

func TestPTY(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) {
		// TERM is set by the agent only when its environment has none.
		c.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "TERM=") })
	})

	t.Run("echo through cat", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		p.init([]string{"cat"}, nil)
		if pid := p.ready(); pid <= 0 {
			t.Fatalf("ready pid %d", pid)
		}
		p.send(map[string]any{"type": "stdin", "data": []byte("hello pty\n")})
		p.until("hello pty\r\nhello pty\r\n")                      // the terminal's echo, then cat's
		p.send(map[string]any{"type": "stdin", "data": []byte{4}}) // ^D: EOF
		if code := p.exit(); code != 0 {
			t.Fatalf("exit %d", code)
		}
	})
	t.Run("exit code", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		p.init([]string{"bash", "-c", "echo done; exit 7"}, nil)
		p.ready()
		if code := p.exit(); code != 7 || !strings.Contains(p.out.String(), "done") {
			t.Fatalf("exit %d, output %q", code, p.out.String())
		}
	})
	t.Run("kill", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		p.init([]string{"sleep", "30"}, nil)
		p.ready()
		p.send(map[string]any{"type": "signal", "sig": "kill"})
		if code := p.exit(); code != -9 {
			t.Fatalf("exit %d, want -9", code)
		}
	})
	t.Run("unknown signal is TERM", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		p.init([]string{"sleep", "30"}, nil)
		p.ready()
		p.send(map[string]any{"type": "signal", "sig": "WINCH-NOPE"})
		if code := p.exit(); code != -15 {
			t.Fatalf("exit %d, want -15", code)
		}
	})
	t.Run("close frame terminates", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		p.init([]string{"sleep", "30"}, nil)
		p.ready()
		p.send(map[string]any{"type": "close"})
		if code := p.exit(); code != -15 {
			t.Fatalf("exit %d, want -15", code)
		}
	})
	t.Run("resize", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		p.init([]string{"bash", "-c", "stty size; read x; stty size"}, map[string]any{"rows": 30, "cols": 90})
		p.ready()
		p.until("30 90")
		p.send(map[string]any{"type": "resize", "rows": 40, "cols": 100})
		p.send(map[string]any{"type": "stdin", "data": []byte("\n")})
		p.until("40 100")
		if code := p.exit(); code != 0 {
			t.Fatalf("exit %d", code)
		}
	})
	t.Run("login shell, env and TERM", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		p.init([]string{"echo", "it's", "$FOO", "$TERM"}, map[string]any{"login_shell": true, "env": map[string]string{"FOO": "x"}})
		p.ready()
		// Quoted: the shell must not expand the arguments.
		p.until("it's $FOO $TERM")
		if code := p.exit(); code != 0 {
			t.Fatalf("exit %d, output %q", code, p.out.String())
		}
		q := a.pty(t)
		q.init([]string{"bash", "-c", "echo $FOO/$TERM"}, map[string]any{"env": map[string]string{"FOO": "x"}})
		q.ready()
		q.until("x/xterm-256color")
		q.exit()
	})
	t.Run("command not found", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		p.init([]string{"no-such-command-here"}, nil)
		p.ready()
		code := p.exit()
		if code != 127 || !strings.Contains(p.out.String(), "pty_runner: command not found: no-such-command-here") {
			t.Fatalf("exit %d, output %q", code, p.out.String())
		}
	})
	t.Run("client gone kills the command", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		p.init([]string{"sleep", "30"}, nil)
		pid := p.ready()
		p.conn.Close()
		processGone(t, pid, 3*time.Second)
	})
	for _, bad := range []struct {
		name  string
		frame any
		want  string
	}{
		{"wrong type", map[string]any{"type": "stdin", "data": "aGk="}, `bad init frame: type is "stdin", want "init"`},
		{"empty cmd", map[string]any{"type": "init", "cmd": []string{}}, "bad init frame: cmd must be a non-empty list"},
		{"cmd not a list", map[string]any{"type": "init", "cmd": "ls"}, "bad init frame: "},
	} {
		t.Run("bad init "+bad.name, func(t *testing.T) {
			t.Parallel()
			p := a.pty(t)
			p.send(bad.frame)
			f := p.next()
			if f.Type != "error" || !strings.HasPrefix(f.Message, bad.want) {
				t.Fatalf("frame = %+v, want error %q", f, bad.want)
			}
			p.closed(closeBadInit)
		})
	}
	t.Run("init timeout", func(t *testing.T) {
		t.Parallel()
		p := a.pty(t)
		f := p.next()
		if f.Type != "error" || f.Message != "init timeout" {
			t.Fatalf("frame = %+v", f)
		}
		p.closed(closeBadInit)
	})
}
