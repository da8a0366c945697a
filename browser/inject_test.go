package browser

import (
	"context"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// A hung browser (every process stopped) is found hung at the first call
// that times out, killed, and the session reports browser.hung from then on.
func TestInjectedHangAndCrash(t *testing.T) {
	path := testenv.RequireChromium(t)
	becomeSubreaper(t)
	for _, kind := range []string{faults.InjectHang, faults.InjectBrowserCrash} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s, err := Launch(ctx, Options{ExecPath: path, DownloadDir: t.TempDir(), CallTimeout: time.Second, NavigationTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/basic.html"})
			select {
			case <-s.Dead():
				t.Fatal("Dead closed while the browser works")
			default:
			}
			want := faults.CodeBrowserCrashed
			if kind == faults.InjectHang {
				want = faults.CodeBrowserHung
				err = s.InjectHang()
			} else {
				err = s.InjectCrash()
			}
			if err != nil {
				t.Fatal(err)
			}
			if kind == faults.InjectBrowserCrash {
				// Found dead with no call made, so its owner can restart it
				// before the next one.
				select {
				case <-s.Dead():
				case <-time.After(10 * time.Second):
					t.Fatal("Dead still open 10 s after the crash")
				}
			}
			start := time.Now()
			res, err := s.Do(ctx, []Action{{Type: ActNavigate, URL: site.URL + "/basic.html"}})
			if f := faults.Of(err); err == nil || f.Code != want || f.Source != faults.Browser {
				t.Fatalf("after %s: %v %+v (%v)", kind, res, f, time.Since(start))
			}
			if f := faults.Of(s.Err()); s.Err() == nil || f.Code != want {
				t.Fatalf("Err after %s: %v", kind, s.Err())
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("%s found after %v", kind, el)
			}
			select {
			case <-s.Dead():
			default:
				t.Errorf("Dead still open after %s was found", kind)
			}
		})
	}
}
