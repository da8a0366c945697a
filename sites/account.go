package sites

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
)

// The shop's sign-in: POST /shop/login (form fields user and password),
// GET /shop/logout, GET /shop/api/me. The session is a signed cookie,
// HttpOnly, and nothing is kept on the server: a browser that carries the
// cookie to another copy of the sites (a sandbox started from a snapshot
// of this one) is still signed in, as on a real site behind several
// servers. Any user name of 1–32 letters and digits signs in with the
// password "greenleaf".
const (
	sessionCookie = "gm_session"
	shopPassword  = "greenleaf"
)

// sessionKey signs session cookies. The sites are an offline test bed:
// the key only has to make a cookie the page did not get from a sign-in
// fail, not to keep anything secret.
var sessionKey = []byte("greenleaf-market-session")

func signSession(user string) string {
	mac := hmac.New(sha256.New, sessionKey)
	mac.Write([]byte(user))
	return base64.RawURLEncoding.EncodeToString([]byte(user)) + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// sessionUser returns the signed-in user of r, or "".
func sessionUser(r *http.Request) string {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	u, _, ok := strings.Cut(c.Value, ".")
	if !ok {
		return ""
	}
	user, err := base64.RawURLEncoding.DecodeString(u)
	if err != nil || !hmac.Equal([]byte(signSession(string(user))), []byte(c.Value)) {
		return ""
	}
	return string(user)
}

func validUser(u string) bool {
	if len(u) == 0 || len(u) > 32 {
		return false
	}
	for _, c := range u {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// accountRoute serves the sign-in routes; false for any other path.
func accountRoute(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case r.URL.Path == "/shop/login" && r.Method == http.MethodPost:
		r.Body = http.MaxBytesReader(w, r.Body, 4096)
		user := r.PostFormValue("user")
		if !validUser(user) || r.PostFormValue("password") != shopPassword {
			http.Redirect(w, r, "account.html?error=1", http.StatusSeeOther)
			return true
		}
		http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: signSession(user), Path: "/shop/",
			HttpOnly: true, SameSite: http.SameSiteLaxMode})
		http.Redirect(w, r, "account.html", http.StatusSeeOther)
	case r.URL.Path == "/shop/login" && r.Method == http.MethodGet:
		http.Redirect(w, r, "account.html", http.StatusSeeOther)
	case r.URL.Path == "/shop/logout" && r.Method == http.MethodGet:
		http.SetCookie(w, &http.Cookie{Name: sessionCookie, Path: "/shop/", MaxAge: -1})
		http.Redirect(w, r, "account.html", http.StatusSeeOther)
	case r.URL.Path == "/shop/api/me" && r.Method == http.MethodGet:
		user := sessionUser(r)
		w.Header().Set("Content-Type", "application/json")
		if user == "" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"user":null}`))
			return true
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"user": user})
	default:
		return false
	}
	return true
}
