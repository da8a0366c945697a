package client

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/orchard/orchard/faults"
)

// errorBody is an error response. Orchard sends the classified `error`
// object next to `detail`; Orchard Env sends `detail` alone, and its
// unhandled-exception body has `error` as a string.
type errorBody struct {
	Detail    any             `json:"detail"`
	Error     json.RawMessage `json:"error"`
	ErrorInfo *faults.Info    `json:"error_info"`
}

// decodeError turns a non-2xx response into a *faults.Error: the server's
// own classification when the body carries one, else one derived from the
// status and the detail text.
func decodeError(status int, body []byte) *faults.Error {
	var eb errorBody
	if json.Unmarshal(body, &eb) != nil {
		eb = errorBody{}
		if len(strings.TrimSpace(string(body))) > 0 {
			eb.Detail = fmt.Sprintf("HTTP %d %s: %s", status, http.StatusText(status), snippet(body))
		}
	}
	var info *faults.Info
	if len(eb.Error) > 0 && eb.Error[0] == '{' {
		var i faults.Info
		if json.Unmarshal(eb.Error, &i) == nil && i.Category != "" {
			info = &i
		}
	}
	if info == nil && eb.ErrorInfo != nil && eb.ErrorInfo.Category != "" {
		info = eb.ErrorInfo
	}
	if info != nil {
		e := faults.FromInfo(*info, status)
		if e.Message == "" {
			e.Message = detailText(eb.Detail, status)
		}
		e.Detail = eb.Detail
		return e
	}
	msg := detailText(eb.Detail, status)
	cat, src, code := classifyStatus(status, msg)
	e := faults.New(code, cat, src, msg).WithStatus(status)
	e.Detail = eb.Detail
	return e
}

// classifyStatus classifies a response that carries no `error` object
// (Orchard Env's server, a proxy). Orchard Env's 404 texts are fixed
// (ORCHARD_COMPAT §3), so they name what was not found.
func classifyStatus(status int, detail string) (faults.Category, faults.Source, string) {
	switch status {
	case http.StatusBadRequest:
		if strings.HasSuffix(detail, "is not ready") {
			return faults.InvalidRequest, faults.Sandbox, faults.CodeSandboxNotReady
		}
		return faults.InvalidRequest, faults.Client, faults.CodeValidation
	case http.StatusUnauthorized:
		return faults.Unauthenticated, faults.Client, faults.CodeUnauthenticated
	case http.StatusForbidden:
		return faults.PermissionDenied, faults.Client, faults.CodeForbidden
	case http.StatusNotFound:
		switch {
		case strings.HasPrefix(detail, "Sandbox ") && strings.HasSuffix(detail, "agent not ready"):
			return faults.NotFound, faults.Sandbox, faults.CodeAgentNotReady
		case strings.HasPrefix(detail, "Sandbox "):
			return faults.NotFound, faults.Client, faults.CodeSandboxNotFound
		case strings.HasPrefix(detail, "Job "):
			return faults.NotFound, faults.Client, faults.CodeJobNotFound
		case strings.HasPrefix(detail, "File not found"):
			return faults.NotFound, faults.Client, faults.CodeFileNotFound
		case strings.HasPrefix(detail, "Path not found"):
			return faults.NotFound, faults.Client, faults.CodePathNotFound
		}
		return faults.NotFound, faults.Client, faults.CodeRouteNotFound
	case http.StatusMethodNotAllowed:
		return faults.InvalidRequest, faults.Client, faults.CodeMethodNotAllowed
	case http.StatusRequestTimeout:
		// Only the sandbox wait answers 408 (ORCHARD_COMPAT §3.6).
		return faults.Timeout, faults.Sandbox, faults.CodeWaitTimeout
	case http.StatusConflict:
		return faults.Conflict, faults.Client, faults.CodeSandboxExists
	case http.StatusRequestEntityTooLarge:
		return faults.TooLarge, faults.Client, faults.CodeTooLarge
	case http.StatusUnprocessableEntity:
		return faults.InvalidRequest, faults.Client, faults.CodeValidation
	case http.StatusTooManyRequests:
		return faults.Capacity, faults.Platform, faults.CodeCapacity
	case 499:
		return faults.Canceled, faults.Client, faults.CodeCanceled
	case http.StatusNotImplemented:
		return faults.NotImplemented, faults.Platform, faults.CodeInternal
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return faults.Unavailable, faults.Platform, faults.CodeUnreachable
	case http.StatusGatewayTimeout:
		return faults.Timeout, faults.Platform, faults.CodeTimeout
	}
	if status >= 500 {
		return faults.Internal, faults.Platform, faults.CodeInternal
	}
	return faults.InvalidRequest, faults.Client, faults.CodeValidation
}

// detailText is a one-line message from a `detail` field: a string as it
// is, FastAPI's validation list by its first entry.
func detailText(detail any, status int) string {
	switch d := detail.(type) {
	case string:
		if d != "" {
			return d
		}
	case []any:
		if len(d) > 0 {
			if m, ok := d[0].(map[string]any); ok {
				msg, _ := m["msg"].(string)
				if loc, ok := m["loc"].([]any); ok && len(loc) > 0 {
					parts := make([]string, len(loc))
					for i, p := range loc {
						parts[i] = fmt.Sprint(p)
					}
					return fmt.Sprintf("%s: %s", strings.Join(parts, "."), msg)
				}
				if msg != "" {
					return msg
				}
			}
		}
	}
	return fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
}

// unreachable classifies a failure to reach the server or to read its
// answer. Certificate problems do not go away by retrying; everything else
// (refused, reset, EOF, DNS) may.
func unreachable(base string, err error) *faults.Error {
	e := faults.Wrap(err, faults.CodeUnreachable, faults.Unavailable, faults.Platform,
		"orchard server unreachable at "+base)
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	if errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) {
		e.Retryable = false
	}
	return e
}

// retryAfter parses a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(h string) time.Duration {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0
	}
	if s, err := strconv.Atoi(h); err == nil {
		return max(time.Duration(s)*time.Second, 0)
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// snippet is the start of a body, for messages about bodies that are not
// what was expected.
func snippet(b []byte) string {
	const n = 200
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = s[:n]
		for !utf8.ValidString(s) && len(s) > 0 {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	if s == "" {
		return "empty body"
	}
	return s
}
