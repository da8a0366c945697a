package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestStatusOfEveryCategory(t *testing.T) {
	cases := map[Category]int{
		InvalidRequest: 400, Unauthenticated: 401, PermissionDenied: 403, NotFound: 404, Conflict: 409,
		TooLarge: 413, ActionFailed: 422, Canceled: 499, Internal: 500, NotImplemented: 501,
		Capacity: 503, Unavailable: 503, Timeout: 504,
	}
	for cat, want := range cases {
		if got := HTTPStatus(cat); got != want {
			t.Errorf("HTTPStatus(%s) = %d, want %d", cat, got, want)
		}
		e := New("x.y", cat, Platform, "m")
		if got := e.StatusOf(); got != want {
			t.Errorf("StatusOf(%s) = %d", cat, got)
		}
		if e.WithStatus(418).StatusOf() != 418 {
			t.Errorf("status override ignored for %s", cat)
		}
		wantRetry := cat == Capacity || cat == Unavailable || cat == Timeout
		if New("x.y", cat, Platform, "m").Retryable != wantRetry {
			t.Errorf("default retryability of %s", cat)
		}
	}
}

func TestOfKeepsTheOutermostClassThroughWrapping(t *testing.T) {
	inner := New(CodeFileNotFound, NotFound, Client, "File not found: /x")
	outer := Wrap(inner, CodeAgentUnreachable, Unavailable, Sandbox, "agent gone")
	cases := []struct {
		name string
		err  error
		code string
		cat  Category
	}{
		{"plain", inner, CodeFileNotFound, NotFound},
		{"fmt wrapped", fmt.Errorf("download: %w", inner), CodeFileNotFound, NotFound},
		{"reclassified", fmt.Errorf("op: %w", outer), CodeAgentUnreachable, Unavailable},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), CodeTimeout, Timeout},
		{"canceled", context.Canceled, CodeCanceled, Canceled},
		{"unclassified", errors.New("boom /secret/path"), CodeInternal, Internal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := Of(tc.err)
			if f.Code != tc.code || f.Category != tc.cat {
				t.Fatalf("Of = %s/%s, want %s/%s", f.Code, f.Category, tc.code, tc.cat)
			}
			if !Is(tc.err, tc.code) {
				t.Fatal("Is does not match Of")
			}
			if strings.Contains(f.Message, "/secret") {
				t.Fatalf("internal text in the safe message: %q", f.Message)
			}
		})
	}
	if Of(nil) != nil || IsRetryable(nil) {
		t.Fatal("nil error classified")
	}
}

func TestEnvelopeRoundTrip(t *testing.T) {
	e := Wrap(errors.New("internal detail"), CodeImagePull, Unavailable, Platform, "pull image x")
	b, err := json.Marshal(EnvelopeOf(e))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "internal detail") {
		t.Fatalf("envelope leaks the cause: %s", b)
	}
	var env struct {
		Detail string `json:"detail"`
		Error  Info   `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatal(err)
	}
	back := FromInfo(env.Error, 503)
	if env.Detail != "pull image x" || back.Code != CodeImagePull || back.Category != Unavailable ||
		back.Source != Platform || !back.Retryable || back.StatusOf() != 503 {
		t.Fatalf("round trip: %s → %+v", b, back)
	}
	v := New(CodeValidation, InvalidRequest, Client, "bad")
	v.Detail = []string{"item"}
	if got := EnvelopeOf(v).Detail; fmt.Sprint(got) != "[item]" {
		t.Fatalf("detail override lost: %v", got)
	}
}
