// Package faults is Orchard's error model: every failure carries a category
// (what happened), a source (who is responsible), a stable code, whether a
// retry can help, and a message that is safe to show to users. The class
// survives wrapping (errors.As) and crosses process boundaries as Info.
package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// Category says what kind of failure happened. Strings are API: add, never rename.
type Category string

// Categories.
const (
	InvalidRequest   Category = "invalid_request"
	Unauthenticated  Category = "unauthenticated"
	PermissionDenied Category = "permission_denied"
	NotFound         Category = "not_found"
	Conflict         Category = "conflict"
	TooLarge         Category = "too_large"
	Capacity         Category = "capacity"
	Unavailable      Category = "unavailable"
	Timeout          Category = "timeout"
	ActionFailed     Category = "action_failed"
	NotImplemented   Category = "not_implemented"
	Internal         Category = "internal"
	Canceled         Category = "canceled"
)

// Source says who is responsible for a failure. Strings are API.
type Source string

// Sources.
const (
	Policy   Source = "policy"
	Site     Source = "site"
	Network  Source = "network"
	Browser  Source = "browser"
	Desktop  Source = "desktop"
	Sandbox  Source = "sandbox"
	Platform Source = "platform"
	Task     Source = "task"
	Client   Source = "client"
)

// Error is a classified failure.
type Error struct {
	Category  Category
	Source    Source
	Code      string
	Message   string // safe to show to users
	Retryable bool
	// Status overrides the HTTP status derived from Category. Only HTTP
	// layers set it: the status of an answer the error was decoded from
	// (FromInfo), or one a handler fixes (a 405, a refused WebSocket
	// handshake). Statuses that Orchard Env's contract fixes by code are
	// the server's renderer's business, not the error's.
	Status int
	// Detail overrides the `detail` field of the HTTP body (FastAPI's
	// validation list, for example). Nil means Message.
	Detail any
	Err    error // internal cause: logged, never sent
}

func (e *Error) Error() string {
	if e.Err != nil {
		if e.Message == "" {
			return e.Err.Error()
		}
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// New returns a classified error with the retryability of its code.
func New(code string, cat Category, src Source, msg string) *Error {
	return &Error{Category: cat, Source: src, Code: code, Message: msg, Retryable: defaultRetryable(cat)}
}

// Newf is New with a formatted message.
func Newf(code string, cat Category, src Source, format string, args ...any) *Error {
	return New(code, cat, src, fmt.Sprintf(format, args...))
}

// Wrap classifies err. The message is what users see; err stays internal.
func Wrap(err error, code string, cat Category, src Source, msg string) *Error {
	e := New(code, cat, src, msg)
	e.Err = err
	return e
}

// WithStatus returns e with its HTTP status fixed (see Error.Status).
func (e *Error) WithStatus(status int) *Error { e.Status = status; return e }

// WithRetryable returns e with retryability set explicitly.
func (e *Error) WithRetryable(r bool) *Error { e.Retryable = r; return e }

func defaultRetryable(c Category) bool {
	switch c {
	case Capacity, Unavailable, Timeout:
		return true
	}
	return false
}

// Of returns the outermost classified error in err's chain. An unclassified
// error is internal, source platform; context errors map to canceled/timeout.
func Of(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return Wrap(err, CodeTimeout, Timeout, Platform, "operation timed out")
	case errors.Is(err, context.Canceled):
		return Wrap(err, CodeCanceled, Canceled, Client, "operation canceled")
	}
	return Wrap(err, CodeInternal, Internal, Platform, "internal error")
}

// IsRetryable reports whether err is classified retryable.
func IsRetryable(err error) bool {
	e := Of(err)
	return e != nil && e.Retryable
}

// Is reports whether err's class has the given code.
func Is(err error, code string) bool {
	e := Of(err)
	return e != nil && e.Code == code
}

// HTTPStatus is the status a category maps to.
func HTTPStatus(c Category) int {
	switch c {
	case InvalidRequest:
		return http.StatusBadRequest
	case Unauthenticated:
		return http.StatusUnauthorized
	case PermissionDenied:
		return http.StatusForbidden
	case NotFound:
		return http.StatusNotFound
	case Conflict:
		return http.StatusConflict
	case TooLarge:
		return http.StatusRequestEntityTooLarge
	case Capacity, Unavailable:
		return http.StatusServiceUnavailable
	case Timeout:
		return http.StatusGatewayTimeout
	case ActionFailed:
		return http.StatusUnprocessableEntity
	case NotImplemented:
		return http.StatusNotImplemented
	case Canceled:
		return 499
	}
	return http.StatusInternalServerError
}

// StatusOf is the HTTP status for e.
func (e *Error) StatusOf() int {
	if e.Status != 0 {
		return e.Status
	}
	return HTTPStatus(e.Category)
}

// Info is the wire form of an Error: the `error` object of every error body.
type Info struct {
	Category  Category `json:"category"`
	Source    Source   `json:"source"`
	Code      string   `json:"code"`
	Message   string   `json:"message"`
	Retryable bool     `json:"retryable"`
}

// Info returns the wire form of e (no internal cause).
func (e *Error) Info() Info {
	return Info{Category: e.Category, Source: e.Source, Code: e.Code, Message: e.Message, Retryable: e.Retryable}
}

// FromInfo rebuilds an Error received from another process.
func FromInfo(i Info, status int) *Error {
	return &Error{Category: i.Category, Source: i.Source, Code: i.Code, Message: i.Message, Retryable: i.Retryable, Status: status}
}

// Envelope is the JSON body of every error response: Orchard's `detail`
// plus the classified `error` object.
type Envelope struct {
	Detail any   `json:"detail"`
	Error  *Info `json:"error,omitempty"`
}

// EnvelopeOf builds the body for e.
func EnvelopeOf(e *Error) Envelope {
	info := e.Info()
	var detail any = e.Message
	if e.Detail != nil {
		detail = e.Detail
	}
	return Envelope{Detail: detail, Error: &info}
}
