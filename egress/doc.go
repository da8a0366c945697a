// Package egress gives sandboxes controlled network access: an HTTP/HTTPS
// proxy the agent runs on a loopback port inside the sandbox, a dialer that
// enforces the allow-list and keeps sandboxes off private addresses, the
// tunnel that carries connections from the agent to the server that dials
// them (local runtime: the sandbox's network namespace has no route out),
// a per-sandbox connection log exportable as HAR, and network fault
// injection for testing attribution.
//
// The proxy runs wherever the agent does; only its dial function differs:
// through the server, which hands the agent a socket spliced to the
// connection it dialed (or relays it over the tunnel's streams), or direct
// where the sandbox has a network of its own (Kubernetes pods). The server side re-checks every
// dial against the policy, since code inside a sandbox can speak to the
// tunnel itself.
package egress
