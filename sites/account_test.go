package sites

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// The shop's sign-in: a wrong password is refused, a right one signs in
// with an HttpOnly cookie that api/me accepts, a forged or altered cookie
// is refused, and signing out forgets the session.
func TestShopSignIn(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	me := func() (int, string) {
		res, err := c.Get(srv.URL + "/shop/api/me")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, strings.TrimSpace(string(b))
	}
	login := func(user, pass string) string {
		res, err := c.PostForm(srv.URL+"/shop/login", url.Values{"user": {user}, "password": {pass}})
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.Request.URL.RequestURI()
	}
	if code, body := me(); code != 401 {
		t.Errorf("api/me before sign-in: %d %s", code, body)
	}
	for _, bad := range [][2]string{{"ada", "wrong"}, {"", shopPassword}, {"a b", shopPassword}, {strings.Repeat("a", 33), shopPassword}} {
		if got := login(bad[0], bad[1]); got != "/shop/account.html?error=1" {
			t.Errorf("sign-in %q/%q landed on %s", bad[0], bad[1], got)
		}
	}
	if got := login("ada", shopPassword); got != "/shop/account.html" {
		t.Errorf("sign-in landed on %s", got)
	}
	if code, body := me(); code != 200 || body != `{"user":"ada"}` {
		t.Errorf("api/me signed in: %d %s", code, body)
	}
	u, _ := url.Parse(srv.URL + "/shop/")
	cookies := jar.Cookies(u)
	if len(cookies) != 1 || cookies[0].Name != sessionCookie {
		t.Fatalf("cookies %v", cookies)
	}
	forged := signSession("eve")
	forged = forged[:len(forged)-2] + "AA"
	jar.SetCookies(u, []*http.Cookie{{Name: sessionCookie, Value: forged, Path: "/shop/"}})
	if code, _ := me(); code != 401 {
		t.Errorf("api/me with a forged cookie: %d", code)
	}
	login("ada", shopPassword)
	if res, err := c.Get(srv.URL + "/shop/logout"); err == nil {
		res.Body.Close()
	}
	if code, _ := me(); code != 401 {
		t.Errorf("api/me after sign-out: %d", code)
	}
}
