package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/server/manager"
	"github.com/orchard/orchard/store"
)

// Service endpoints (Orchard Env's /services routes). A port inside a
// sandbox gets a URL on this server, <base>/s/<token>, that carries its own
// credential: programs that cannot set an X-API-Key header (a WebSocket
// client, a browser following a link) can use it, and clients that append
// their own path (/ws) keep it. Traffic goes server → the sandbox's agent →
// 127.0.0.1:<port> inside the sandbox (agent route /dial), so a sandbox
// without a network needs none, and the Kubernetes runtime's agent (reached
// by pod IP) serves it the same way.
//
// The token is 32 random bytes; the store keeps only its SHA-256, as a
// document of kind "service" expiring with the URL, so every replica
// sharing the store (Redis) accepts it and a revocation (deleting the
// document) takes effect at once everywhere.

const (
	serviceDocKind = "service"
	// serviceTokenBytes: 256 bits, beyond guessing.
	serviceTokenBytes = 32
	// serviceReadyPoll is the pause between readiness probes; a starting
	// service usually listens within a second.
	serviceReadyPoll = 250 * time.Millisecond
	// serviceProbeTimeout bounds one readiness probe: a health path that
	// takes longer is not ready.
	serviceProbeTimeout = 5 * time.Second
	// serviceHeaderTimeout bounds the wait for a service's response
	// headers (Orchard Env's proxy timeout is of this order); the body may
	// then stream for as long as it lasts.
	serviceHeaderTimeout = 5 * time.Minute
	// serviceIdleTimeout closes pooled connections to services that went
	// quiet; each holds a connection to the agent.
	serviceIdleTimeout = 90 * time.Second
)

// reservedServicePorts are refused before any agent is asked: the
// Kubernetes agent's port (runtime/kube DefaultAgentPort) and the egress
// proxy's (agent.DefaultEgressProxy). The agent refuses its own ports
// whatever they are.
var reservedServicePorts = []int{7070, 3128}

// serviceDoc is what the store keeps of one service URL.
type serviceDoc struct {
	SandboxID string `json:"sandbox_id"`
	// SandboxCreated ties the URL to this sandbox: a later sandbox with
	// the same id does not inherit it.
	SandboxCreated float64 `json:"sandbox_created_at"`
	Port           int     `json:"port"`
	ExpiresAt      float64 `json:"expires_at"`
}

// serviceTarget is where a pooled connection of serviceProxy goes.
type serviceTarget struct {
	agent manager.Agent
	port  int
}

// serviceProxy forwards to services through their sandboxes' agents. Its
// transport pools connections per (agent, port): the URL host names the
// pair and dial finds it in targets.
type serviceProxy struct {
	tr      *http.Transport
	targets sync.Map // "svc-<hash>:<port>" → serviceTarget
}

func newServiceProxy() *serviceProxy {
	p := &serviceProxy{}
	p.tr = &http.Transport{
		Proxy:                 nil,
		DialContext:           p.dial,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       serviceIdleTimeout,
		ResponseHeaderTimeout: serviceHeaderTimeout,
		// Bodies pass as they are, Content-Encoding and all.
		DisableCompression: true,
	}
	return p
}

func agentKey(agentAddr string) string {
	sum := sha256.Sum256([]byte(agentAddr))
	return "svc-" + hex.EncodeToString(sum[:10]) + ":"
}

// host returns the URL host for a sandbox's port, registering its agent.
func (p *serviceProxy) host(agentAddr string, a manager.Agent, port int) string {
	h := agentKey(agentAddr) + strconv.Itoa(port)
	p.targets.Store(h, serviceTarget{agent: a, port: port})
	return h
}

// forget drops the targets of an agent that is gone.
func (p *serviceProxy) forget(agentAddr string) {
	prefix := agentKey(agentAddr)
	p.targets.Range(func(k, _ any) bool {
		if strings.HasPrefix(k.(string), prefix) {
			p.targets.Delete(k)
		}
		return true
	})
}

