package faults

import "fmt"

// FieldError is one entry of a validation error's detail list, in the
// shape of FastAPI's 422 body (ORCHARD_COMPAT.md), which the Orchard Env
// SDK reads.
type FieldError struct {
	Type  string `json:"type"`
	Loc   []any  `json:"loc"`
	Msg   string `json:"msg"`
	Input any    `json:"input"`
	// Ctx holds the bound a constraint error names, as pydantic gives it
	// ({"ge": 0} with type greater_than_equal).
	Ctx map[string]any `json:"ctx,omitempty"`
}

// Validation is a request refused for the fields items name: category
// invalid_request, source client, code client.validation, the items as
// the body's detail. Its error object carries the first item's message.
// The server answers it 422, as FastAPI does.
func Validation(items ...FieldError) *Error {
	return ValidationCode(CodeValidation, items...)
}

// ValidationCode is Validation with another code in the error object (the
// detail list is the same).
func ValidationCode(code string, items ...FieldError) *Error {
	msg := "request validation failed"
	if len(items) > 0 {
		msg = fmt.Sprintf("%s: %v", items[0].Msg, items[0].Loc)
	}
	e := New(code, InvalidRequest, Client, msg)
	e.Detail = items
	return e
}

// FieldErrors returns the field errors of a validation error.
func (e *Error) FieldErrors() ([]FieldError, bool) {
	items, ok := e.Detail.([]FieldError)
	return items, ok
}
