package server_test

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"testing"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/egress"
	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/internal/testing/testserver"
	"github.com/orchard/orchard/server"
	"github.com/orchard/orchard/sitehealth"
)

// A site that answers a CAPTCHA interstitial with status 200: the step that
// lands on it fails site.blocked with its evidence, the episode ends
// env_error attributed to the site, and the site's health counts the
// block (without opening its breaker: the connection worked).
func TestBotWallEndsEpisodeAndCountsInSiteHealth(t *testing.T) {
	testenv.RequireChromium(t)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		if r.URL.Path == "/wall" {
			fmt.Fprint(w, `<html><head><title>Security</title></head><body><h1>Verify you are human</h1><div class="g-recaptcha" data-sitekey="x"></div></body></html>`)
			return
		}
		fmt.Fprint(w, `<html><head><title>home</title></head><body><a href="/wall">products</a></body></html>`)
	}))
	t.Cleanup(site.Close)
	_, port, _ := net.SplitHostPort(site.Listener.Addr().String())
	health, err := sitehealth.New(sitehealth.NewMemory(), sitehealth.Config{}, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := testserver.Start(t, testserver.Options{
		Egress: &egress.Dialer{Hosts: map[string]netip.Addr{"wall.test": netip.MustParseAddr("127.0.0.1")},
			AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, Gate: health},
		Server: server.Config{SiteHealth: health},
	})
	task := map[string]any{"id": "walled", "question": "Find the products.", "start_url": "http://wall.test:" + port + "/",
		"setup": map[string]any{"sandbox": map[string]any{"block_network": false}},
		"eval":  map[string]any{"type": "answer_match", "references": []string{"x"}}}
	e := call(t, srv, "POST", "/episodes", map[string]any{"task": task})
	want(t, e, 200)
	id := e.body["episode_id"].(string)
	s := call(t, srv, "POST", "/episodes/"+id+"/step", map[string]any{"action": map[string]any{"type": "navigate", "url": "http://wall.test:" + port + "/wall"}})
	want(t, s, 200)
	info, _ := s.body["info"].(map[string]any)
	serr, _ := info["error"].(map[string]any)
	if serr == nil || serr["code"] != faults.CodeSiteBlocked || s.body["done"] != true {
		t.Fatalf("step onto the wall: %s", s.raw)
	}
	obs, _ := s.body["observation"].(map[string]any)
	if obs == nil || obs["url"] != "http://wall.test:"+port+"/wall" {
		t.Errorf("the step's observation is not the wall: %s", s.raw)
	}
	r := call(t, srv, "POST", "/episodes/"+id+"/finish", nil)
	want(t, r, 200)
	attr, _ := r.body["attribution"].(map[string]any)
	if r.body["outcome"] != api.OutcomeEnvError || attr == nil || attr["code"] != faults.CodeSiteBlocked || attr["source"] != string(faults.Site) {
		t.Fatalf("episode ending on a wall: %s", r.raw)
	}

	h := call(t, srv, "GET", "/sitehealth", nil)
	want(t, h, 200)
	var found bool
	for _, x := range h.body["hosts"].([]any) {
		host := x.(map[string]any)
		if host["host"] != "wall.test" {
			continue
		}
		found = true
		if host["blocked"] != float64(1) || host["last_blocked"] == "" || host["state"] != string(sitehealth.Closed) {
			t.Errorf("site health of the walled host: %v", host)
		}
	}
	if !found {
		t.Errorf("no site health for wall.test: %s", h.raw)
	}
}
