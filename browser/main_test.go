package browser

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/orchard/orchard/faults"
	"github.com/orchard/orchard/internal/testing/testenv"
)

//go:embed testdata
var testdata embed.FS

// One browser for the package (launching costs over a second), a new tab
// per test; tests that need other options or kill the browser start their
// own.
var shared struct {
	once sync.Once
	s    *Session
	err  error
	dl   string
}

var site *httptest.Server

func TestMain(m *testing.M) {
	site = httptest.NewServer(testHandler())
	code := m.Run()
	if shared.s != nil {
		shared.s.Close()
		os.RemoveAll(shared.dl)
	}
	site.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func testHandler() http.Handler {
	sub, _ := fs.Sub(testdata, "testdata")
	mux := http.NewServeMux()
	mux.Handle("/", http.FileServerFS(sub))
	mux.HandleFunc("/status/{code}", func(w http.ResponseWriter, r *http.Request) {
		var code int
		fmt.Sscan(r.PathValue("code"), &code)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(code)
		fmt.Fprintf(w, "<title>Status %d</title><h1>status %d</h1>", code, code)
	})
	mux.HandleFunc("/file/{name}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", "attachment; filename=\""+r.PathValue("name")+"\"")
		fmt.Fprint(w, strings.Repeat("report line\n", 1000))
	})
	mux.HandleFunc("/slowfetch.html", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<title>Slow</title><button id="go" onclick="setTimeout(function(){fetch('/delay').then(r=>r.text()).then(t=>{document.getElementById('out').textContent=t})},50)">Go</button><div id="out"></div>`)
	})
	mux.HandleFunc("/hang.html", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<title>Hang</title><button id="spin" onclick="for(;;){}">Spin</button>`)
	})
	mux.HandleFunc("/delay", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(400 * time.Millisecond)
		fmt.Fprint(w, "done")
	})
	return mux
}

// browserSession returns the shared session, launched on first use.
func browserSession(t testing.TB) *Session {
	t.Helper()
	path := testenv.RequireChromium(t)
	shared.once.Do(func() {
		dir, err := os.MkdirTemp("", "orchard-dl-")
		if err != nil {
			shared.err = err
			return
		}
		shared.dl = dir
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		shared.s, shared.err = Launch(ctx, Options{ExecPath: path, DownloadDir: dir})
	})
	if shared.err != nil {
		t.Fatalf("launch: %v", shared.err)
	}
	return shared.s
}

// openPage opens a tab for the test (closed at its end) and loads page in it.
func openPage(t testing.TB, page string) *Session {
	t.Helper()
	s := browserSession(t)
	mustDo(t, s, Action{Type: ActNewTab, URL: site.URL + page})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		// Leave exactly the tabs the test found: close every tab but the first.
		for len(s.Tabs()) > 1 {
			idx := len(s.Tabs()) - 1
			if _, err := s.Do(ctx, []Action{{Type: ActCloseTab, Index: &idx}}); err != nil {
				t.Errorf("close tab: %v", err)
				return
			}
		}
		zero := 0
		s.Do(ctx, []Action{{Type: ActSwitchTab, Index: &zero}})
	})
	return s
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mustDo runs actions and fails the test on any failed result.
func mustDo(t testing.TB, s *Session, actions ...Action) []Result {
	t.Helper()
	res, err := s.Do(ctxT(t), actions)
	if err != nil {
		t.Fatalf("do %v: %v", types(actions), err)
	}
	for i, r := range res {
		if !r.OK {
			t.Fatalf("action %d (%s) failed: %+v", i, r.Type, *r.Error)
		}
	}
	if len(res) != len(actions) {
		t.Fatalf("got %d results for %d actions", len(res), len(actions))
	}
	return res
}

// failCode runs one action and returns the code it failed with.
func failCode(t testing.TB, s *Session, a Action) *faults.Info {
	t.Helper()
	res, err := s.Do(ctxT(t), []Action{a})
	if err != nil {
		t.Fatalf("do %s: session error %v", a.Type, err)
	}
	if len(res) != 1 || res[0].OK {
		t.Fatalf("do %s: want a failure, got %+v", a.Type, res)
	}
	return res[0].Error
}

func types(as []Action) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Type)
	}
	return out
}

// js evaluates expr in the active tab and decodes its value into a T.
func js[T any](t testing.TB, s *Session, expr string) T {
	t.Helper()
	var v T
	tb, err := s.activeTab(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := tb.eval(ctxT(t), expr, false, 10*time.Second)
	if err != nil {
		t.Fatalf("eval %s: %v", expr, err)
	}
	if len(raw) == 0 {
		return v
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("eval %s: decode %s: %v", expr, raw, err)
	}
	return v
}

func observe(t testing.TB, s *Session, o ObserveOptions) Observation {
	t.Helper()
	obs, err := s.Observe(ctxT(t), o)
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	return obs
}

func fptr(v float64) *float64 { return &v }
func iptr(v int) *int         { return &v }

// freePort returns a loopback port nothing listens on.
func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}
