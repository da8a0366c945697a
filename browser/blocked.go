package browser

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/orchard/orchard/faults"
)

// Bot walls and CAPTCHAs answer with 403, 429 or 503 and a page that asks
// the visitor to prove it is human. A run that meets one learned nothing
// about its task: it is the site refusing the environment, site.blocked.

// wallStatuses are the statuses bot walls use (Cloudflare, Akamai,
// DataDome and PerimeterX answer 403 or 503; Google's "unusual traffic"
// page 429).
var wallStatuses = map[int]bool{403: true, 429: true, 503: true}

// wallScript finds the markers of a challenge page: the widgets of the
// common CAPTCHA services and the words their pages use.
const wallScript = `(() => {
  const sel = 'iframe[src*="captcha"],iframe[src*="challenges.cloudflare.com"],.g-recaptcha,.h-captcha,.cf-turnstile,' +
    '[data-sitekey],#challenge-form,#challenge-running,#cf-challenge-running,#px-captcha,#captcha-container,' +
    'form[action*="captcha"],script[src*="/cdn-cgi/challenge-platform"],script[src*="captcha-delivery.com"]';
  if (document.querySelector(sel)) return true;
  const t = (document.title || '').toLowerCase();
  const b = (document.body ? document.body.innerText : '').slice(0, 4000).toLowerCase();
  const marks = ['just a moment', 'attention required', 'verify you are human', 'verify you are a human',
    'are you a robot', 'unusual traffic', 'captcha', 'checking your browser', 'bot detection',
    'pardon our interruption', 'request unsuccessful', 'access to this page has been denied'];
  return marks.some(m => t.includes(m) || b.includes(m));
})()`

// wallTimeout bounds the check: one small script on a loaded page.
const wallTimeout = 2 * time.Second

// blocked turns a page load that landed on a bot wall or a CAPTCHA into
// site.blocked: one that failed with an HTTP status walls use, or one that
// succeeded (walls served with 200) on a page with a challenge's evidence
// (page.js's wall: stricter, since a 200 page is mostly the site's own).
func (s *Session) blocked(ctx context.Context, t *tab, err error) error {
	if err == nil {
		var ev string
		if t.evalInto(ctx, libExpr("wall()"), false, wallTimeout, &ev) != nil || ev == "" {
			return nil
		}
		t.mu.Lock()
		u := t.lastNav.url
		t.mu.Unlock()
		return faults.Newf(faults.CodeSiteBlocked, faults.PermissionDenied, faults.Site,
			"%s answered with a bot wall or a CAPTCHA (%s)", u, ev).WithRetryable(false)
	}
	f := faults.Of(err)
	if f == nil || !strings.HasPrefix(f.Code, faults.CodeSiteHTTPPrefix) {
		return err
	}
	status, perr := strconv.Atoi(strings.TrimPrefix(f.Code, faults.CodeSiteHTTPPrefix))
	if perr != nil || !wallStatuses[status] {
		return err
	}
	var wall bool
	if t.evalInto(ctx, wallScript, false, wallTimeout, &wall) != nil || !wall {
		return err
	}
	return faults.Wrap(err, faults.CodeSiteBlocked, faults.PermissionDenied, faults.Site,
		strings.TrimSuffix(f.Message, ".")+": the site answered with a bot wall or a CAPTCHA").WithRetryable(false)
}
