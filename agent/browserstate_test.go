package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/browser"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// GET /browser/state answers the state; PUT takes it back, refusing what
// is malformed or too large with a classified error.
func TestBrowserStateRoutes(t *testing.T) {
	path := testenv.RequireChromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sess, err := browser.Launch(ctx, browser.Options{ExecPath: path, DownloadDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "sid", Value: "s1", HttpOnly: true})
		io.WriteString(w, `<title>Page</title><input id="q">`)
	}))
	defer page.Close()
	if _, err := sess.Do(ctx, []browser.Action{{Type: "navigate", URL: page.URL + "/p"}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(browserHandler(sess, slog.Default()))
	defer srv.Close()

	res, err := http.Get(srv.URL + "/browser/state")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var st api.BrowserState
	if res.StatusCode != http.StatusOK || json.Unmarshal(raw, &st) != nil {
		t.Fatalf("GET /browser/state: %d %s", res.StatusCode, raw)
	}
	if len(st.Tabs) != 1 || st.Tabs[0].URL != page.URL+"/p" || len(st.Cookies) != 1 || !st.Cookies[0].HTTPOnly {
		t.Fatalf("state: %s", raw)
	}

	badVersion := strings.Replace(string(raw), `"version":1`, `"version":7`, 1)
	big := `{"version":1,"tabs":[],"origins":[{"origin":"http://a.test","local_storage":{"k":"` + strings.Repeat("x", api.MaxBrowserStateBytes+1<<20) + `"}}]}`
	for _, tc := range []struct {
		name   string
		body   string
		status int
		code   string
	}{
		{"malformed", `{"version":`, http.StatusBadRequest, faults.CodeInvalidJSON},
		{"invalid", badVersion, http.StatusUnprocessableEntity, faults.CodeValidation},
		{"too large", big, http.StatusRequestEntityTooLarge, faults.CodeBrowserStateTooLarge},
		{"round trip", string(raw), http.StatusNoContent, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPut, srv.URL+"/browser/state", bytes.NewReader([]byte(tc.body)))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %.300s", res.StatusCode, tc.status, body)
			}
			if tc.code != "" && !strings.Contains(string(body), `"`+tc.code+`"`) {
				t.Fatalf("body %.300s, want code %s", body, tc.code)
			}
		})
	}
	if tabs := sess.Tabs(); len(tabs) != 1 || tabs[0].URL != page.URL+"/p" {
		t.Fatalf("tabs after the round trip: %+v", tabs)
	}
}
