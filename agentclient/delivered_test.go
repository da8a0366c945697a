package agentclient

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// An exec that fails after its request reached the agent is marked as
// delivered (the command may have run, so it must not be sent again); one
// that never reached it is not. (A connection closed by the agent while the
// request was being written is ambiguous to the client and counts as
// delivered; the client retires idle connections before the agent does, so
// a kept-alive connection is not closed under a request.)
func TestExecFailureDelivered(t *testing.T) {
	cases := []struct {
		name string
		// serve answers one connection; nil: nothing listens.
		serve         func(c net.Conn)
		wantDelivered bool
	}{
		{"nothing listens", nil, false},
		{"closed after the request, no answer", func(c net.Conn) {
			http.ReadRequest(bufio.NewReader(c))
			c.Close()
		}, true},
		{"stream broken after an event", func(c net.Conn) {
			http.ReadRequest(bufio.NewReader(c))
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"))
			ev := `{"stdout":"partial"}` + "\n"
			c.Write([]byte("15\r\n" + ev + "\r\n"))
			c.Close()
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "agent.sock")
			if c.serve != nil {
				ln, err := net.Listen("unix", sock)
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				go func() {
					for {
						conn, err := ln.Accept()
						if err != nil {
							return
						}
						c.serve(conn)
					}
				}()
			}
			cl := NewClient("unix:" + sock)
			defer cl.Close()
			var events []api.ExecEvent
			_, err := cl.Exec(context.Background(), api.AgentExecRequest{Command: "echo hi", TimeoutSeconds: 5}, func(ev api.ExecEvent) { events = append(events, ev) })
			if err == nil {
				t.Fatal("exec succeeded against a broken agent")
			}
			if !faults.Is(err, faults.CodeAgentUnreachable) {
				t.Errorf("error %v: want %s", err, faults.CodeAgentUnreachable)
			}
			if got := Delivered(err); got != c.wantDelivered {
				t.Errorf("Delivered(%v) = %v, want %v", err, got, c.wantDelivered)
			}
		})
	}
}
