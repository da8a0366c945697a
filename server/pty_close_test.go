package server_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// openPTY opens the PTY WebSocket through the server, sends init and
// waits for the ready frame.
func openPTY(t *testing.T, srv *testserver.Server, id string, cmd []string) *websocket.Conn {
	t.Helper()
	u := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/exec/pty?api_key=" + srv.APIKey
	conn, _, err := websocket.DefaultDialer.Dial(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	init := map[string]any{"type": "init", "cmd": cmd, "env": map[string]string{}, "cwd": nil, "rows": 24, "cols": 80, "login_shell": false}
	if err := conn.WriteJSON(init); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		var f map[string]any
		if err := conn.ReadJSON(&f); err != nil {
			t.Fatalf("waiting for ready: %v", err)
		}
		if f["type"] == "ready" {
			_ = conn.SetReadDeadline(time.Time{})
			return conn
		}
	}
}

// An agent that dies during a PTY session must not make the server send
// close code 1006, which RFC 6455 §7.4.1 forbids on the wire: clients
// (gorilla, websocket-client, ws) fail the connection with a protocol
// error instead of reporting the session's end. The server says what
// happened as for an unreachable agent: an error frame, then 4503.
func TestPTYAgentDeathCloseCode(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "256Mi"})
	conn := openPTY(t, srv, id, []string{"sleep", "60"})
	defer conn.Close()
	killAgent(t, id)
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var frames []string
	for {
		_, data, err := conn.ReadMessage()
		if err == nil {
			frames = append(frames, string(data))
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("session end after the agent died: %v (frames %q), want a close frame with a valid code", err, frames)
		}
		if ce.Code != 4503 || len(frames) == 0 || !strings.Contains(frames[len(frames)-1], `"type":"error"`) {
			t.Fatalf("close %d %q after frames %q, want an error frame and 4503", ce.Code, ce.Text, frames)
		}
		return
	}
}
