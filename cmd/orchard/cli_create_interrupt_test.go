package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"github.com/orchard/orchard/client"
)

// Interrupting `sandbox create --wait` must not leave behind a sandbox
// whose id was never printed.
func TestCLICreateInterruptedLeavesNothing(t *testing.T) {
	c := newCLI(t)
	cl := client.New(c.env["ORCHARD_URL"], c.env["ORCHARD_API_KEY"])
	labels := client.ListOptions{Labels: map[string]string{"suite": "interrupt"}}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		// Interrupt once the server has accepted the create.
		for ctx.Err() == nil {
			if list, _ := cl.ListSandboxes(ctx, labels); len(list) > 0 {
				cancel()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	err := run(ctx, []string{"sandbox", "create", "--wait", "--kind", "browser", "--label", "suite=interrupt"},
		func(k string) string { return c.env[k] })
	cancel()
	if err == nil {
		t.Skip("the sandbox was ready before the interrupt")
	}
	list, lerr := cl.ListSandboxes(context.Background(), labels)
	for _, sb := range list {
		_ = cl.DeleteSandbox(context.Background(), sb.SandboxID)
	}
	if lerr != nil || len(list) > 0 {
		t.Fatalf("create --wait interrupted (%v) left %d sandbox(es) behind (list err %v)", err, len(list), lerr)
	}
}

// An interrupt that comes after the server made the sandbox but before its
// answer reached the CLI must not leave the sandbox behind either: the CLI
// drew its id and deletes it.
func TestCLICreateInterruptedBeforeItsAnswer(t *testing.T) {
	c := newCLI(t)
	up, err := url.Parse(c.env["ORCHARD_URL"])
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The create reaches the server and is answered, but the answer is
	// held until the user's interrupt.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/sandboxes" {
			proxy.ServeHTTP(httptest.NewRecorder(), r.WithContext(context.WithoutCancel(r.Context())))
			cancel()
			<-r.Context().Done()
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()
	err = run(ctx, []string{"sandbox", "create", "--wait", "--label", "suite=interrupt-post"}, func(k string) string {
		if k == "ORCHARD_URL" {
			return front.URL
		}
		return c.env[k]
	})
	if err == nil {
		t.Fatal("create returned no error though interrupted before its answer")
	}
	cl := client.New(c.env["ORCHARD_URL"], c.env["ORCHARD_API_KEY"])
	list, lerr := cl.ListSandboxes(context.Background(), client.ListOptions{Labels: map[string]string{"suite": "interrupt-post"}})
	for _, sb := range list {
		_ = cl.DeleteSandbox(context.Background(), sb.SandboxID)
	}
	if lerr != nil || len(list) > 0 {
		t.Fatalf("create interrupted before its answer (%v) left %d sandbox(es) behind (list err %v)", err, len(list), lerr)
	}
}
