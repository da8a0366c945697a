package server

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/server/manager"
)

// renderError is the one place where errors become HTTP responses: status
// from the category (or the compat tables below), body {"detail",
// "error"}, Retry-After on capacity and unavailability. Internal causes
// are logged, never sent. The error is attached to the request, where the
// metrics middleware counts it.
func renderError(c *gin.Context, log *slog.Logger, err error) {
	renderErrorOn(c, log, err, nil)
}

// renderErrorOn is renderError for a route that answers some codes with
// statuses of its own (route.statuses).
func renderErrorOn(c *gin.Context, log *slog.Logger, err error, routeStatus map[string]int) {
	f := faults.Of(err)
	_ = c.Error(f)
	status := statusOn(f, routeStatus)
	if status >= 500 && f.Category == faults.Internal {
		log.Error("request failed", "request_id", c.GetString(requestIDKey), "path", c.FullPath(),
			"code", f.Code, "category", f.Category, "source", f.Source, "err", err)
	} else if f.Err != nil {
		log.Debug("request error", "request_id", c.GetString(requestIDKey), "code", f.Code, "err", err)
	}
	if status == http.StatusServiceUnavailable || f.Category == faults.Capacity {
		c.Header("Retry-After", "5")
	}
	c.AbortWithStatusJSON(status, faults.EnvelopeOf(f))
}

// codeStatus holds the codes that Orchard Env (ORCHARD_COMPAT.md) answers
// on every route with a status other than their category's. The error
// object still says what the failure is; only the status follows the wire
// contract the SDK reads.
var codeStatus = map[string]int{
	// §3.6: GET /sandboxes/{id}/wait that times out is a 408, which the
	// SDK turns into TimeoutError (and deletes the sandbox); a timeout's
	// category would answer 504.
	faults.CodeWaitTimeout: http.StatusRequestTimeout,
	// §3.10: exec on a sandbox whose agent is not ready is a 404 ("agent
	// not ready"); the failure itself is an unavailable sandbox (503).
	faults.CodeAgentNotReady: http.StatusNotFound,
	// Orchard Env's service routes: a service that does not get ready is a
	// 408 (as /wait), one that cannot be reached a 502 ("Service
	// unreachable").
	faults.CodeServiceNotReady:    http.StatusRequestTimeout,
	faults.CodeServiceUnreachable: http.StatusBadGateway,
	// Starlette's 405 for a path that exists with another method; the
	// failure is an invalid request (400).
	faults.CodeMethodNotAllowed: http.StatusMethodNotAllowed,
}

// fileStatus is route.statuses of the file routes (upload, download,
// list), which Orchard Env answers differently (ORCHARD_COMPAT §3.14–3.16):
// 400 for a sandbox that is not ready (a conflict, 409, elsewhere), and 500
// for a directory where a file is expected and the reverse, and for
// content that is not base64 (invalid requests, 400, elsewhere). These win
// over the status an agent's answer carries.
var fileStatus = map[string]int{
	faults.CodeSandboxNotReady: http.StatusBadRequest,
	faults.CodeIsDirectory:     http.StatusInternalServerError,
	faults.CodeNotDirectory:    http.StatusInternalServerError,
	faults.CodeInvalidBase64:   http.StatusInternalServerError,
}

// statusOf is the HTTP status of f on a route with no statuses of its
// own.
func statusOf(f *faults.Error) int { return statusOn(f, nil) }

// statusOn is the HTTP status of f on a route whose own statuses are
// routeStatus. In order: the route's status for f's code; a status f fixes
// itself (one the server set, or one an agent's answer carried);
// codeStatus; FastAPI's 422 for a validation error, whether it lists its
// fields or is a field the manager refused (manager.FieldRefusal, in its
// internal cause); the category's.
func statusOn(f *faults.Error, routeStatus map[string]int) int {
	if s, ok := routeStatus[f.Code]; ok {
		return s
	}
	if f.Status != 0 {
		return f.Status
	}
	if s, ok := codeStatus[f.Code]; ok {
		return s
	}
	if _, ok := f.FieldErrors(); ok {
		return http.StatusUnprocessableEntity
	}
	if _, ok := errors.AsType[manager.FieldRefusal](f); ok {
		return http.StatusUnprocessableEntity
	}
	return f.StatusOf()
}

func missingField(where, field string, input any) faults.FieldError {
	return faults.FieldError{Type: "missing", Loc: []any{where, field}, Msg: "Field required", Input: input}
}

// decodeJSON decodes the (already bounded) body into v, turning type errors
// into 422s located at the offending field.
func decodeJSON(body []byte, v any) error {
	if len(body) == 0 {
		return faults.Validation(faults.FieldError{Type: "missing", Loc: []any{"body"}, Msg: "Field required", Input: nil})
	}
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		loc := []any{"body"}
		if te.Field != "" {
			// A nested field ("browser.viewport.width") as FastAPI
			// gives it: one element per level.
			for _, f := range strings.Split(te.Field, ".") {
				loc = append(loc, f)
			}
		}
		typ := "type_error"
		if te.Type != nil {
			typ = te.Type.String() + "_type"
		}
		return faults.Validation(faults.FieldError{Type: typ, Loc: loc, Msg: "Input should be a valid " + describe(te), Input: te.Value})
	}
	return faults.Validation(faults.FieldError{Type: "value_error", Loc: []any{"body"}, Msg: err.Error(), Input: nil})
}

func describe(te *json.UnmarshalTypeError) string {
	if te.Type == nil {
		return "value"
	}
	switch te.Type.Kind().String() {
	case "string":
		return "string"
	case "int", "int64", "int32":
		return "integer"
	case "bool":
		return "boolean"
	case "map", "struct":
		return "dictionary"
	case "slice":
		return "list"
	}
	return te.Type.String()
}

// queryInt reads an integer query parameter of at least min, 422 when it
// is not one.
func queryInt(c *gin.Context, name string, def, min int) (int, error) {
	s, ok := c.GetQuery(name)
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, faults.Validation(faults.FieldError{Type: "int_parsing", Loc: []any{"query", name},
			Msg: "Input should be a valid integer, unable to parse string as an integer", Input: s})
	}
	if n < min {
		// FastAPI echoes a query value as the string it received.
		return 0, faults.Validation(tooSmall([]any{"query", name}, s, min))
	}
	return n, nil
}
