package egress

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/orchard/orchard/faults"
)

// Gate admits a dial to a host and learns its outcome: the server's
// per-host circuit breaker and rate limit.
type Gate interface {
	Allow(ctx context.Context, host string) (done func(error), err error)
}

// Resolver looks names up (net.DefaultResolver in production).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer dials for sandboxes: it checks the policy, resolves the host,
// refuses addresses the policy bans (after resolution, so a name that
// resolves to 127.0.0.1 is caught and cannot be re-resolved differently),
// and classifies what goes wrong.
type Dialer struct {
	// AllowPrefixes are private ranges the server lets sandboxes reach
	// (EGRESS_ALLOW_PRIVATE), merged into every sandbox's policy by Hub.
	AllowPrefixes []netip.Prefix
	Resolver      Resolver
	// Hosts pins names to addresses before the resolver is asked (the
	// server's EGRESS_HOSTS, like curl --resolve).
	Hosts map[string]netip.Addr
	// Timeout bounds one connect, all addresses included.
	Timeout time.Duration
	Gate    Gate // optional
	Log     *slog.Logger

	own ownAddrs
}

// ownAddrs caches the host's own interface addresses: a connection to one
// of them never leaves the host, whatever range it lies in.
type ownAddrs struct {
	mu  sync.Mutex // guards at, set
	at  time.Time
	set map[netip.Addr]bool
}

// ownAddrsTTL bounds how stale the cache may be (an address the host
// gains, a DHCP renewal).
const ownAddrsTTL = 5 * time.Second

func (o *ownAddrs) has(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.set == nil || time.Since(o.at) > ownAddrsTTL {
		set := map[netip.Addr]bool{}
		if ias, err := net.InterfaceAddrs(); err == nil {
			for _, ia := range ias {
				if pre, err := netip.ParsePrefix(ia.String()); err == nil {
					set[pre.Addr().Unmap()] = true
				}
			}
		}
		o.set, o.at = set, time.Now()
	}
	return o.set[a]
}

// defaultDialTimeout is a connect budget for a site that is slow but up;
// beyond it the navigation's own retry policy decides.
const defaultDialTimeout = 15 * time.Second

// Dial connects to host:port for a sandbox with policy p.
func (d *Dialer) Dial(ctx context.Context, p Policy, host string, port int) (net.Conn, error) {
	host = normalizeHost(host)
	if port <= 0 || port > 65535 {
		return nil, faults.Newf(faults.CodeEgressDenied, faults.InvalidRequest, faults.Policy, "egress: invalid port %d", port)
	}
	if err := p.CheckHost(host); err != nil {
		return nil, err
	}
	timeout := d.Timeout
	if timeout == 0 {
		timeout = defaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	addrs, err := d.resolve(ctx, host)
	if err != nil {
		return nil, classifyDial(err, host)
	}
	for _, a := range addrs {
		if err := p.CheckAddr(host, a); err != nil {
			return nil, err
		}
		if d.own.has(a) && !p.allowed(a) {
			return nil, faults.Newf(faults.CodeEgressPrivate, faults.PermissionDenied, faults.Policy,
				"egress to %s (%s) is not allowed: it is an address of the host itself", host, a)
		}
	}
	done := func(error) {}
	if d.Gate != nil {
		if done, err = d.Gate.Allow(ctx, host); err != nil {
			return nil, err
		}
	}
	var nd net.Dialer
	var lastErr error
	for _, a := range addrs {
		c, err := nd.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			done(nil)
			return c, nil
		}
		lastErr = err
	}
	ferr := classifyDial(lastErr, host)
	done(ferr)
	return nil, ferr
}

func (d *Dialer) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, ok := d.Hosts[host]; ok {
		return []netip.Addr{a}, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	r := d.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	return addrs, nil
}

// ParseHosts parses "name=addr,name2=addr2" (the server's EGRESS_HOSTS).
func ParseHosts(s string) (map[string]netip.Addr, error) {
	out := map[string]netip.Addr{}
	for f := range splitComma(s) {
		name, addr, ok := cutEq(f)
		if !ok {
			return nil, fmt.Errorf("egress hosts: %q is not name=address", f)
		}
		a, err := netip.ParseAddr(addr)
		if err != nil {
			return nil, fmt.Errorf("egress hosts: %q: %w", f, err)
		}
		out[normalizeHost(name)] = a
	}
	return out, nil
}

// SplitHostPort splits "host:port" with a default port.
func SplitHostPort(hostport string, def int) (string, int, error) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport, def, nil //nolint:nilerr // no port given
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, faults.Newf(faults.CodeEgressDenied, faults.InvalidRequest, faults.Policy, "egress: invalid port in %q", hostport)
	}
	return host, port, nil
}
