package main

import (
	"fmt"
	"log/slog"

	"github.com/orchard/orchard/agentclient"
	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/sitehealth"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/redis"
)

// newEgressHub builds the dialer that network-enabled sandboxes reach the
// world through, from EGRESS_ALLOW_PRIVATE and EGRESS_HOSTS.
func newEgressHub(cfg Config, gate egress.Gate, log *slog.Logger) (*egress.Hub, error) {
	allow, err := egress.ParsePrefixes(cfg.EgressAllowPrivate)
	if err != nil {
		return nil, fmt.Errorf("EGRESS_ALLOW_PRIVATE: %w", err)
	}
	hosts, err := egress.ParseHosts(cfg.EgressHosts)
	if err != nil {
		return nil, fmt.Errorf("EGRESS_HOSTS: %w", err)
	}
	d := &egress.Dialer{AllowPrefixes: allow, Hosts: hosts, Gate: gate, Log: log}
	return egress.NewHub(d, agentclient.DialRaw, log.With("component", "egress")), nil
}

// newSiteHealth builds the per-host breakers: in Redis when the store is,
// so every replica sees a site go down at once.
func newSiteHealth(cfg Config, st store.Store, log *slog.Logger) (*sitehealth.Tracker, error) {
	var b sitehealth.Backend = sitehealth.NewMemory()
	if rs, ok := st.(*redis.Store); ok {
		b = rs.SiteHealth()
	}
	return sitehealth.New(b, cfg.SiteHealth, log.With("component", "sitehealth"))
}
