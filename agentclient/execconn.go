package agentclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Exec requests go over connections of their own, written and read by the
// calling goroutine. http.Transport runs a reader and a writer goroutine per
// connection and hands every request, response and end of body between them
// and the caller: four goroutine switches per exec, which on a busy host
// cost more than the rest of the client. An exec is one POST and a streamed
// answer, which needs none of that machinery.

// execConn is a kept-alive connection to the agent.
type execConn struct {
	net.Conn
	br       *bufio.Reader
	idleFrom time.Time
}

// execPool holds idle exec connections, most recently used first.
type execPool struct {
	dial   func(ctx context.Context) (net.Conn, error)
	header http.Header // sent with every request: the agent's token

	mu   sync.Mutex // guards idle
	idle []*execConn
}

// get returns an idle connection (reused) or a new one.
func (p *execPool) get(ctx context.Context) (*execConn, bool, error) {
	p.mu.Lock()
	for len(p.idle) > 0 {
		c := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if time.Since(c.idleFrom) < clientIdleTimeout {
			p.mu.Unlock()
			return c, true, nil
		}
		c.Close()
	}
	p.mu.Unlock()
	nc, err := p.dial(ctx)
	if err != nil {
		return nil, false, err
	}
	return &execConn{Conn: nc, br: bufio.NewReaderSize(nc, 32<<10)}, false, nil
}

// put returns a connection whose last response was read to its end.
func (p *execPool) put(c *execConn) {
	c.idleFrom = time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.idle) >= clientIdleConns {
		c.Close()
		return
	}
	p.idle = append(p.idle, c)
}

// closeIdle closes the idle connections.
func (p *execPool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.idle {
		c.Close()
	}
	p.idle = nil
}

// execResponse is an exec answer being read on its connection.
type execResponse struct {
	*http.Response
	conn *execConn
	pool *execPool
}

// finish ends the response: a body read to its end leaves the connection
// to the pool, anything else closes it.
func (r *execResponse) finish(complete bool) {
	if complete && !r.Close {
		r.pool.put(r.conn)
		return
	}
	r.conn.Close()
}

// post sends the exec request and reads the answer's header. A reused
// connection that the agent closed while idle refuses the request; it then
// goes once more on a new connection, as http.Transport does. Once the
// request is written it is never sent again: the command may have started.
// ctx ending aborts the connection's I/O; the caller must stop the returned
// func once done with the response.
func (p *execPool) post(ctx context.Context, host, path string, body []byte) (*execResponse, func() bool, error) {
	head := fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: orchard\r\nContent-Type: application/json\r\nContent-Length: %d\r\n",
		path, host, len(body))
	for k, vs := range p.header {
		for _, v := range vs {
			head = fmt.Appendf(head, "%s: %s\r\n", k, v)
		}
	}
	head = append(head, "\r\n"...)
	req := append(head, body...)
	for attempt := 0; ; attempt++ {
		conn, reused, err := p.get(ctx)
		if err != nil {
			return nil, nil, err
		}
		stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
		n, err := conn.Write(req)
		if err != nil {
			stop()
			conn.Close()
			if reused && n == 0 && attempt == 0 && ctx.Err() == nil && idleClosed(err) {
				continue
			}
			return nil, nil, fmt.Errorf("write request: %w", err)
		}
		resp, err := http.ReadResponse(conn.br, &http.Request{Method: http.MethodPost})
		if err != nil {
			stop()
			conn.Close()
			// The whole request was written: the agent may be running it.
			return nil, nil, delivered{fmt.Errorf("read response: %w", err)}
		}
		return &execResponse{Response: resp, conn: conn, pool: p}, stop, nil
	}
}

// idleClosed reports whether err is how a write to a connection the peer
// closed while idle fails.
func idleClosed(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}

// execHost is the Host header of exec requests: the address's host (the
// placeholder "agent" on a unix socket).
func execHost(base string) string { return strings.TrimPrefix(base, "http://") }
