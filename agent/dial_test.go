package agent

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/orchard/orchard/agentclient"
	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// dialService asks an agent for a pipe to port as the server does; a
// refusal comes back as its fault.
func dialService(t *testing.T, c *agentclient.Client, port string) (io.ReadWriteCloser, error) {
	t.Helper()
	base, rt := c.HTTP()
	req, _ := http.NewRequestWithContext(context.Background(), "GET", base.String()+api.AgentDialPath+"?port="+port, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.AgentDialProtocol)
	res, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("dial %s: %v", port, err)
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		return res.Body.(io.ReadWriteCloser), nil
	}
	defer res.Body.Close()
	var env struct{ Error *faults.Info }
	if err := json.NewDecoder(res.Body).Decode(&env); err != nil || env.Error == nil {
		t.Fatalf("dial %s: %d without an envelope (%v)", port, res.StatusCode, err)
	}
	return nil, faults.FromInfo(*env.Error, res.StatusCode)
}

func TestServiceDial(t *testing.T) {
	a := startAgent(t, nil)
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	port := strconv.Itoa(echo.Addr().(*net.TCPAddr).Port)

	pipe, err := dialService(t, a.Client, port)
	if err != nil {
		t.Fatalf("dial a listening port: %v", err)
	}
	msg := strings.Repeat("through the agent ", 10000)
	go func() { _, _ = io.WriteString(pipe, msg) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(pipe, got); err != nil || string(got) != msg {
		t.Fatalf("echo through the pipe: %v (%d bytes back)", err, len(got))
	}
	pipe.Close()

	// A port nothing listens on: a free one.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	free := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	_, err = dialService(t, a.Client, free)
	e := wantFault(t, err, http.StatusBadGateway, faults.Unavailable, faults.CodeServiceUnreachable)
	if !strings.Contains(e.Message, free) {
		t.Errorf("unreachable message %q does not name port %s", e.Message, free)
	}
	for _, p := range []string{"0", "65536", "x", ""} {
		_, err = dialService(t, a.Client, p)
		wantFault(t, err, http.StatusBadRequest, faults.InvalidRequest, faults.CodeServicePortInvalid)
	}

	// An agent on TCP (a pod's) refuses its own port: exposing it would
	// hand out exec and files.
	srv, err := New(Config{Root: t.TempDir(), Logger: testLogger})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	c := agentclient.NewClient("http://" + ln.Addr().String())
	defer func() { c.Close(); cancel(); <-served }()
	_, err = dialService(t, c, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	e = wantFault(t, err, http.StatusBadRequest, faults.InvalidRequest, faults.CodeServicePortInvalid)
	if !strings.Contains(e.Message, "reserved") {
		t.Errorf("own-port message %q", e.Message)
	}
}
