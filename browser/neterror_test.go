package browser

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/orchard/orchard/faults"
)

// Chromium's net errors (net/base/net_error_list.h) are classified by who
// failed: the site, the network on the way to it, or the policy's URL.
func TestNetErrorClasses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		code      string
		source    faults.Source
		retryable bool
	}{
		// The resolver answered that the name does not exist.
		{"ERR_NAME_NOT_RESOLVED", faults.CodeSiteDNS, faults.Site, true},
		// The resolver itself failed (on Linux, getaddrinfo failed with
		// other than EAI_NONAME/EAI_NODATA; the DNS client timed out or got
		// SERVFAIL): the network's fault, as egress classifies it.
		{"ERR_NAME_RESOLUTION_FAILED", faults.CodeNetworkDNS, faults.Network, true},
		{"ERR_DNS_TIMED_OUT", faults.CodeNetworkDNS, faults.Network, true},
		{"ERR_DNS_SERVER_FAILED", faults.CodeNetworkDNS, faults.Network, true},
		{"ERR_DNS_MALFORMED_RESPONSE", faults.CodeNetworkDNS, faults.Network, true},
		{"ERR_CONNECTION_REFUSED", faults.CodeSiteConnectionRefused, faults.Site, true},
		{"ERR_CONNECTION_RESET", faults.CodeSiteConnectionReset, faults.Site, true},
		{"ERR_CONNECTION_CLOSED", faults.CodeSiteConnectionClosed, faults.Site, true},
		{"ERR_EMPTY_RESPONSE", faults.CodeSiteConnectionClosed, faults.Site, true},
		{"ERR_CERT_AUTHORITY_INVALID", faults.CodeSiteTLS, faults.Site, false},
		{"ERR_SSL_PROTOCOL_ERROR", faults.CodeSiteTLS, faults.Site, false},
		// Certificate-range (-214) and handshake errors without the
		// ERR_CERT_/ERR_SSL_ prefix: still the site's TLS, not worth a retry.
		{"ERR_CERTIFICATE_TRANSPARENCY_REQUIRED", faults.CodeSiteTLS, faults.Site, false},
		{"ERR_TLS13_DOWNGRADE_DETECTED", faults.CodeSiteTLS, faults.Site, false},
		{"ERR_TIMED_OUT", faults.CodeSiteTimeout, faults.Site, true},
		{"ERR_CONNECTION_TIMED_OUT", faults.CodeSiteTimeout, faults.Site, true},
		{"ERR_ADDRESS_UNREACHABLE", faults.CodeSiteUnreachable, faults.Site, true},
		{"ERR_INTERNET_DISCONNECTED", faults.CodeNetworkOffline, faults.Network, true},
		{"ERR_PROXY_CONNECTION_FAILED", faults.CodeNetworkProxy, faults.Network, true},
		{"ERR_TUNNEL_CONNECTION_FAILED", faults.CodeNetworkProxy, faults.Network, true},
		{"ERR_BLOCKED_BY_CLIENT", faults.CodeNavigationBlocked, faults.Policy, false},
		{"ERR_ABORTED", faults.CodeNavigationAborted, faults.Site, false},
		{"ERR_INVALID_URL", faults.CodeNavigationInvalidURL, faults.Policy, false},
		{"ERR_HTTP2_PROTOCOL_ERROR", faults.CodeNavigationFailed, faults.Site, true},
		// A redirect loop or a redirect to a bad URL fails the same way
		// every time: a retry only burns the budget.
		{"ERR_TOO_MANY_REDIRECTS", faults.CodeNavigationFailed, faults.Site, false},
		{"ERR_INVALID_REDIRECT", faults.CodeNavigationFailed, faults.Site, false},
		{"ERR_UNSAFE_REDIRECT", faults.CodeNavigationFailed, faults.Site, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := netError("net::"+c.name, "https://example.test/")
			if f.Code != c.code || f.Source != c.source || f.Retryable != c.retryable {
				t.Errorf("%s: %s from %s retryable=%v, want %s from %s retryable=%v",
					c.name, f.Code, f.Source, f.Retryable, c.code, c.source, c.retryable)
			}
			// The class must agree with the registry's for the code.
			if info, ok := faults.Lookup(f.Code); !ok {
				t.Errorf("%s: code %s not in the registry", c.name, f.Code)
			} else if info.Category != f.Category {
				t.Errorf("%s: category %s, registry says %s", c.name, f.Category, info.Category)
			}
		})
	}
}

// A redirect loop fails every attempt alike: a navigation retry policy
// must give up after the first.
func TestRedirectLoopIsNotRetried(t *testing.T) {
	s := openPage(t, "/basic.html")
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/favicon.ico" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		http.Redirect(w, r, "/loop", http.StatusFound)
	}))
	defer srv.Close()
	res, err := s.Do(ctxT(t), []Action{{Type: ActNavigate, URL: srv.URL + "/loop",
		Retry: &RetryPolicy{Attempts: 3, InitialMS: 50, MaxMS: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if r.OK || r.Error == nil || r.Error.Code != faults.CodeNavigationFailed || r.Error.Retryable || r.Attempts != 1 {
		t.Fatalf("redirect loop: ok=%v attempts=%d error=%+v (%d requests), want navigation.failed, not retryable, 1 attempt",
			r.OK, r.Attempts, r.Error, hits.Load())
	}
}
