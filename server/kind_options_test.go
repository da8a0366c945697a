package server_test

import (
	"context"
	"testing"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testserver"
)

// A bad browser, desktop or egress setting is refused by the server with
// a 422 naming it before any sandbox starts, not by the daemon inside a
// sandbox that was started for nothing.
func TestKindOptionsValidatedBeforeCreate(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	ctx := context.Background()
	count := func() (instances, records int) {
		t.Helper()
		in, err := srv.Runtime.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := srv.Manager.List(ctx, nil, "", "")
		if err != nil {
			t.Fatal(err)
		}
		return len(in), len(recs)
	}
	browser := func(settings map[string]any) map[string]any {
		return map[string]any{"image": "host", "block_network": true, "kind": "browser", "browser": settings}
	}
	desktop := func(settings map[string]any) map[string]any {
		return map[string]any{"image": "host", "block_network": true, "kind": "desktop", "desktop": settings}
	}
	egress := func(settings map[string]any) map[string]any {
		return map[string]any{"image": "host", "block_network": false, "egress": settings}
	}
	task := map[string]any{"id": "options", "start_url": "about:blank", "question": "q"}
	const ge, value = "greater_than_equal", "value_error"
	cases := []struct {
		name, path string
		body       map[string]any
		loc        []any
		typ        string
	}{
		{"browser viewport width negative", "/sandboxes", browser(map[string]any{"viewport": map[string]int{"width": -1, "height": 600}}),
			[]any{"body", "browser", "viewport", "width"}, value},
		{"browser viewport height too large", "/sandboxes", browser(map[string]any{"viewport": map[string]int{"width": 800, "height": 100000}}),
			[]any{"body", "browser", "viewport", "height"}, value},
		{"browser unknown engine", "/sandboxes", browser(map[string]any{"engine": "firefox"}), []any{"body", "browser", "engine"}, value},
		{"browser headed headless shell", "/sandboxes", browser(map[string]any{"engine": "headless-shell", "headless": false}),
			[]any{"body", "browser", "headless"}, value},
		{"browser proxy from a request", "/sandboxes", browser(map[string]any{"proxy_server": "10.0.0.1:3128"}), []any{"body", "browser", "proxy_server"}, value},
		{"browser call timeout negative", "/sandboxes", browser(map[string]any{"call_timeout_ms": -1}), []any{"body", "browser", "call_timeout_ms"}, ge},
		{"browser navigation timeout negative", "/sandboxes", browser(map[string]any{"navigation_timeout_ms": -1}), []any{"body", "browser", "navigation_timeout_ms"}, ge},
		{"browser settle quiet negative", "/sandboxes", browser(map[string]any{"settle_quiet_ms": -1}), []any{"body", "browser", "settle_quiet_ms"}, ge},
		{"browser settle idle negative", "/sandboxes", browser(map[string]any{"settle_idle_ms": -1}), []any{"body", "browser", "settle_idle_ms"}, ge},
		{"browser retry attempts negative", "/sandboxes", browser(map[string]any{"navigation_retry": map[string]any{"attempts": -1}}),
			[]any{"body", "browser", "navigation_retry", "attempts"}, ge},
		{"browser viewport not a number", "/sandboxes", browser(map[string]any{"viewport": map[string]any{"width": "wide"}}),
			[]any{"body", "browser", "viewport", "width"}, ""},
		{"browser settings on a shell", "/sandboxes", map[string]any{"image": "host", "browser": map[string]any{}}, []any{"body", "browser"}, value},
		{"desktop too narrow", "/sandboxes", desktop(map[string]any{"width": 10}), []any{"body", "desktop", "width"}, value},
		{"desktop too tall", "/sandboxes", desktop(map[string]any{"height": 9000}), []any{"body", "desktop", "height"}, value},
		{"desktop depth", "/sandboxes", desktop(map[string]any{"depth": 16}), []any{"body", "desktop", "depth"}, value},
		{"desktop unknown app", "/sandboxes", desktop(map[string]any{"apps": []string{"xterm", "emacs"}}), []any{"body", "desktop", "apps", float64(1)}, value},
		{"desktop settings on a browser", "/sandboxes", map[string]any{"image": "host", "kind": "browser", "desktop": map[string]any{}}, []any{"body", "desktop"}, value},
		{"egress unknown mode", "/sandboxes", egress(map[string]any{"mode": "tunnel"}), []any{"body", "egress", "mode"}, value},
		{"egress full with an allow-list", "/sandboxes", egress(map[string]any{"mode": "full", "allow": []string{"example.com"}}), []any{"body", "egress", "allow"}, value},
		{"episode browser viewport", "/episodes", map[string]any{"task": task, "sandbox": map[string]any{"browser": map[string]any{"viewport": map[string]int{"width": -5}}}},
			[]any{"body", "sandbox", "browser", "viewport", "width"}, value},
		{"episode desktop depth", "/episodes", map[string]any{"task": task, "sandbox": map[string]any{"kind": "desktop", "desktop": map[string]any{"depth": 8}}},
			[]any{"body", "sandbox", "desktop", "depth"}, value},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inBefore, recBefore := count()
			wantInvalid(t, call(t, srv, "POST", tc.path, tc.body), tc.loc, faults.CodeValidation, tc.typ)
			if in, rec := count(); in != inBefore || rec != recBefore {
				t.Errorf("created something: %d instances and %d records before, %d and %d after", inBefore, recBefore, in, rec)
			}
		})
	}
	// A bad allow-list pattern or fault plan stays the 400 it always was,
	// and starts nothing either.
	for name, body := range map[string]map[string]any{
		"egress pattern": egress(map[string]any{"allow": []string{"http://x.com"}}),
		"fault plan":     {"image": "host", "faults": map[string]any{"faults": []map[string]any{{"kind": "meteor", "p": 1}}}},
	} {
		t.Run(name, func(t *testing.T) {
			inBefore, recBefore := count()
			want(t, call(t, srv, "POST", "/sandboxes", body), 400)
			if in, rec := count(); in != inBefore || rec != recBefore {
				t.Errorf("created something: %d instances and %d records before, %d and %d after", inBefore, recBefore, in, rec)
			}
		})
	}
	// Every bad setting of one request is named at once.
	r := call(t, srv, "POST", "/sandboxes", browser(map[string]any{"engine": "firefox", "settle_timeout_ms": -1}))
	wantInvalid(t, r, []any{"body", "browser", "engine"}, faults.CodeValidation, value)
	wantInvalid(t, r, []any{"body", "browser", "settle_timeout_ms"}, faults.CodeValidation, ge)
}
