package server_test

import (
	"bytes"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// ptyHandlers counts the server's PTY proxy handlers still running.
func ptyHandlers() int {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for _, st := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(st, "server.(*Server).pty(") {
			n++
		}
	}
	return n
}

// A PTY client that stops reading: the agent gives up on it after its
// 10 s write timeout and ends the session once the command exits; the
// server must not keep the client's connection and the proxy's goroutines
// (blocked writing to the client) forever.
func TestPTYStalledClientReleased(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	id := createReady(t, srv, map[string]any{"memory": "256Mi"})
	before := ptyHandlers()
	u := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/exec/pty?api_key=" + srv.APIKey
	conn, _, err := websocket.DefaultDialer.Dial(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// 40 MB of output, and never a read: the server's writes to us block
	// once the socket buffers are full.
	if err := conn.WriteJSON(map[string]any{"type": "init", "cmd": []string{"sh", "-c", "head -c 40000000 /dev/zero | tr '\\0' a"},
		"env": map[string]string{}, "cwd": nil, "rows": 24, "cols": 80, "login_shell": false}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if ptyHandlers() <= before {
		t.Fatal("no PTY handler found in the goroutine dump")
	}
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		if ptyHandlers() == before {
			return
		}
		time.Sleep(time.Second)
	}
	j := execWait(t, srv, id, map[string]any{"command": "pgrep -x head || true"})
	t.Fatalf("PTY proxy handler still running 45 s after the client stopped reading (head still running: %q)", j.Stdout)
}
