package browser

import (
	"context"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// Waits in flight end with the session: Close or a browser crash ends them
// at once with the session's error, not after their own time with ok.
func TestWaitsInFlightEndWithTheSession(t *testing.T) {
	path := testenv.RequireChromium(t)
	becomeSubreaper(t)
	for _, end := range []string{"close", "crash"} {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		s, err := Launch(ctx, Options{ExecPath: path, DownloadDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/busy.html"})
		waits := []Action{{Type: ActWait, MS: 15000}, {Type: ActWait, Until: "networkidle", MS: 15000}}
		type outcome struct {
			a     Action
			res   []Result
			err   error
			after time.Time
		}
		out := make(chan outcome, len(waits))
		for _, a := range waits {
			go func() {
				res, err := s.Do(ctx, []Action{a})
				out <- outcome{a, res, err, time.Now()}
			}()
		}
		time.Sleep(500 * time.Millisecond)
		ended := time.Now()
		want := faults.CodeBrowserClosed
		if end == "close" {
			s.Close()
		} else {
			s.InjectCrash()
			want = faults.CodeBrowserCrashed
		}
		for range waits {
			o := <-out
			if d := o.after.Sub(ended); d > 3*time.Second || !faults.Is(o.err, want) {
				t.Errorf("%s: wait %s%s returned %v later: %+v %v, want %s", end, o.a.Type, o.a.Until, d.Round(time.Millisecond), o.res, o.err, want)
			}
		}
		s.Close()
		cancel()
	}
}
