package redis_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/store"
	"github.com/orchard/orchard/store/redis"
)

// openTLS returns a Store on a TLS server that trusts its CA, closed when
// t ends.
func openTLS(t *testing.T, srv *testenv.RedisServer, prefix string) *redis.Store {
	t.Helper()
	s, err := redis.New(ctx(t), redis.Config{URL: srv.URL(), CAFile: srv.CAFile(), Prefix: prefix,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatalf("New over TLS with the CA file: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestTLSWithCAFile(t *testing.T) {
	srv := testenv.StartRedisTLS(t)
	p := uniquePrefix()
	a, b := openTLS(t, srv, p), openTLS(t, srv, p)
	c := ctx(t)

	if err := a.CreateSandbox(c, store.Sandbox{ID: "s1", Image: "host", CreatedAt: 1}); err != nil {
		t.Fatal(err)
	}
	got, err := b.GetSandbox(c, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "s1" || got.Image != "host" || got.CreatedAt != 1 {
		t.Fatalf("GetSandbox over TLS = %+v", got)
	}

	ev, cancel, err := b.Subscribe(c, store.JobTopic("j"))
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if err := a.Publish(c, store.JobTopic("j")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ev:
	case <-time.After(5 * time.Second):
		t.Fatal("publish over TLS did not reach the subscriber within 5s")
	}
}

// assertFault fails t unless err is a platform fault with code.
func assertFault(t *testing.T, what string, err error, code string, retryable bool) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: New succeeded", what)
	}
	f := faults.Of(err)
	if f == nil || f.Code != code || f.Source != faults.Platform || f.Retryable != retryable {
		t.Fatalf("%s: want platform %s (retryable %v), got %#v: %v", what, code, retryable, f, err)
	}
}

func TestTLSRejections(t *testing.T) {
	srv := testenv.StartRedisTLS(t)
	newStore := func(url, caFile string) error {
		s, err := redis.New(ctx(t), redis.Config{URL: url, CAFile: caFile, Prefix: uniquePrefix(),
			Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
		if err == nil {
			_ = s.Close()
		}
		return err
	}

	// The system roots do not know the test's CA: the handshake fails,
	// which New reports as it reports any Redis it cannot use.
	err := newStore(srv.URL(), "")
	assertFault(t, "rediss:// without CAFile", err, faults.CodeStoreUnavailable, true)
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("rediss:// without CAFile failed, but not on the certificate: %v", err)
	}

	// Plain RESP to a TLS-only port gets no answer a client can read.
	plain := "redis://" + srv.Addr() + "/0"
	assertFault(t, "redis:// to the TLS port", newStore(plain, ""),
		faults.CodeStoreUnavailable, true)

	// A CA file with a plain URL would leave TLS off without a word.
	assertFault(t, "redis:// with CAFile", newStore(plain, srv.CAFile()),
		faults.CodeMisconfigured, false)

	missing := filepath.Join(t.TempDir(), "missing.pem")
	assertFault(t, "missing CAFile", newStore(srv.URL(), missing),
		faults.CodeMisconfigured, false)

	junk := filepath.Join(t.TempDir(), "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	assertFault(t, "CAFile without certificates", newStore(srv.URL(), junk),
		faults.CodeMisconfigured, false)
}
