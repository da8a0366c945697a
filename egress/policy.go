package egress

import (
	"net/netip"
	"strings"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
)

// Policy says where a sandbox may connect.
type Policy struct {
	// Allow lists host patterns ("example.com", "*.wikipedia.org"); empty
	// allows every host. A pattern "*.x" matches x and every name under it.
	Allow []string
	// AllowPrefixes are address ranges exempt from the private-range ban:
	// the server's own configuration, never the sandbox's request.
	AllowPrefixes []netip.Prefix
}

// blocked are ranges no sandbox reaches unless the server allows them: the
// host itself, its LAN, link-local (cloud metadata services live there),
// and the address blocks that are never the public internet.
var blocked = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
	"192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8", "64:ff9b:1::/48",
)

// nat64 is the NAT64 well-known prefix (RFC 6052): an address in it is
// the IPv4 address in its last 32 bits, reached through a translator.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// CheckHost refuses a host that the allow-list does not name.
func (p Policy) CheckHost(host string) error {
	host = normalizeHost(host)
	if host == "" {
		return faults.New(faults.CodeEgressDenied, faults.PermissionDenied, faults.Policy, "egress: empty host")
	}
	if len(p.Allow) == 0 {
		return nil
	}
	for _, pat := range p.Allow {
		if faults.MatchHost(pat, host) {
			return nil
		}
	}
	return faults.Newf(faults.CodeEgressDenied, faults.PermissionDenied, faults.Policy,
		"egress to %s is not allowed: the sandbox's egress.allow does not list it", host)
}

// CheckAddr refuses loopback, link-local, private and reserved addresses
// unless the server's configuration allows them.
func (p Policy) CheckAddr(host string, ip netip.Addr) error {
	ip = ip.Unmap()
	if ip.Zone() != "" {
		// A zone names one of the host's interfaces ("::1%lo"), and a
		// netip.Prefix never contains a zoned address: checked against
		// the ranges below it would pass every one of them.
		return faults.Newf(faults.CodeEgressPrivate, faults.PermissionDenied, faults.Policy,
			"egress to %s (%s) is not allowed: sandboxes may not name a host interface", host, ip)
	}
	if nat64.Contains(ip) {
		// Through a translator this is the IPv4 address in its last
		// 32 bits, and is allowed or refused as that address.
		b := ip.As16()
		ip = netip.AddrFrom4([4]byte(b[12:]))
	}
	if p.allowed(ip) {
		return nil
	}
	for _, pre := range blocked {
		if pre.Contains(ip) {
			return faults.Newf(faults.CodeEgressPrivate, faults.PermissionDenied, faults.Policy,
				"egress to %s (%s) is not allowed: sandboxes may not reach loopback, link-local or private addresses", host, ip)
		}
	}
	return nil
}

// allowed reports whether the server's configuration lets sandboxes reach ip.
func (p Policy) allowed(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, pre := range p.AllowPrefixes {
		if pre.Contains(ip) {
			return true
		}
	}
	return false
}

func normalizeHost(h string) string {
	h = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(h), "."))
	return strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
}

// ParsePrefixes parses a comma-separated list of CIDR ranges or addresses
// (the server's EGRESS_ALLOW_PRIVATE setting).
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, err
			}
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		pre, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, pre.Masked())
	}
	return out, nil
}

// ValidatePatterns checks an allow-list from a create request.
func ValidatePatterns(pats []string) error {
	for _, p := range pats {
		if !api.ValidHostPattern(p) {
			return faults.Newf(faults.CodeValidation, faults.InvalidRequest, faults.Client,
				"egress.allow: %q is not a host name or *.domain pattern", p)
		}
	}
	return nil
}
