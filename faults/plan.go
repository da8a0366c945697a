package faults

import (
	"fmt"
	"path"
	"strings"
)

// Fault kinds a plan can inject. Strings are API.
const (
	InjectHTTPStatus      = "http_status"
	InjectLatency         = "latency"
	InjectDNSFailure      = "dns_failure"
	InjectConnectionReset = "connection_reset"
	InjectBrowserCrash    = "browser_crash"
	InjectHang            = "hang"
	InjectAgentKill       = "agent_kill"
	InjectOOM             = "oom"
)

// Plan is a fault plan: faults to inject into one sandbox or episode, for
// testing the layers that must attribute them.
type Plan struct {
	Faults []Injection `json:"faults"`
}

// Injection is one kind of fault and when it fires.
type Injection struct {
	Kind string `json:"kind"`
	// P is the probability that a matching event (a connection for the
	// network kinds, an action or exec step for the others) gets the fault.
	P float64 `json:"p"`
	// AfterSteps holds the fault back until that many steps have run,
	// counted per kind of step: execs for oom, browser actions for
	// browser_crash and hang, either for agent_kill (the kind of request
	// it fires on); every step for the network kinds.
	AfterSteps int `json:"after_steps,omitempty"`
	// Match is a host pattern ("example.com", "*.example.com") for the
	// network kinds; empty matches every host.
	Match string `json:"match,omitempty"`
	// Status is the HTTP status of http_status (default 503).
	Status int `json:"status,omitempty"`
	// LatencyMS is the delay added by latency (default 1000).
	LatencyMS int `json:"latency_ms,omitempty"`
	// Times caps how often the fault fires; 0 is unlimited.
	Times int `json:"times,omitempty"`
}

// Validate checks the plan and fills defaults.
func (p *Plan) Validate() error {
	if p == nil {
		return nil
	}
	for i := range p.Faults {
		f := &p.Faults[i]
		bad := func(format string, a ...any) error {
			return Newf(CodeFaultPlanInvalid, InvalidRequest, Client, "faults[%d]: "+format, append([]any{i}, a...)...)
		}
		switch f.Kind {
		case InjectHTTPStatus:
			if f.Status == 0 {
				f.Status = 503
			}
			if f.Status < 400 || f.Status > 599 {
				return bad("status %d is not an HTTP error status", f.Status)
			}
		case InjectLatency:
			if f.LatencyMS == 0 {
				f.LatencyMS = 1000
			}
			if f.LatencyMS < 0 || f.LatencyMS > 600_000 {
				return bad("latency_ms %d is outside 0..600000", f.LatencyMS)
			}
		case InjectDNSFailure, InjectConnectionReset, InjectBrowserCrash, InjectHang, InjectAgentKill, InjectOOM:
		default:
			return bad("unknown kind %q (want one of %s)", f.Kind, strings.Join(InjectKinds(), ", "))
		}
		if f.P < 0 || f.P > 1 {
			return bad("p %v is outside 0..1", f.P)
		}
		if f.AfterSteps < 0 || f.Times < 0 {
			return bad("after_steps and times must not be negative")
		}
		if f.Match != "" {
			if _, err := path.Match(f.Match, "x"); err != nil {
				return bad("match %q: %v", f.Match, err)
			}
		}
	}
	return nil
}

// InjectKinds lists the kinds a plan accepts.
func InjectKinds() []string {
	return []string{InjectHTTPStatus, InjectLatency, InjectDNSFailure, InjectConnectionReset,
		InjectBrowserCrash, InjectHang, InjectAgentKill, InjectOOM}
}

// IsNetwork reports whether kind fires on connections rather than steps.
func IsNetwork(kind string) bool {
	switch kind {
	case InjectHTTPStatus, InjectLatency, InjectDNSFailure, InjectConnectionReset:
		return true
	}
	return false
}

// MatchHost reports whether host matches pattern: an exact name, or
// "*.example.com" for example.com and any name under it. Case-insensitive;
// an empty pattern matches everything.
func MatchHost(pattern, host string) bool {
	if pattern == "" || pattern == "*" {
		return true
	}
	// A fully qualified name's trailing dot, on either side, names the
	// same host.
	pattern, host = strings.ToLower(strings.TrimSuffix(pattern, ".")), strings.ToLower(strings.TrimSuffix(host, "."))
	if rest, ok := strings.CutPrefix(pattern, "*."); ok {
		return host == rest || strings.HasSuffix(host, "."+rest)
	}
	ok, _ := path.Match(pattern, host)
	return ok
}

// Truth is what a fault plan injected: the attribution a correct system
// reports for it. Results that met an injected fault carry it, so a chaos
// run can score attribution against it.
type Truth struct {
	Kind   string `json:"kind"`
	Source Source `json:"source"`
	Code   string `json:"code"`
	Host   string `json:"host,omitempty"`
	Step   int    `json:"step,omitempty"`
}

// TruthOf is the attribution a correct system gives an injected fault.
func TruthOf(f Injection) Truth {
	t := Truth{Kind: f.Kind}
	switch f.Kind {
	case InjectHTTPStatus:
		t.Source, t.Code = Site, fmt.Sprintf("%s%d", CodeSiteHTTPPrefix, f.Status)
	case InjectLatency:
		// A delayed site makes the page miss its load deadline.
		t.Source, t.Code = Site, CodeNavigationTimeout
	case InjectDNSFailure:
		t.Source, t.Code = Site, CodeSiteDNS
	case InjectConnectionReset:
		t.Source, t.Code = Site, CodeSiteConnectionReset
	case InjectBrowserCrash:
		t.Source, t.Code = Browser, CodeBrowserCrashed
	case InjectHang:
		t.Source, t.Code = Browser, CodeBrowserHung
	case InjectAgentKill:
		// The agent is the sandbox's first process: the sandbox ends with it.
		t.Source, t.Code = Sandbox, CodeSandboxDied
	case InjectOOM:
		t.Source, t.Code = Sandbox, CodeOOM
	}
	return t
}
