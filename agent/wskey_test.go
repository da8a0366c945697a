package agent

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
)

// The upgrader accepts any key a client sends and answers with the accept
// value of that key, as Chromium's DevTools endpoint does.
func TestLenientKeyHandshake(t *testing.T) {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(lenientKey(w, r), r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		mt, msg, err := c.ReadMessage()
		if err == nil {
			c.WriteMessage(mt, msg)
		}
	}))
	defer srv.Close()

	for _, key := range []string{"nil", "dGhlIHNhbXBsZSBub25jZQ==", "not base64 at all!"} {
		t.Run(key, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			req := "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + "\r\n\r\n"
			if _, err := conn.Write([]byte(req)); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("status %s", resp.Status)
			}
			if got, want := resp.Header.Get("Sec-WebSocket-Accept"), acceptValue(key); got != want {
				t.Fatalf("accept %q, want %q", got, want)
			}
			// The connection is a working WebSocket after the rewrite: a
			// masked text frame "hi" comes back unmasked.
			if _, err := conn.Write([]byte{0x81, 0x82, 1, 2, 3, 4, 'h' ^ 1, 'i' ^ 2}); err != nil {
				t.Fatal(err)
			}
			frame := make([]byte, 4)
			if _, err := io.ReadFull(br, frame); err != nil {
				t.Fatal(err)
			}
			if string(frame) != "\x81\x02hi" {
				t.Fatalf("echo frame %q", frame)
			}
		})
	}
}
