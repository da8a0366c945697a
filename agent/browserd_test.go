package agent

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/orchard/orchard/api"
)

// The `browser` settings of a create request reach the browser session.
func TestBrowserOptionsSession(t *testing.T) {
	cases := []struct {
		name  string
		json  string
		check func(t *testing.T, o api.BrowserOptions)
	}{
		{"empty", `{}`, func(t *testing.T, o api.BrowserOptions) {
			so := browserSession(o, slog.Default())
			if so.FastFrames || so.AutoAcceptDialogs || so.SettleQuiet != 0 || so.ProxyServer != "" || !so.DevTools {
				t.Errorf("defaults: %+v", so)
			}
		}},
		{"fast frames", `{"fast_frames": true}`, func(t *testing.T, o api.BrowserOptions) {
			if !browserSession(o, slog.Default()).FastFrames {
				t.Error("fast_frames not passed on")
			}
		}},
		{"settle and timeouts", `{"settle_quiet_ms": 30, "settle_idle_ms": 10, "plain_settle": true, "call_timeout_ms": 2000, "auto_accept_dialogs": true}`, func(t *testing.T, o api.BrowserOptions) {
			so := browserSession(o, slog.Default())
			if so.SettleQuiet != 30*time.Millisecond || so.SettleIdle != 10*time.Millisecond || !so.PlainSettle || so.CallTimeout != 2*time.Second || !so.AutoAcceptDialogs {
				t.Errorf("got %+v", so)
			}
		}},
		{"engine", `{"engine": "chromium"}`, func(t *testing.T, o api.BrowserOptions) {
			if e := browserSession(o, slog.Default()).Engine; e != "chromium" {
				t.Errorf("engine %q", e)
			}
		}},
		{"proxy", `{"proxy_server": "127.0.0.1:3128"}`, func(t *testing.T, o api.BrowserOptions) {
			if so := browserSession(o, slog.Default()); so.ProxyServer != "http://127.0.0.1:3128" || so.Evidence == nil {
				t.Errorf("proxy %q, evidence set: %v", so.ProxyServer, so.Evidence != nil)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var o api.BrowserOptions
			if err := json.Unmarshal([]byte(c.json), &o); err != nil {
				t.Fatal(err)
			}
			c.check(t, o)
		})
	}
}
