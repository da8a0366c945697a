package api

// Service endpoints (Orchard Env's /services routes): a port inside a
// sandbox exposed at a URL of the server that carries its own credential.

// AgentDialPath is the agent's route that connects to a port on the
// sandbox's loopback: GET AgentDialPath?port=N with Upgrade:
// AgentDialProtocol answers 101 and the connection then carries the
// service's bytes both ways.
const AgentDialPath = "/dial"

// AgentDialProtocol is the Upgrade token of AgentDialPath.
const AgentDialProtocol = "orchard-dial"

// ServiceRequest is the body of POST /sandboxes/{id}/services.
type ServiceRequest struct {
	// Port is the port the service listens on inside the sandbox.
	Port int `json:"port"`
	// TTLSeconds is the URL's lifetime; default and maximum: the
	// sandbox's remaining lifetime.
	TTLSeconds *int `json:"ttl_seconds,omitempty"`
	// WaitReady blocks until the service answers HealthPath with a 2xx.
	WaitReady bool `json:"wait_ready"`
	// HealthPath is polled when WaitReady (default /health).
	HealthPath *string `json:"health_path,omitempty"`
	// ReadyTimeout bounds the wait, seconds (default 60).
	ReadyTimeout *int `json:"ready_timeout,omitempty"`
}

// ServiceEndpoint is an exposed service: URL authenticates itself (its
// last path segment is a bearer token) until ExpiresAt or revocation.
type ServiceEndpoint struct {
	SandboxID string  `json:"sandbox_id"`
	Port      int     `json:"port"`
	URL       string  `json:"url"`
	ExpiresAt float64 `json:"expires_at"`
}

// ServiceList is the answer of GET /sandboxes/{id}/services.
type ServiceList struct {
	SandboxID string `json:"sandbox_id"`
	Ports     []int  `json:"ports"`
}

// ServiceRevoked is the answer of DELETE /sandboxes/{id}/services/{port}.
type ServiceRevoked struct {
	Status    string `json:"status"`
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
}
