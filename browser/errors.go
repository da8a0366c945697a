package browser

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/chromedp"

	"github.com/orchard/orchard/faults"
)

// Causes of an interrupted call, kept with context.WithCancelCause so that
// the classifier can tell them from a caller's cancellation.
var (
	errCallTimeout = errors.New("browser call timed out")
	errDialogOpen  = errors.New("a JavaScript dialog opened")
	errTabCrashed  = errors.New("the tab's renderer crashed")
	errTabClosed   = errors.New("the tab was closed")
)

func errInvalid(format string, args ...any) *faults.Error {
	return faults.Newf(faults.CodeActionInvalid, faults.InvalidRequest, faults.Policy, format, args...)
}

func errNoSuchElement(format string, args ...any) *faults.Error {
	return faults.Newf(faults.CodeActionNoSuchElement, faults.ActionFailed, faults.Policy, format, args...)
}

func errStaleElement(id int) *faults.Error {
	return faults.Newf(faults.CodeActionStaleElement, faults.ActionFailed, faults.Policy,
		"element %d is from an earlier page: observe again", id)
}

func errClosed() *faults.Error {
	return faults.New(faults.CodeBrowserClosed, faults.Unavailable, faults.Browser, "the browser session is closed").WithRetryable(false)
}

// classify turns an error from a protocol call into a faults.Error. what
// names the operation for the message ("click", "screenshot"). It keeps an
// error that is classified already.
func (s *Session) classify(ctx context.Context, t *tab, what string, err error) *faults.Error {
	if err == nil {
		return nil
	}
	var fe *faults.Error
	if errors.As(err, &fe) {
		return fe
	}
	if s.isClosing() {
		return errClosed()
	}
	if ce := s.crashError(); ce != nil {
		return ce
	}
	if lost(s) || isExit(err) {
		return s.markCrashed(err)
	}
	if t != nil {
		if t.isCrashed() || errors.Is(err, errTabCrashed) {
			return faults.Wrap(err, faults.CodeBrowserTabCrashed, faults.Unavailable, faults.Browser,
				what+": the tab's renderer crashed; navigate to revive it")
		}
		if errors.Is(err, errTabClosed) || errors.Is(err, chromedp.ErrTargetDetached) {
			return faults.Wrap(err, faults.CodeActionNoSuchTab, faults.ActionFailed, faults.Policy, what+": the tab was closed")
		}
	}
	if ctx.Err() != nil {
		cause := context.Cause(ctx)
		switch {
		case errors.Is(cause, errCallTimeout):
			if s.hung() {
				return s.markHung(err)
			}
			return faults.Wrap(err, faults.CodeBrowserTimeout, faults.Timeout, faults.Browser,
				what+": the browser did not answer in time")
		case errors.Is(cause, errDialogOpen):
			return faults.Wrap(err, faults.CodeActionDialogOpen, faults.Conflict, faults.Policy,
				what+": a JavaScript dialog is open: answer it with the dialog action")
		case errors.Is(cause, errTabCrashed):
			return faults.Wrap(err, faults.CodeBrowserTabCrashed, faults.Unavailable, faults.Browser,
				what+": the tab's renderer crashed; navigate to revive it")
		case errors.Is(cause, errTabClosed):
			return faults.Wrap(err, faults.CodeActionNoSuchTab, faults.ActionFailed, faults.Policy, what+": the tab was closed")
		}
		// The caller gave up: keep its reason.
		return faults.Of(cause)
	}
	var pe *cdproto.Error
	if errors.As(err, &pe) {
		return faults.Wrap(err, faults.CodeBrowserProtocol, faults.Internal, faults.Browser,
			fmt.Sprintf("%s: browser error: %s", what, pe.Message))
	}
	return faults.Wrap(err, faults.CodeBrowserProtocol, faults.Internal, faults.Browser, what+": browser call failed")
}

// lost reports whether the connection to the browser is gone.
func lost(s *Session) bool {
	b := s.browser()
	if b == nil {
		return false
	}
	select {
	case <-b.LostConnection:
		return true
	default:
		return false
	}
}

func isExit(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}

