package browser

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// flaky answers 503 to the first fails requests of each path, then 200.
func flaky(fails int32) *httptest.Server {
	var n atomic.Int32
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/favicon.ico" {
			http.NotFound(w, r)
			return
		}
		if r.URL.Path == "/gone" {
			http.Error(w, "gone", http.StatusNotFound)
			return
		}
		if n.Add(1) <= fails {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte("<title>up</title>up"))
	}))
}

func TestNavigationRetry(t *testing.T) {
	s := openPage(t, "/basic.html")
	fast := &RetryPolicy{Attempts: 3, InitialMS: 50, MaxMS: 100}
	cases := []struct {
		name     string
		fails    int32
		path     string
		retry    *RetryPolicy
		ok       bool
		attempts int
		code     string
	}{
		{"fails twice then succeeds", 2, "/", fast, true, 3, ""},
		{"budget of attempts runs out", 5, "/", fast, false, 3, "site.http_503"},
		{"not retryable", 0, "/gone", fast, false, 1, "site.http_404"},
		{"no policy, no retry", 1, "/", nil, false, 0, "site.http_503"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := flaky(c.fails)
			defer srv.Close()
			res, err := s.Do(ctxT(t), []Action{{Type: ActNavigate, URL: srv.URL + c.path, Retry: c.retry}})
			if err != nil {
				t.Fatal(err)
			}
			r := res[0]
			if r.OK != c.ok || r.Attempts != c.attempts {
				t.Fatalf("ok %v attempts %d (%+v), want %v %d", r.OK, r.Attempts, r, c.ok, c.attempts)
			}
			if c.code != "" && (r.Error == nil || r.Error.Code != c.code) {
				t.Errorf("error %+v, want %s", r.Error, c.code)
			}
			if c.attempts > 1 && len(r.Retries) != c.attempts {
				t.Errorf("retries %+v", r.Retries)
			}
		})
	}
	t.Run("time budget", func(t *testing.T) {
		srv := flaky(100)
		defer srv.Close()
		start := time.Now()
		res, err := s.Do(ctxT(t), []Action{{Type: ActNavigate, URL: srv.URL,
			Retry: &RetryPolicy{Attempts: 50, InitialMS: 200, MaxMS: 200, BudgetMS: 1000}}})
		el := time.Since(start)
		// The last attempt may be cut short by the budget itself, so its
		// error is the site's 503 or a timeout.
		if err != nil || res[0].OK || res[0].Error == nil {
			t.Fatalf("%+v %v", res, err)
		}
		// Generous bounds: the budget stops it well before 50 attempts.
		if el > 4*time.Second || res[0].Attempts >= 50 || res[0].Attempts < 2 {
			t.Errorf("budget 1s: %d attempts in %v", res[0].Attempts, el)
		}
	})
}
