package server_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// A browser that dies under a DevTools client attached through
// /browser/cdp: the client must get a close frame with a code it may
// receive, not 1006 on the wire (RFC 6455 §7.4.1), which clients
// (gorilla, Playwright's ws) reject as a protocol error.
func TestCDPBrowserDeathCloseCode(t *testing.T) {
	srv, id := browserWithPage(t)
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http") + "/sandboxes/" + id + "/browser/cdp"
	conn, _, err := websocket.DefaultDialer.Dial(wsURL, http.Header{"X-API-Key": {srv.APIKey}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cdpCall(t, conn, 1, "Browser.getVersion", nil)
	// Kill the browser inside the sandbox (not its daemon, not the agent).
	call(t, srv, "POST", "/sandboxes/"+id+"/exec", map[string]any{"command": "pkill -KILL chrom", "wait": true})
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		_, _, err := conn.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("DevTools session end after the browser died: %v, want a close frame with a valid code", err)
		}
		return
	}
}
