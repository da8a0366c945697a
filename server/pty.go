package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"github.com/orchard/orchard/faults"
)

// ptyPingInterval keeps PTY sessions alive through the sync SDK's 10 s
// receive timeout (ORCHARD_COMPAT §3.17): any frame, pings included, resets it.
const ptyPingInterval = 5 * time.Second

// ptyWriteTimeout bounds one write to the client (the agent's own bound).
const ptyWriteTimeout = 10 * time.Second

// ptyMaxMessage is the largest frame either side may send (Orchard's 4 MiB).
const ptyMaxMessage = 4 << 20

var upgrader = websocket.Upgrader{
	ReadBufferSize:  32 << 10,
	WriteBufferSize: 32 << 10,
	// Browsers and SDKs connect from anywhere; the API key is the guard.
	CheckOrigin:  func(*http.Request) bool { return true },
	Subprotocols: nil,
}

// pty proxies the PTY WebSocket to the sandbox's agent, frame by frame.
// Rejections before the upgrade are plain HTTP errors (Orchard's
// handshake 403s carry no body the SDK reads).
func (s *Server) pty(c *gin.Context) error {
	a, err := s.mgr.Agent(c.Request.Context(), c.Param("id"))
	if err != nil {
		// Orchard refuses WebSocket handshakes with 403 whatever the reason;
		// the error object still tells which.
		f := faults.Of(err)
		f.Status = http.StatusForbidden
		return f
	}
	// Echo an api_key.* subprotocol back, as a browser client requires.
	var hdr http.Header
	if p := c.GetHeader("Sec-WebSocket-Protocol"); p != "" {
		for _, proto := range websocket.Subprotocols(c.Request) {
			hdr = http.Header{"Sec-WebSocket-Protocol": {proto}}
			break
		}
	}
	up := upgrader
	up.Error = func(_ http.ResponseWriter, _ *http.Request, status int, reason error) {
		// Handshake refusals are errors like any other: JSON, classified.
		renderError(c, s.log, faults.New(faults.CodeValidation, faults.InvalidRequest, faults.Client,
			"/exec/pty is a WebSocket: "+reason.Error()).WithStatus(status))
	}
	client, err := up.Upgrade(c.Writer, c.Request, hdr)
	if err != nil {
		return nil // the upgrader has answered the client
	}
	defer client.Close()
	client.SetReadLimit(ptyMaxMessage)

	dctx, cancel := context.WithTimeout(c.Request.Context(), 10*time.Second)
	agentConn, _, err := a.DialPTY(dctx, nil)
	cancel()
	if err != nil {
		msg, _ := json.Marshal(map[string]string{"type": "error", "message": "agent unreachable: " + faults.Of(err).Message})
		_ = client.WriteMessage(websocket.TextMessage, msg)
		_ = client.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(4503, "agent unreachable"), time.Now().Add(time.Second))
		return nil
	}
	defer agentConn.Close()
	agentConn.SetReadLimit(ptyMaxMessage)

	var writeMu sync.Mutex // guards writes to client (frames and pings)
	done := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(done) }) }

	go func() { // client → agent
		defer finish()
		for {
			mt, data, err := client.ReadMessage()
			if err != nil {
				// The client went away: closing the agent side makes the
				// agent SIGTERM the session's process group.
				_ = agentConn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
				return
			}
			if err := agentConn.WriteMessage(mt, data); err != nil {
				return
			}
		}
	}()
	go func() { // agent → client
		defer finish()
		for {
			mt, data, err := agentConn.ReadMessage()
			if err != nil {
				writeMu.Lock()
				defer writeMu.Unlock()
				var ce *websocket.CloseError
				if errors.As(err, &ce) && ce.Code != websocket.CloseAbnormalClosure && ce.Code != websocket.CloseTLSHandshake {
					// The agent closed the session: pass its close on.
					_ = client.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(ce.Code, ce.Text), time.Now().Add(time.Second))
					return
				}
				// The agent's connection broke without a close frame (the
				// agent or its sandbox died). 1006 must not be sent
				// (RFC 6455 §7.4.1); tell the client as for an agent that
				// cannot be reached (ORCHARD_COMPAT §3.17).
				msg, _ := json.Marshal(map[string]string{"type": "error", "message": "agent unreachable: " + err.Error()})
				_ = client.SetWriteDeadline(time.Now().Add(time.Second))
				_ = client.WriteMessage(websocket.TextMessage, msg)
				_ = client.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(4503, "agent unreachable"), time.Now().Add(time.Second))
				return
			}
			writeMu.Lock()
			// A client that cannot take a frame in this long is gone, as
			// the agent also judges; without a deadline a client that stops
			// reading holds this proxy (and the writeMu the pings wait
			// for) forever, long after the agent ended the session.
			_ = client.SetWriteDeadline(time.Now().Add(ptyWriteTimeout))
			err = client.WriteMessage(mt, data)
			writeMu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t := time.NewTicker(ptyPingInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-t.C:
			writeMu.Lock()
			err := client.WriteControl(websocket.PingMessage, nil, time.Now().Add(5*time.Second))
			writeMu.Unlock()
			if err != nil {
				return nil
			}
		}
	}
}
