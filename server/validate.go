package server

import (
	"fmt"
	"slices"
	"strings"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/server/manager"
)

// Request fields are checked where the request is decoded, so that a bad
// value is refused with a 422 naming it instead of being replaced by a
// default or failing later inside a sandbox. Zero keeps the meaning the
// contract gives it: "the default" for Orchard Env's create `timeout`,
// exec and apply_patch `timeout_seconds` (ORCHARD_COMPAT §3.4, §3.9, §13)
// and for our `ttl_seconds`, `step_timeout_ms`, `episode_timeout_ms` and
// `max_steps`; "do not wait" for the `timeout` query of the wait routes.
// Negative numbers mean nothing anywhere and are refused. No timeout has
// a maximum: a huge one means a long time (api.Seconds saturates).

// checks collects the failed checks of one request: FastAPI reports every
// bad field at once, not the first only.
type checks struct {
	items []faults.FieldError
	code  string // of the first item: the error object describes it
}

func (c *checks) add(code string, it faults.FieldError) {
	if len(c.items) == 0 {
		c.code = code
	}
	c.items = append(c.items, it)
}

// err is the 422 for the collected items, nil when there are none.
func (c *checks) err() error {
	if len(c.items) == 0 {
		return nil
	}
	return faults.ValidationCode(c.code, c.items...)
}

// joinLoc joins a location prefix ("body", or "body", "sandbox") and a field path.
func joinLoc(loc []any, field ...any) []any {
	return append(append([]any(nil), loc...), field...)
}

// tooSmall is pydantic's item for a number below its minimum (Field(ge=min)).
func tooSmall(loc []any, input any, min int) faults.FieldError {
	return faults.FieldError{Type: "greater_than_equal", Loc: loc, Msg: fmt.Sprintf("Input should be greater than or equal to %d", min),
		Input: input, Ctx: map[string]any{"ge": min}}
}

// nonNegative checks an optional integer field.
func (c *checks) nonNegative(v *int, loc []any) {
	if v != nil && *v < 0 {
		c.add(faults.CodeValidation, tooSmall(loc, *v, 0))
	}
}

// noNUL checks a string that reaches execve or chdir, where a NUL byte
// cannot be passed: the kernel would see a shorter string, and Go refuses
// to try (the command would fail to start with exit 126).
func (c *checks) noNUL(s, what string, loc []any) {
	if strings.IndexByte(s, 0) >= 0 {
		c.add(faults.CodeValidation, faults.FieldError{Type: "value_error", Loc: loc, Msg: what + " must not contain a NUL byte", Input: s})
	}
}

// env checks environment variables: a name holds no '=' (execve would
// split it there, setting another variable) and no NUL; a value no NUL.
func (c *checks) env(env map[string]string, loc []any) {
	names := make([]string, 0, len(env))
	for k := range env {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			c.add(faults.CodeValidation, faults.FieldError{Type: "value_error", Loc: joinLoc(loc, k),
				Msg: "environment variable names must be non-empty, without '=' or NUL bytes", Input: k})
			continue
		}
		c.noNUL(env[k], "an environment variable's value", joinLoc(loc, k))
	}
}

// cpu checks a create's cpu: a quantity above 0, within the server's limit.
func (c *checks) cpu(v *string, lim manager.Limits, loc []any) {
	if v == nil || *v == "" { // the default
		return
	}
	cores, err := manager.ParseCPU(*v)
	if err != nil {
		c.add(faults.CodeValidation, faults.FieldError{Type: "value_error", Loc: loc,
			Msg: `cpu must be a CPU quantity above 0, such as "2", "0.5" or "500m"`, Input: *v})
		return
	}
	if err := lim.CheckCPU(cores); err != nil {
		c.add(faults.CodeLimitExceeded, faults.FieldError{Type: "value_error", Loc: loc, Msg: err.Error(), Input: *v})
	}
}

// memory checks a create's memory: a quantity above 0, within the
// server's limit.
func (c *checks) memory(v *string, lim manager.Limits, loc []any) {
	if v == nil || *v == "" { // the default
		return
	}
	bytes, err := manager.ParseMemory(*v)
	if err != nil {
		c.add(faults.CodeValidation, faults.FieldError{Type: "value_error", Loc: loc,
			Msg: `memory must be a memory quantity above 0, such as "512Mi", "16Gi" or "1000000000"`, Input: *v})
		return
	}
	if err := lim.CheckMemory(bytes); err != nil {
		c.add(faults.CodeLimitExceeded, faults.FieldError{Type: "value_error", Loc: loc, Msg: err.Error(), Input: *v})
	}
}

// fields adds the invalid fields an api type found in itself; loc is
// where that object is in the request.
func (c *checks) fields(loc []any, errs []api.FieldError) {
	for _, e := range errs {
		c.add(faults.CodeValidation, faults.FieldError{Type: e.Type, Loc: joinLoc(loc, e.Loc...), Msg: e.Msg, Input: e.Input, Ctx: e.Ctx})
	}
}
