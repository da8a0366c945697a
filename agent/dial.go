package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// serviceDialTimeout bounds the connect to a port on the sandbox's
// loopback: it either accepts or refuses at once, so a slow connect means
// a service too busy to serve anyway.
const serviceDialTimeout = 5 * time.Second

// handleDial connects to 127.0.0.1:port inside the sandbox's network
// namespace and, once connected, turns the request's connection into a
// byte pipe to it (the server's service endpoints: HTTP and WebSocket
// ride on it as they are). Only loopback is served, so a sandbox without a
// network stays without one: the service is reached through the agent,
// never through an interface. The agent's own port and the egress proxy's
// are refused: either would hand the caller more than the service.
func (s *Server) handleDial(w http.ResponseWriter, r *http.Request) error {
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	if err != nil || port < 1 || port > 65535 {
		return faults.Newf(faults.CodeServicePortInvalid, faults.InvalidRequest, faults.Client,
			"Port %s is outside the valid range 1-65535", r.URL.Query().Get("port"))
	}
	if s.reservedPort(r, port) {
		return faults.Newf(faults.CodeServicePortInvalid, faults.InvalidRequest, faults.Client,
			"Port %d is reserved for the in-sandbox agent and cannot be exposed", port)
	}
	if r.Header.Get("Upgrade") != api.AgentDialProtocol {
		return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client, "dial: want Upgrade: %s", api.AgentDialProtocol)
	}
	d := net.Dialer{Timeout: serviceDialTimeout}
	up, err := d.DialContext(r.Context(), "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return faults.Wrap(err, faults.CodeServiceUnreachable, faults.Unavailable, faults.Sandbox,
			fmt.Sprintf("Service unreachable: nothing accepts connections on port %d inside the sandbox", port)).WithStatus(http.StatusBadGateway)
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		return err
	}
	// The pipe lasts as long as the service's traffic does.
	_ = conn.SetDeadline(time.Time{})
	_, err = fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", api.AgentDialProtocol)
	if err == nil {
		err = brw.Flush()
	}
	if err == nil && brw.Reader.Buffered() > 0 {
		// The server wrote ahead of the 101: pass those bytes on first.
		b, _ := brw.Reader.Peek(brw.Reader.Buffered())
		_, err = up.Write(b)
	}
	if err != nil {
		conn.Close()
		up.Close()
		return nil
	}
	splice(r.Context(), conn, up)
	return nil
}

// reservedPort reports whether port belongs to the agent: the TCP port it
// serves on (a pod's agent listens on all addresses, loopback included)
// or its egress proxy's.
func (s *Server) reservedPort(r *http.Request, port int) bool {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok && a.Port == port {
		return true
	}
	if s.egress != nil {
		if a, ok := s.egress.ln.Addr().(*net.TCPAddr); ok && a.Port == port {
			return true
		}
	}
	return false
}

// splice copies both ways until both directions end or ctx does (the
// agent shutting down), half-closing each side as its peer finishes.
func splice(ctx context.Context, a, b net.Conn) {
	stop := context.AfterFunc(ctx, func() { a.Close(); b.Close() })
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			// One side broke: the other cannot go on meaningfully.
			a.Close()
			b.Close()
			return
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
		dst.Close()
	}
	go pipe(a, b)
	go pipe(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}
