package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/orchard/orchard/faults"
)

// classifyDial turns a dial or resolve error for host into a fault whose
// source is decided by evidence: a resolver that answered "no such name"
// blames the site, one that could not answer blames the network.
func classifyDial(err error, host string) error {
	if _, ok := errors.AsType[*faults.Error](err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) {
		// The caller gave up, also while the name was still resolving (a
		// *net.DNSError wrapping the cancellation): no evidence against the
		// resolver or the site.
		return faults.Wrap(err, faults.CodeCanceled, faults.Canceled, faults.Client, "connect canceled")
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		if dnsErr.IsNotFound {
			return faults.Wrap(err, faults.CodeSiteDNS, faults.Unavailable, faults.Site,
				fmt.Sprintf("dns: %s does not exist", host)).WithRetryable(false)
		}
		return faults.Wrap(err, faults.CodeNetworkDNS, faults.Unavailable, faults.Network,
			fmt.Sprintf("dns: resolving %s failed", host))
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return faults.Wrap(err, faults.CodeSiteConnectionRefused, faults.Unavailable, faults.Site,
			fmt.Sprintf("connect %s: connection refused", host))
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return faults.Wrap(err, faults.CodeSiteConnectionReset, faults.Unavailable, faults.Site,
			fmt.Sprintf("connect %s: connection reset", host))
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.EHOSTDOWN):
		return faults.Wrap(err, faults.CodeSiteUnreachable, faults.Unavailable, faults.Site,
			fmt.Sprintf("connect %s: host unreachable", host))
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.ENETDOWN):
		return faults.Wrap(err, faults.CodeNetworkOffline, faults.Unavailable, faults.Network,
			fmt.Sprintf("connect %s: no route to the network", host))
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), isTimeout(err):
		return faults.Wrap(err, faults.CodeSiteTimeout, faults.Timeout, faults.Site,
			fmt.Sprintf("connect %s: timed out", host))
	}
	return faults.Wrap(err, faults.CodeSiteUnreachable, faults.Unavailable, faults.Site,
		fmt.Sprintf("connect %s failed", host))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
