package agentclient

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// endless writes a JSON value's start and then filler without end, until
// the client hangs up: what an agent that a sandbox's code took over could
// send the server.
func endless(w http.ResponseWriter, start string) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, start)
	chunk := strings.Repeat("A", 64<<10)
	for {
		if _, err := io.WriteString(w, chunk); err != nil {
			return
		}
	}
}

// The client decodes no answer of the agent without a bound: the agent
// runs inside the sandbox, and what it sends must not exhaust the
// server's memory.
func TestClientBoundsAgentAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/files/list":
			endless(w, `{"path":"/","files":[{"name":"`)
		case "/exec":
			endless(w, `{"stream":"stdout","data":"`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c := NewClient(srv.URL)
	defer c.Close()
	ctx := context.Background()

	_, err := c.List(ctx, "/")
	if f := faults.Of(err); err == nil || f.Category != faults.TooLarge || f.Source != faults.Sandbox {
		t.Fatalf("endless listing: %v (%+v), want too_large from the sandbox", err, f)
	}
	_, err = c.Exec(ctx, api.AgentExecRequest{Command: "true"}, nil)
	if err == nil || !strings.Contains(err.Error(), errLineTooLong.Error()) {
		t.Fatalf("endless exec event: %v, want the line refused", err)
	}
}
