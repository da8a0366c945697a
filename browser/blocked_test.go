package browser

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/orchard/orchard/faults"
)

func TestBotWallsAreSiteBlocked(t *testing.T) {
	s := openPage(t, "/basic.html")
	pages := map[string]struct {
		status int
		body   string
	}{
		"/cloudflare": {403, `<html><head><title>Just a moment...</title></head><body><div id="challenge-running"></div>
			<script src="/cdn-cgi/challenge-platform/h/b/orchestrate/chl_page/v1"></script></body></html>`},
		"/recaptcha":  {429, `<html><body>Our systems have detected unusual traffic from your computer network.<div class="g-recaptcha" data-sitekey="x"></div></body></html>`},
		"/plain-503":  {503, `<html><body>Service temporarily unavailable, try later.</body></html>`},
		"/plain-403":  {403, `<html><body>Forbidden</body></html>`},
		"/login-form": {200, `<html><body>Log in. <div class="g-recaptcha" data-sitekey="x"></div></body></html>`},
		"/cf-200": {200, `<html><head><title>Just a moment...</title></head><body><div id="challenge-running"></div>
			<script src="/cdn-cgi/challenge-platform/h/b/orchestrate/chl_page/v1"></script></body></html>`},
		"/recaptcha-200":  {200, `<html><head><title>Security</title></head><body><h1>Verify you are human</h1><div class="g-recaptcha" data-sitekey="x"></div></body></html>`},
		"/hcaptcha-200":   {200, `<html><body><p>Please complete the security check to continue.</p><div class="h-captcha" data-sitekey="y"></div></body></html>`},
		"/turnstile-200":  {200, `<html><head><title>Just a moment...</title></head><body><div class="cf-turnstile" data-sitekey="z"></div></body></html>`},
		"/datadome-200":   {200, `<html><body><script src="https://ct.captcha-delivery.com/c.js"></script></body></html>`},
		"/perimeterx-200": {200, `<html><body><div id="px-captcha"></div><p>Press &amp; Hold to confirm you are a human</p></body></html>`},
		"/turnstile-429":  {429, `<html><body><div class="cf-turnstile" data-sitekey="z"></div> Verify you are human</body></html>`},
		"/mentions":       {200, `<html><head><title>What is a CAPTCHA?</title></head><body><h1>CAPTCHA</h1><p>A captcha asks you to verify you are human; reCAPTCHA and hCaptcha are common. Are you a robot? This article explains.</p></body></html>`},
		"/blog-captcha":   {200, `<html><head><title>Our captcha-free sign-up</title></head><body>No captcha here, unusual traffic is fine.</body></html>`},
		"/hcaptcha-503":   {503, `<html><body><div class="h-captcha" data-sitekey="y"></div></body></html>`},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := pages[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(p.status)
		w.Write([]byte(p.body))
	}))
	defer srv.Close()
	cases := []struct{ path, code string }{
		{"/cloudflare", faults.CodeSiteBlocked},
		{"/recaptcha", faults.CodeSiteBlocked},
		{"/hcaptcha-503", faults.CodeSiteBlocked},
		{"/plain-503", "site.http_503"},
		{"/plain-403", "site.http_403"},
		{"/login-form", ""}, // a CAPTCHA on a page that answered 200 is the page's content
		// Walls served with 200: the evidence, whatever the status.
		{"/cf-200", faults.CodeSiteBlocked},
		{"/recaptcha-200", faults.CodeSiteBlocked},
		{"/hcaptcha-200", faults.CodeSiteBlocked},
		{"/turnstile-200", faults.CodeSiteBlocked},
		{"/datadome-200", faults.CodeSiteBlocked},
		{"/perimeterx-200", faults.CodeSiteBlocked},
		{"/turnstile-429", faults.CodeSiteBlocked},
		// Pages that only talk about CAPTCHAs are the site's own.
		{"/mentions", ""},
		{"/blog-captcha", ""},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			res, err := s.Do(ctxT(t), []Action{{Type: ActNavigate, URL: srv.URL + c.path}})
			if err != nil {
				t.Fatal(err)
			}
			r := res[0]
			if c.code == "" {
				if !r.OK {
					t.Fatalf("failed: %+v", r.Error)
				}
				if obs, err := s.Observe(ctxT(t), ObserveOptions{}); err != nil || obs.Blocked != "" {
					t.Errorf("observation of the site's own page: blocked %q, %v", obs.Blocked, err)
				}
				return
			}
			if r.OK || r.Error.Code != c.code || r.Error.Source != faults.Site {
				t.Fatalf("got %+v, want %s", r.Error, c.code)
			}
			if c.code == faults.CodeSiteBlocked && r.Error.Retryable {
				t.Error("a bot wall is not worth an immediate retry")
			}
			if strings.HasSuffix(c.path, "-200") {
				// The evidence is in the result and in the observation.
				if !strings.Contains(r.Error.Message, "(") {
					t.Errorf("no evidence in %q", r.Error.Message)
				}
				obs, err := s.Observe(ctxT(t), ObserveOptions{})
				if err != nil || obs.Blocked == "" {
					t.Errorf("observation of a wall: blocked %q, %v", obs.Blocked, err)
				}
			}
		})
	}
}

// A bot wall is site.blocked however the page was reached: a link the
// policy clicked, a new tab opened at its URL.
func TestBotWallReachedByClickOrNewTab(t *testing.T) {
	s := openPage(t, "/basic.html")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/wall" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusForbidden)
		w.Write([]byte(`<html><head><title>Just a moment...</title></head><body><div id="challenge-running"></div>
			<script src="/cdn-cgi/challenge-platform/h/b/orchestrate/chl_page/v1"></script></body></html>`))
	}))
	defer srv.Close()
	js[any](t, s, fmt.Sprintf("document.getElementById('next').href=%q", srv.URL+"/wall"))
	cases := []struct {
		name string
		a    Action
	}{
		{"click", Action{Type: ActClick, Selector: "#next"}},
		{"new_tab", Action{Type: ActNewTab, URL: srv.URL + "/wall"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := failCode(t, s, c.a)
			if e.Code != faults.CodeSiteBlocked || e.Source != faults.Site || e.Retryable {
				t.Errorf("%s to a bot wall: %+v, want site.blocked", c.name, *e)
			}
		})
	}
}