// netError classifies a Chromium net error ("net::ERR_NAME_NOT_RESOLVED")
// met while loading url. The list follows net/base/net_error_list.h.
func netError(errorText, url string) *faults.Error {
	name := strings.TrimPrefix(strings.TrimSpace(errorText), "net::")
	msg := fmt.Sprintf("load %s: %s", url, errorText)
	e := func(code string, cat faults.Category, src faults.Source) *faults.Error {
		return faults.New(code, cat, src, msg)
	}
	switch {
	case name == "ERR_NAME_NOT_RESOLVED":
		// The resolver answered that the name does not exist.
		return e(faults.CodeSiteDNS, faults.Unavailable, faults.Site)
	case name == "ERR_NAME_RESOLUTION_FAILED", name == "ERR_DNS_TIMED_OUT", name == "ERR_DNS_SERVER_FAILED",
		name == "ERR_DNS_MALFORMED_RESPONSE", name == "ERR_DNS_SERVER_REQUIRES_TCP",
		name == "ERR_DNS_SECURE_RESOLVER_HOSTNAME_RESOLUTION_FAILED":
		// The resolver itself failed: on Linux, getaddrinfo failed with other
		// than EAI_NONAME/EAI_NODATA (EAI_AGAIN: no server answered); the DNS
		// client timed out, got SERVFAIL or a malformed answer. The network's
		// fault, as egress classifies it (network.dns).
		return e(faults.CodeNetworkDNS, faults.Unavailable, faults.Network)
	case name == "ERR_CONNECTION_REFUSED":
		return e(faults.CodeSiteConnectionRefused, faults.Unavailable, faults.Site)
	case name == "ERR_CONNECTION_RESET", name == "ERR_CONNECTION_ABORTED":
		return e(faults.CodeSiteConnectionReset, faults.Unavailable, faults.Site)
	case name == "ERR_CONNECTION_CLOSED", name == "ERR_EMPTY_RESPONSE":
		return e(faults.CodeSiteConnectionClosed, faults.Unavailable, faults.Site)
	case strings.HasPrefix(name, "ERR_CERT_"), strings.HasPrefix(name, "ERR_SSL_"), name == "ERR_BAD_SSL_CLIENT_AUTH_CERT",
		name == "ERR_CERTIFICATE_TRANSPARENCY_REQUIRED", name == "ERR_TLS13_DOWNGRADE_DETECTED",
		name == "ERR_INSECURE_RESPONSE", name == "ERR_CLIENT_AUTH_CERT_TYPE_UNSUPPORTED", name == "ERR_NO_SSL_VERSIONS_ENABLED":
		return e(faults.CodeSiteTLS, faults.Unavailable, faults.Site).WithRetryable(false)
	case name == "ERR_TIMED_OUT", name == "ERR_CONNECTION_TIMED_OUT":
		return e(faults.CodeSiteTimeout, faults.Timeout, faults.Site)
	case name == "ERR_ADDRESS_UNREACHABLE", name == "ERR_NETWORK_ACCESS_DENIED", name == "ERR_ADDRESS_INVALID":
		return e(faults.CodeSiteUnreachable, faults.Unavailable, faults.Site)
	case name == "ERR_INTERNET_DISCONNECTED", name == "ERR_NETWORK_CHANGED":
		return e(faults.CodeNetworkOffline, faults.Unavailable, faults.Network)
	case strings.HasPrefix(name, "ERR_PROXY_"), name == "ERR_TUNNEL_CONNECTION_FAILED":
		return e(faults.CodeNetworkProxy, faults.Unavailable, faults.Network)
	case name == "ERR_INVALID_URL", name == "ERR_UNKNOWN_URL_SCHEME", name == "ERR_DISALLOWED_URL_SCHEME":
		return e(faults.CodeNavigationInvalidURL, faults.InvalidRequest, faults.Policy)
	case name == "ERR_BLOCKED_BY_CLIENT", name == "ERR_BLOCKED_BY_ADMINISTRATOR", name == "ERR_BLOCKED_BY_RESPONSE",
		name == "ERR_UNSAFE_PORT", name == "ERR_ACCESS_DENIED":
		return e(faults.CodeNavigationBlocked, faults.ActionFailed, faults.Policy)
	case name == "ERR_ABORTED":
		return e(faults.CodeNavigationAborted, faults.ActionFailed, faults.Site)
	case name == "ERR_TOO_MANY_REDIRECTS", name == "ERR_INVALID_REDIRECT", name == "ERR_UNSAFE_REDIRECT":
		// A redirect loop, or a redirect to a URL that cannot be loaded,
		// fails the same way every time: the site's fault, but a retry only
		// spends the budget.
		return e(faults.CodeNavigationFailed, faults.Unavailable, faults.Site).WithRetryable(false)
	}
	return e(faults.CodeNavigationFailed, faults.Unavailable, faults.Site)
}

// httpError classifies a main document answered with an HTTP error status.
// Server errors and 429 are the site's transient faults; other 4xx are the
// site's answer to what was asked, not worth a retry.
func httpError(status int, statusText, url string) *faults.Error {
	code := faults.CodeSiteHTTPPrefix + strconv.Itoa(status)
	msg := fmt.Sprintf("load %s: HTTP %d %s", url, status, statusText)
	if status >= 500 || status == 429 {
		return faults.New(code, faults.Unavailable, faults.Site, strings.TrimSpace(msg))
	}
	return faults.New(code, faults.ActionFailed, faults.Site, strings.TrimSpace(msg))
}
