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
)

// renderError is the one place where errors become HTTP responses: status
// from the category (or the compat override), body {"detail", "error"},
// Retry-After on capacity and unavailability. Internal causes are logged,
// never sent. The error is attached to the request, where the metrics
// middleware counts it.
func renderError(c *gin.Context, log *slog.Logger, err error) {
	f := faults.Of(err)
	_ = c.Error(f)
	status := statusOf(f)
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

func missingField(where, field string, input any) faults.FieldError {
	return faults.FieldError{Type: "missing", Loc: []any{where, field}, Msg: "Field required", Input: input}
}

// statusOf is the HTTP status of f: a validation error's is FastAPI's 422;
// otherwise the category's, unless f fixes its own.
func statusOf(f *faults.Error) int {
	if _, ok := f.FieldErrors(); ok && f.Status == 0 {
		return http.StatusUnprocessableEntity
	}
	return f.StatusOf()
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
