// Package pagetest opens one of Orchard's own pages (the HTML replay, the
// run report) in a fresh headless Chromium and records every request the
// page makes, so tests can check that a page fetches nothing from
// anywhere.
package pagetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/orchard/orchard/internal/testing/testenv"
)

// Open navigates a new Chromium (skipped without one, as
// testenv.RequireChromium) to url with a width×height viewport and returns
// a context bound to the tab, valid for a minute, and a function giving
// the URLs requested so far. The proxy points nowhere, so a request that
// leaves the machine fails instead of reaching the network.
func Open(t *testing.T, url string, width, height int64) (context.Context, func() []string) {
	t.Helper()
	chromium := testenv.RequireChromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.WindowSize(int(width), int(height)), chromedp.Flag("proxy-server", "127.0.0.1:9"), chromedp.UserDataDir(t.TempDir()))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	var mu sync.Mutex // guards urls, appended from chromedp's event goroutine
	var urls []string
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			mu.Lock()
			urls = append(urls, e.Request.URL)
			mu.Unlock()
		}
	}))
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // the browser starts with no deadline of its own
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	tctx, tcancel := context.WithTimeout(ctx, time.Minute)
	t.Cleanup(tcancel)
	if err := chromedp.Do(tctx, chromedp.EmulateViewport(width, height), chromedp.Navigate(url), chromedp.WaitReady("body")); err != nil {
		t.Fatal(err)
	}
	return tctx, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), urls...) }
}
