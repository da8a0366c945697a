package browser

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

// A browser that exits before it answers is started once more; one that
// keeps exiting is reported as a launch failure after the second start.
func TestLaunchRetriesAnEarlyExit(t *testing.T) {
	real := testenv.RequireChromium(t)
	cases := []struct {
		name     string
		failures int // starts that exit at once before the real browser runs
		wantOK   bool
	}{
		{"first start exits", 1, true},
		{"every start exits", 99, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "starts")
			exe := filepath.Join(dir, "browser")
			script := fmt.Sprintf("#!/bin/sh\necho start >> %s\nif [ $(wc -l < %s) -le %d ]; then exit 1; fi\nexec %s \"$@\"\n",
				log, log, c.failures, real)
			if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, err := Launch(ctx, Options{ExecPath: exe, DownloadDir: t.TempDir()})
			starts, _ := os.ReadFile(log)
			n := strings.Count(string(starts), "start")
			if c.wantOK {
				if err != nil {
					t.Fatalf("launch after %d starts: %v", n, err)
				}
				defer s.Close()
				mustDo(t, s, Action{Type: ActNavigate, URL: site.URL + "/basic.html"})
				if n != 2 {
					t.Errorf("%d starts, want 2", n)
				}
				return
			}
			if f := faults.Of(err); err == nil || f.Code != faults.CodeBrowserLaunch {
				t.Fatalf("launch of a browser that always exits: %v", err)
			}
			if n != launchAttempts {
				t.Errorf("%d starts, want %d", n, launchAttempts)
			}
		})
	}
}
