package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/faults"
)

// DefaultEgressProxy is where a network-enabled sandbox's proxy listens:
// on loopback of the sandbox's own network namespace, so no other sandbox
// and nothing on the host can reach it.
const DefaultEgressProxy = "127.0.0.1:3128"

// tunnelAttachWait is how long a connection waits for the server to
// (re-)attach the tunnel: a restarting server re-attaches within a second
// or two.
const tunnelAttachWait = 10 * time.Second

// EgressConfig turns on the sandbox's proxy.
type EgressConfig struct {
	// Listen is the proxy's address inside the sandbox.
	Listen string
	// Direct dials from inside the sandbox (a pod with its own network)
	// with Allow as the policy; otherwise connections go through the
	// tunnel the server attaches, and the server applies the policy.
	Direct bool
	Allow  []string
}

type egressState struct {
	cfg    EgressConfig
	tunnel *egress.Tunnel
	proxy  *egress.Proxy
	ln     net.Listener
}

// proxyEnv is what every command sees: both spellings, since curl reads
// only the lower-case http_proxy and many tools only the upper-case ones.
func proxyEnv(listen string) []string {
	u := "http://" + listen
	noProxy := "localhost,127.0.0.1,::1"
	return []string{
		"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "NO_PROXY=" + noProxy,
		"http_proxy=" + u, "https_proxy=" + u, "no_proxy=" + noProxy,
	}
}

// startEgress listens for the proxy and serves it until ctx ends.
func (s *Server) startEgress(ctx context.Context, cfg EgressConfig) error {
	if cfg.Listen == "" {
		cfg.Listen = DefaultEgressProxy
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	st := &egressState{cfg: cfg, ln: ln}
	var dial egress.DialFunc
	if cfg.Direct {
		d := &egress.Dialer{Log: s.log}
		p := egress.Policy{Allow: cfg.Allow}
		dial = func(ctx context.Context, host string, port int) (net.Conn, error) { return d.Dial(ctx, p, host, port) }
	} else {
		st.tunnel = egress.NewTunnel(tunnelAttachWait)
		dial = st.tunnel.Dial
	}
	st.proxy = egress.NewProxy(dial, egress.NewLog(0), s.inject, s.log.With("component", "egress"))
	s.egress = st
	s.cfg.Env = append(s.cfg.Env, proxyEnv(ln.Addr().String())...)
	go func() {
		if err := st.proxy.Serve(ctx, ln); err != nil {
			s.log.Error("egress proxy stopped", "err", err)
		}
		if st.tunnel != nil {
			st.tunnel.Close()
		}
	}()
	return nil
}

var errNoEgress = errors.New("no egress")

func (s *Server) noEgress() error {
	return faults.Wrap(errNoEgress, faults.CodeNetworkEgressOff, faults.InvalidRequest, faults.Client,
		"this sandbox has no network: create it with block_network=false")
}

// handleTunnel attaches the server's end of the egress tunnel, or of its
// socket channel.
func (s *Server) handleTunnel(w http.ResponseWriter, r *http.Request) error {
	if s.egress == nil || s.egress.tunnel == nil {
		return s.noEgress()
	}
	if r.Header.Get("Upgrade") == egress.SocketProtocol {
		if s.egress.tunnel.HeldSockets() {
			return faults.New(faults.CodeEgressUnavailable, faults.Conflict, faults.Platform, "egress socket channel already attached by another server")
		}
		conn, err := egress.AcceptUpgrade(w, r, egress.SocketProtocol)
		if err != nil {
			return err
		}
		return s.egress.tunnel.AttachSockets(conn)
	}
	if s.egress.tunnel.Held() {
		return faults.New(faults.CodeEgressUnavailable, faults.Conflict, faults.Platform, "egress tunnel already attached by another server")
	}
	conn, err := egress.AcceptUpgrade(w, r, egress.TunnelProtocol)
	if err != nil {
		return err
	}
	return s.egress.tunnel.Attach(conn)
}

// handleNetwork serves the connection log: JSON entries, or HAR with
// ?format=har; ?since=ID returns only newer entries.
func (s *Server) handleNetwork(w http.ResponseWriter, r *http.Request) error {
	if s.egress == nil {
		return s.noEgress()
	}
	q := r.URL.Query()
	since, _ := strconv.ParseInt(q.Get("since"), 10, 64)
	entries := s.egress.proxy.Log().Entries(since)
	if q.Get("format") == "har" {
		writeJSON(w, http.StatusOK, egress.HAR(entries, "orchard"))
		return nil
	}
	writeJSON(w, http.StatusOK, map[string]any{"proxy": "http://" + s.egress.ln.Addr().String(), "entries": entries})
	return nil
}

// parseAllow splits a comma-separated allow-list flag.
func parseAllow(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// evidenceClient asks the sandbox's proxy what it saw of a host: the
// browser daemon's view of a failed navigation is only "tunnel failed".
func evidenceClient(proxy string) func(ctx context.Context, host string, since time.Time) (*faults.Error, *faults.Truth) {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil}}
	return func(ctx context.Context, host string, since time.Time) (*faults.Error, *faults.Truth) {
		u := fmt.Sprintf("http://%s%s?host=%s&since=%d", proxy, egress.PathEvidence, host, since.UnixNano())
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, nil
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, nil
		}
		defer resp.Body.Close()
		var e egress.Entry
		if json.NewDecoder(resp.Body).Decode(&e) != nil || e.ID == 0 {
			return nil, nil
		}
		var fe *faults.Error
		if e.Error != nil {
			fe = faults.FromInfo(*e.Error, 0)
		}
		return fe, e.Injected
	}
}
