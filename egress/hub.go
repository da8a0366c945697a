package egress

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/orchard/orchard/retry"
)

// Hub keeps one tunnel per network-enabled sandbox attached: it connects to
// the sandbox's agent, serves the sandbox's dials with its policy, and
// reconnects with backoff when the connection breaks, until Detach.
type Hub struct {
	dialer    *Dialer
	dialAgent DialAgent
	log       *slog.Logger
	// relayOnly keeps every connection on the tunnel's streams (the
	// benchmark's baseline).
	relayOnly bool

	mu      sync.Mutex // guards tunnels, closed
	tunnels map[string]*hubTunnel
	closed  bool
	wg      sync.WaitGroup
}

type hubTunnel struct {
	cancel context.CancelFunc
	done   chan struct{}
	policy Policy
}

// DialAgent opens a raw connection to the agent at addr and returns the
// header the agent wants on its requests (its credentials; nil for none).
type DialAgent func(ctx context.Context, addr string) (net.Conn, http.Header, error)

// NewHub returns a hub dialing for sandboxes with d; dialAgent connects to
// an agent address.
func NewHub(d *Dialer, dialAgent DialAgent, log *slog.Logger) *Hub {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Hub{dialer: d, dialAgent: dialAgent, log: log, tunnels: map[string]*hubTunnel{}}
}

// Backoff bounds of re-attaching: quick enough that a restarted server's
// sandboxes get their network back at once, slow enough that a dead agent
// costs nothing.
const (
	reattachMin = 50 * time.Millisecond
	reattachMax = 5 * time.Second
	// giveUpAfter ends the loop of a sandbox whose socket has vanished
	// (deleted by another replica).
	giveUpAfter = time.Minute
	// attachTimeout bounds connecting and upgrading: a live agent answers
	// at once.
	attachTimeout = 10 * time.Second
)

// Attach keeps a tunnel to the agent at addr attached for sandbox id,
// replacing any earlier one.
func (h *Hub) Attach(id, addr string, allow []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	if old, ok := h.tunnels[id]; ok {
		old.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &hubTunnel{cancel: cancel, done: make(chan struct{}), policy: Policy{Allow: allow, AllowPrefixes: h.dialer.AllowPrefixes}}
	h.tunnels[id] = t
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(t.done)
		h.run(ctx, id, addr, t.policy, t.done)
	}()
}

// Detach stops sandbox id's tunnel and waits for it.
func (h *Hub) Detach(id string) {
	h.mu.Lock()
	t, ok := h.tunnels[id]
	delete(h.tunnels, id)
	h.mu.Unlock()
	if ok {
		t.cancel()
		<-t.done
	}
}

// Attached reports whether sandbox id has a tunnel loop.
func (h *Hub) Attached(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.tunnels[id]
	return ok
}

// Close stops every tunnel.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	for id, t := range h.tunnels {
		t.cancel()
		delete(h.tunnels, id)
	}
	h.mu.Unlock()
	h.wg.Wait()
}

func (h *Hub) run(ctx context.Context, id, addr string, p Policy, done chan struct{}) {
	log := h.log.With("sandbox_id", id)
	dial := func(ctx context.Context, host string, port int) (net.Conn, error) {
		return h.dialer.Dial(ctx, p, host, port)
	}
	reattach := retry.NewBackoff(retry.Policy{Initial: reattachMin, Max: reattachMax})
	var failingSince time.Time
	for ctx.Err() == nil {
		start := time.Now()
		err := h.attachOnce(ctx, addr, dial, log)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			reattach.Reset() // it was up for a while: a fresh failure
			failingSince = time.Time{}
		}
		if failingSince.IsZero() {
			failingSince = start
		}
		if errors.Is(err, syscall.ENOENT) && time.Since(failingSince) > giveUpAfter {
			// The agent's socket is gone: another replica deleted the sandbox.
			log.Info("egress tunnel: sandbox gone; detaching")
			h.mu.Lock()
			if h.tunnels[id] != nil && h.tunnels[id].done == done {
				delete(h.tunnels, id)
			}
			h.mu.Unlock()
			return
		}
		wait, _ := reattach.Next(err) // no Attempts or Budget: Detach ends it
		log.Debug("egress tunnel down; re-attaching", "err", err, "in", wait)
		if retry.Sleep(ctx, wait) != nil {
			return
		}
	}
}

func (h *Hub) attachOnce(ctx context.Context, addr string, dial DialFunc, log *slog.Logger) error {
	conn, err := h.upgrade(ctx, addr, TunnelProtocol)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	sctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	if !h.relayOnly {
		// The socket channel only speeds connections up: without it (an
		// agent that does not speak it, an agent over TCP) every connection
		// goes through the tunnel.
		sc, err := h.upgrade(ctx, addr, SocketProtocol)
		switch {
		case err != nil:
			log.Debug("egress socket channel refused; relaying", "err", err)
		case unixOf(sc) == nil:
			sc.Close()
		default:
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := ServeSockets(sctx, sc, dial, log); sctx.Err() == nil {
					log.Debug("egress socket channel down; relaying", "err", err)
				}
			}()
		}
	}
	err = ServeTunnel(ctx, conn, dial, log)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// upgrade connects to the agent at addr and upgrades to proto.
func (h *Hub) upgrade(ctx context.Context, addr, proto string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	conn, hdr, err := h.dialAgent(ctx, addr)
	if err != nil {
		return nil, err
	}
	up, err := Upgrade(ctx, conn, proto, hdr)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return up, nil
}