// dial opens a byte stream to the service through its agent's /dial.
func (p *serviceProxy) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	v, ok := p.targets.Load(addr)
	if !ok {
		return nil, faults.New(faults.CodeServiceUnreachable, faults.Unavailable, faults.Sandbox, "Service unreachable")
	}
	t := v.(serviceTarget)
	base, rt := t.agent.HTTP()
	u := *base
	u.Path = api.AgentDialPath
	u.RawQuery = "port=" + strconv.Itoa(t.port)
	// The connection outlives the request that made it (it is pooled), so
	// it must not die with that request's context.
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.AgentDialProtocol)
	res, err := rt.RoundTrip(req)
	if err != nil {
		return nil, faults.Wrap(err, faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "the sandbox's agent could not be reached")
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		defer res.Body.Close()
		var env struct {
			Error *faults.Info `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
		if json.Unmarshal(b, &env) == nil && env.Error != nil {
			return nil, faults.FromInfo(*env.Error, res.StatusCode)
		}
		return nil, faults.Newf(faults.CodeAgentUnreachable, faults.Unavailable, faults.Sandbox, "the sandbox's agent answered %d to a dial", res.StatusCode)
	}
	rwc, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		res.Body.Close()
		return nil, errors.New("agent dial: upgraded body is not writable")
	}
	return &streamConn{ReadWriteCloser: rwc}, nil
}

// streamConn is an upgraded agent connection as a net.Conn. Deadlines are
// not supported: the transport does not use them on plain HTTP.
type streamConn struct{ io.ReadWriteCloser }

type serviceAddr struct{}

func (serviceAddr) Network() string                  { return "orchard-dial" }
func (serviceAddr) String() string                   { return "sandbox-service" }
func (*streamConn) LocalAddr() net.Addr              { return serviceAddr{} }
func (*streamConn) RemoteAddr() net.Addr             { return serviceAddr{} }
func (*streamConn) SetDeadline(time.Time) error      { return nil }
func (*streamConn) SetReadDeadline(time.Time) error  { return nil }
func (*streamConn) SetWriteDeadline(time.Time) error { return nil }

func (s *Server) serviceRoutes() []route {
	rs := []route{
		{method: "POST", path: "/sandboxes/:id/services", summary: "Expose a port inside the sandbox at a URL that carries its own credential (HTTP and WebSocket)",
			request: api.ServiceRequest{}, response: api.ServiceEndpoint{}, handler: s.exposeService},
		{method: "GET", path: "/sandboxes/:id/services", summary: "List the ports the sandbox exposes", response: api.ServiceList{}, handler: s.listServices},
		{method: "DELETE", path: "/sandboxes/:id/services/:port", summary: "Revoke a port's URLs (at once)", response: api.ServiceRevoked{}, handler: s.revokeService},
	}
	// The service's own traffic: any method, the token is the credential.
	// The bare URL is the service's "/" (a WebSocket client cannot follow
	// a redirect to the slashed form).
	for _, p := range []string{"/s/:token", "/s/:token/*path"} {
		for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"} {
			rs = append(rs, route{method: m, path: p, summary: "Traffic to an exposed service (the URL's token authenticates it; WebSocket upgrades pass)",
				public: true, stream: true, rawBody: true, produces: "*/*", handler: s.proxyService})
		}
	}
	return rs
}

func (s *Server) docs() (store.Docs, error) {
	d, ok := s.mgr.Store().(store.Docs)
	if !ok {
		return nil, faults.New(faults.CodeMisconfigured, faults.Internal, faults.Platform, "the store keeps no documents")
	}
	return d, nil
}

func tokenID(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// checkServicePort returns the 400 Orchard Env answers for a port that may
// not be exposed.
func checkServicePort(port int) error {
	if port < 1 || port > 65535 {
		return faults.Newf(faults.CodeServicePortInvalid, faults.InvalidRequest, faults.Client, "Port %d is outside the valid range 1-65535", port)
	}
	if slices.Contains(reservedServicePorts, port) {
		return faults.Newf(faults.CodeServicePortInvalid, faults.InvalidRequest, faults.Client, "Port %d is reserved and cannot be exposed", port)
	}
	return nil
}

// externalBase is the scheme and host service URLs start with: the
// configured public URL, else the request's own.
func (s *Server) externalBase(r *http.Request) string {
	if s.cfg.ServicePublicURL != "" {
		return strings.TrimRight(s.cfg.ServicePublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func (s *Server) exposeService(c *gin.Context) error {
	ctx := c.Request.Context()
	id := c.Param("id")
	raw := body(c)
	var req api.ServiceRequest
	if err := decodeJSON(raw, &req); err != nil {
		return err
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(raw, &fields)
	if _, ok := fields["port"]; !ok {
		return faults.Validation(missingField("body", "port", jsonInput(raw)))
	}
	var v checks
	if req.TTLSeconds != nil && *req.TTLSeconds <= 0 {
		v.add(faults.CodeValidation, tooSmall([]any{"body", "ttl_seconds"}, *req.TTLSeconds, 1))
	}
	v.nonNegative(req.ReadyTimeout, []any{"body", "ready_timeout"})
	health := "/health"
	if req.HealthPath != nil {
		health = *req.HealthPath
		v.noNUL(health, "health_path", []any{"body", "health_path"})
	}
	if err := v.err(); err != nil {
		return err
	}
	if !strings.HasPrefix(health, "/") {
		health = "/" + health
	}
	if err := checkServicePort(req.Port); err != nil {
		return err
	}
	rec, err := s.mgr.Get(ctx, id)
	if err != nil {
		return err
	}
	docs, err := s.docs()
	if err != nil {
		return err
	}
	now := time.Now()
	// A URL never outlives its sandbox: by default it lasts as long as the
	// sandbox may, and a longer ttl_seconds is cut to that.
	until := s.sandboxJSON(rec).ExpiresAt
	expires := *until
	if req.TTLSeconds != nil {
		expires = min(expires, float64(now.Unix())+float64(*req.TTLSeconds))
	}
	if expires <= float64(now.Unix()) {
		return faults.Newf(faults.CodeSandboxGone, faults.Canceled, faults.Client, "Sandbox %s has reached its lifetime", id)
	}
	if req.WaitReady {
		timeout := 60
		if req.ReadyTimeout != nil {
			timeout = *req.ReadyTimeout
		}
		if err := s.waitService(ctx, id, req.Port, health, time.Duration(timeout)*time.Second); err != nil {
			return err
		}
	}
	tok := make([]byte, serviceTokenBytes)
	_, _ = rand.Read(tok)
	token := base64.RawURLEncoding.EncodeToString(tok)
	doc, _ := json.Marshal(serviceDoc{SandboxID: id, SandboxCreated: rec.CreatedAt, Port: req.Port, ExpiresAt: expires})
	ttl := time.Until(time.Unix(0, int64(expires*1e9)))
	if err := docs.PutDoc(ctx, serviceDocKind, tokenID(token), doc, ttl); err != nil {
		return err
	}
	// The token is a bearer credential: returned, never logged.
	s.log.Info("service exposed", "sandbox_id", id, "port", req.Port)
	c.JSON(http.StatusOK, api.ServiceEndpoint{SandboxID: id, Port: req.Port,
		URL: s.externalBase(c.Request) + "/s/" + token, ExpiresAt: expires})
	return nil
}

// waitService polls the service's health path through the agent until it
// answers 2xx or timeout passes (408 service.not_ready, naming the port
// and, when nothing listens, saying so).
func (s *Server) waitService(ctx context.Context, id string, port int, health string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		rec, err := s.mgr.Get(ctx, id)
		if err != nil {
			return err
		}
		a, err := s.mgr.Agent(ctx, id)
		if err == nil {
			last = s.probeService(ctx, s.svc.host(rec.AgentAddr, a, port), port, health)
			if last == nil {
				return nil
			}
		} else if !faults.Is(err, faults.CodeSandboxNotReady) {
			return err
		}
		if !time.Now().Before(deadline) {
			msg := fmt.Sprintf("Service on port %d did not answer %s within %ds", port, health, int(timeout.Seconds()))
			if faults.Is(last, faults.CodeServiceUnreachable) {
				msg += fmt.Sprintf(": nothing accepts connections on port %d inside the sandbox", port)
			} else if last != nil {
				msg += ": " + faults.Of(last).Message
			}
			return faults.Wrap(last, faults.CodeServiceNotReady, faults.Timeout, faults.Sandbox, msg)
		}
		t := time.NewTimer(min(serviceReadyPoll, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return faults.Wrap(ctx.Err(), faults.CodeCanceled, faults.Canceled, faults.Client, "the caller went away")
		case <-t.C:
		}
	}
}

func (s *Server) probeService(ctx context.Context, host string, port int, health string) error {
	pctx, cancel := context.WithTimeout(ctx, serviceProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, "http://"+host+health, nil)
	if err != nil {
		return faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "health_path is not a valid path")
	}
	req.Host = "127.0.0.1:" + strconv.Itoa(port)
	res, err := s.svc.tr.RoundTrip(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
	res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return faults.Newf(faults.CodeServiceNotReady, faults.Timeout, faults.Sandbox, "the last answer was %d", res.StatusCode)
	}
	return nil
}

// sandboxServices returns the live service documents of sandbox rec by
// token id.
func (s *Server) sandboxServices(ctx context.Context, docs store.Docs, rec store.Sandbox) (map[string]serviceDoc, error) {
	all, err := docs.ListDocs(ctx, serviceDocKind)
	if err != nil {
		return nil, err
	}
	now := float64(time.Now().Unix())
	out := map[string]serviceDoc{}
	for k, b := range all {
		var d serviceDoc
		if json.Unmarshal(b, &d) != nil || d.SandboxID != rec.ID || d.SandboxCreated != rec.CreatedAt || d.ExpiresAt < now {
			continue
		}
		out[k] = d
	}
	return out, nil
}

func (s *Server) listServices(c *gin.Context) error {
	ctx := c.Request.Context()
	rec, err := s.mgr.Get(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	docs, err := s.docs()
	if err != nil {
		return err
	}
	svcs, err := s.sandboxServices(ctx, docs, rec)
	if err != nil {
		return err
	}
	ports := []int{}
	for _, d := range svcs {
		if !slices.Contains(ports, d.Port) {
			ports = append(ports, d.Port)
		}
	}
	slices.Sort(ports)
	c.JSON(http.StatusOK, api.ServiceList{SandboxID: rec.ID, Ports: ports})
	return nil
}

func (s *Server) revokeService(c *gin.Context) error {
	ctx := c.Request.Context()
	id := c.Param("id")
	port, err := strconv.Atoi(c.Param("port"))
	if err != nil {
		return faults.Validation(faults.FieldError{Type: "int_parsing", Loc: []any{"path", "port"},
			Msg: "Input should be a valid integer, unable to parse string as an integer", Input: c.Param("port")})
	}
	n := 0
	if rec, err := s.mgr.Get(ctx, id); err == nil {
		n, err = s.revokeServices(ctx, rec, port)
		if err != nil {
			return err
		}
	} else if !faults.Is(err, faults.CodeSandboxNotFound) {
		return err
	}
	if n == 0 {
		return faults.Newf(faults.CodeServiceNotExposed, faults.NotFound, faults.Client, "Port %d is not exposed for sandbox %s", port, id)
	}
	c.JSON(http.StatusOK, api.ServiceRevoked{Status: "revoked", SandboxID: id, Port: port})
	return nil
}

// revokeServices deletes sandbox rec's service URLs for port (0: all) and
// returns how many there were.
func (s *Server) revokeServices(ctx context.Context, rec store.Sandbox, port int) (int, error) {
	docs, err := s.docs()
	if err != nil {
		return 0, err
	}
	svcs, err := s.sandboxServices(ctx, docs, rec)
	if err != nil {
		return 0, err
	}
	if port == 0 && rec.AgentAddr != "" {
		s.svc.forget(rec.AgentAddr)
	}
	n := 0
	for k, d := range svcs {
		if port != 0 && d.Port != port {
			continue
		}
		if err := docs.DeleteDoc(ctx, serviceDocKind, k); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// proxyService forwards one request (or WebSocket) to the service its
// URL's token names. Every request checks the token, its expiry and the
// sandbox afresh: that is what makes a revocation immediate.
func (s *Server) proxyService(c *gin.Context) error {
	ctx := c.Request.Context()
	token := c.Param("token")
	docs, err := s.docs()
	if err != nil {
		return err
	}
	b, ok, err := docs.GetDoc(ctx, serviceDocKind, tokenID(token))
	if err != nil {
		return err
	}
	var d serviceDoc
	if !ok || json.Unmarshal(b, &d) != nil || d.ExpiresAt < float64(time.Now().Unix()) {
		return faults.New(faults.CodeServiceTokenInvalid, faults.PermissionDenied, faults.Client, "Invalid or expired service token")
	}
	rec, err := s.mgr.Get(ctx, d.SandboxID)
	if faults.Is(err, faults.CodeSandboxNotFound) || (err == nil && rec.CreatedAt != d.SandboxCreated) {
		_ = docs.DeleteDoc(ctx, serviceDocKind, tokenID(token))
		return faults.New(faults.CodeServiceTokenInvalid, faults.NotFound, faults.Client, "Sandbox not found")
	}
	if err != nil {
		return err
	}
	a, err := s.mgr.Agent(ctx, d.SandboxID)
	if err != nil {
		return err
	}
	host := s.svc.host(rec.AgentAddr, a, d.Port)
	prefix := "/s/" + token
	rp := &httputil.ReverseProxy{
		Transport: s.svc.tr,
		// Flush as bytes arrive: streamed and event-stream bodies must
		// not wait in a buffer.
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out
			out.URL.Scheme, out.URL.Host = "http", host
			out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, prefix)
			out.URL.RawPath = strings.TrimPrefix(pr.In.URL.RawPath, prefix)
			if out.URL.Path == "" {
				out.URL.Path, out.URL.RawPath = "/", ""
			}
			out.Host = "127.0.0.1:" + strconv.Itoa(d.Port)
			// The server's credential is not the service's business.
			out.Header.Del("X-API-Key")
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			renderError(c, s.log, serviceFault(err, d.Port))
		},
	}
	rp.ServeHTTP(c.Writer, c.Request)
	return nil
}

// serviceFault classifies a proxy failure; the message names the port,
// never the agent's address.
func serviceFault(err error, port int) error {
	var f *faults.Error
	if errors.As(err, &f) {
		return err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return faults.Wrap(err, faults.CodeServiceTimeout, faults.Timeout, faults.Sandbox,
			fmt.Sprintf("Service request timed out: port %d did not answer within %s", port, serviceHeaderTimeout))
	}
	return faults.Wrap(err, faults.CodeServiceUnreachable, faults.Unavailable, faults.Sandbox,
		fmt.Sprintf("Service unreachable: the connection to port %d inside the sandbox broke", port))
}
