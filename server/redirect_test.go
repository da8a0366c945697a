package server_test

import (
	"net/http"
	"testing"

	"github.com/orchard/orchard/internal/testing/testserver"
)

// Every response carries X-Request-ID (ORCHARD_COMPAT §1), the
// trailing-slash redirects too; they redirect as Starlette does (307, the
// query kept), and a path that matches nothing either way stays a 404.
func TestRedirectCarriesRequestID(t *testing.T) {
	srv := testserver.Start(t, testserver.Options{})
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct{ method, path, status, loc string }{
		{"GET", "/health/", "307", "/health"},
		{"GET", "/sandboxes/?kind=shell", "307", "/sandboxes?kind=shell"},
		{"POST", "/sandboxes/abc/exec/", "307", "/sandboxes/abc/exec"},
		{"GET", "/nosuch/", "404", ""},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		req.Header.Set("X-API-Key", srv.APIKey)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.Header.Get("X-Request-ID") == "" {
			t.Errorf("%s %s: %d without X-Request-ID (Content-Type %q)", tc.method, tc.path, res.StatusCode, res.Header.Get("Content-Type"))
		}
		if got := http.StatusText(res.StatusCode); res.Status[:3] != tc.status || res.Header.Get("Location") != tc.loc {
			t.Errorf("%s %s: %s (%s) Location %q, want %s %q", tc.method, tc.path, res.Status, got, res.Header.Get("Location"), tc.status, tc.loc)
		}
	}
}
