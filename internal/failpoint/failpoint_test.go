package failpoint

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orchard/orchard/faults"
)

// Top-level tests here do not call t.Parallel: points are process-wide, and
// some tests check the state with nothing enabled.

func injected() *faults.Error {
	return faults.New(faults.CodeCreateFailed, faults.Internal, faults.Platform, "injected")
}

// outcome runs Eval and reports what happened, recovering a panic.
func outcome(name string) (err error, panicked any, took time.Duration) {
	start := time.Now()
	defer func() {
		panicked = recover()
		took = time.Since(start)
	}()
	return Eval(name), nil, 0
}

func TestActions(t *testing.T) {
	cases := []struct {
		name      string
		action    Action
		wantCode  string
		wantPanic bool
		minSleep  time.Duration
	}{
		{name: "return", action: Return(injected()), wantCode: faults.CodeCreateFailed},
		{name: "sleep", action: Sleep(30 * time.Millisecond), minSleep: 30 * time.Millisecond},
		{name: "panic", action: Panic(), wantPanic: true},
		{name: "return once", action: Return(injected()).Times(1), wantCode: faults.CodeCreateFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := "test.actions/" + strings.ReplaceAll(tc.name, " ", "_")
			if err, p, _ := outcome(name); err != nil || p != nil {
				t.Fatalf("before Enable: err %v, panic %v", err, p)
			}
			disable := Enable(name, tc.action)
			err, p, took := outcome(name)
			switch {
			case tc.wantPanic:
				if msg := fmt.Sprint(p); !strings.Contains(msg, name) {
					t.Fatalf("panic %q does not name the point", msg)
				}
			case p != nil:
				t.Fatalf("unexpected panic %v", p)
			case tc.wantCode != "":
				if !faults.Is(err, tc.wantCode) {
					t.Fatalf("Eval = %v, want code %s", err, tc.wantCode)
				}
			default:
				if err != nil {
					t.Fatalf("Eval = %v, want nil", err)
				}
			}
			if took < tc.minSleep {
				t.Fatalf("Eval took %v, want at least %v", took, tc.minSleep)
			}
			disable()
			disable()
			if err, p, _ := outcome(name); err != nil || p != nil {
				t.Fatalf("after disable: err %v, panic %v", err, p)
			}
		})
	}
}

func TestTimes(t *testing.T) {
	defer Enable("test.times", Return(injected()).Times(2))()
	for i, want := range []bool{true, true, false, false} {
		if got := Eval("test.times") != nil; got != want {
			t.Fatalf("evaluation %d fired = %v, want %v", i+1, got, want)
		}
	}
}

func TestEvalReturnsACopy(t *testing.T) {
	e := injected()
	defer Enable("test.copy", Return(e))()
	first := faults.Of(Eval("test.copy")).WithStatus(418).WithRetryable(true)
	second := faults.Of(Eval("test.copy"))
	if first == e || second.Status != 0 || second.Retryable || e.Status != 0 {
		t.Fatalf("callers share the enabled error: %+v, %+v", second, e)
	}
}

func TestEnableReplacesAndStaleDisableKeepsTheNewPoint(t *testing.T) {
	disableOld := Enable("test.replace", Sleep(0))
	disableNew := Enable("test.replace", Return(injected()))
	defer disableNew()
	disableOld()
	if !faults.Is(Eval("test.replace"), faults.CodeCreateFailed) {
		t.Fatal("a stale disable removed the point enabled after it")
	}
	disableNew()
	if Eval("test.replace") != nil {
		t.Fatal("still enabled")
	}
}

func TestEnableRejectsMistakes(t *testing.T) {
	cases := map[string]func(){
		"empty name":    func() { Enable("", Panic()) },
		"name with =":   func() { Enable("a=b", Panic()) },
		"name with ;":   func() { Enable("a;b", Panic()) },
		"name with sp":  func() { Enable("a b", Panic()) },
		"zero action":   func() { Enable("test.zero", Action{}) },
		"nil error":     func() { Return(nil) },
		"negative time": func() { Sleep(-time.Second) },
		"times zero":    func() { Panic().Times(0) },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}

func TestConcurrentEvalAndEnable(t *testing.T) {
	const fires, workers, evals = 100, 16, 50
	defer Enable("test.concurrent", Return(injected()).Times(fires))()
	var fired atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range evals {
				if err := Eval("test.concurrent"); err != nil {
					if !faults.Is(err, faults.CodeCreateFailed) {
						t.Errorf("Eval = %v", err)
					}
					fired.Add(1)
				}
				_ = Eval("test.concurrent.other")
			}
		})
	}
	// Other points come and go while the workers evaluate.
	for i := range workers {
		wg.Go(func() {
			for range evals {
				Enable(fmt.Sprintf("test.concurrent.churn%d", i), Sleep(0))()
			}
		})
	}
	wg.Wait()
	if got := fired.Load(); got != fires {
		t.Fatalf("fired %d times, want exactly %d", got, fires)
	}
}

func TestEvalWithNothingEnabled(t *testing.T) {
	Eval("test.load") // reads the environment, once
	if armed.Load() || active.Load() != nil {
		t.Fatal("points are enabled at the start")
	}
	if n := testing.AllocsPerRun(1000, func() { _ = Eval("test.nothing") }); n != 0 {
		t.Fatalf("Eval allocates %v times with nothing enabled", n)
	}
	disable := Enable("test.something", Panic())
	if !armed.Load() {
		t.Fatal("Enable did not arm Eval")
	}
	if n := testing.AllocsPerRun(1000, func() { _ = Eval("test.nothing") }); n != 0 {
		t.Fatalf("Eval of a disabled point allocates %v times while another is enabled", n)
	}
	disable()
	if armed.Load() || active.Load() != nil {
		t.Fatal("disabling the last point left Eval armed")
	}
}

func BenchmarkEval(b *testing.B) {
	b.Run("nothing enabled", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Eval("bench.point")
		}
	})
	b.Run("another enabled", func(b *testing.B) {
		defer Enable("bench.other", Panic())()
		b.ReportAllocs()
		for b.Loop() {
			_ = Eval("bench.point")
		}
	})
	b.Run("this enabled", func(b *testing.B) {
		defer Enable("bench.point", Return(injected()))()
		b.ReportAllocs()
		for b.Loop() {
			_ = Eval("bench.point")
		}
	})
}

func TestParse(t *testing.T) {
	good := []struct {
		spec string
		want map[string]string // name → Action.String()
	}{
		{"", map[string]string{}},
		{" ; ;", map[string]string{}},
		{"a=panic", map[string]string{"a": "panic"}},
		{"a=panic()", map[string]string{"a": "panic"}},
		{"agent.exec=error(sandbox.oom)", map[string]string{"agent.exec": "error(sandbox.oom)"}},
		{"nav=error(site.http_503)", map[string]string{"nav": "error(site.http_503)"}},
		{"x=sleep(200ms)", map[string]string{"x": "sleep(200ms)"}},
		{"x=sleep(1m30s)", map[string]string{"x": "sleep(1m30s)"}},
		{"x=2*error(browser.crashed)", map[string]string{"x": "2*error(browser.crashed)"}},
		{
			" runtime/local.create = 1 * error( runtime.create_failed ) ; store.redis-write=sleep(0s); p=3*panic; ",
			map[string]string{"runtime/local.create": "1*error(runtime.create_failed)", "store.redis-write": "sleep(0s)", "p": "3*panic"},
		},
	}
	for _, tc := range good {
		t.Run(tc.spec, func(t *testing.T) {
			t.Parallel()
			acts, err := Parse(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for name, a := range acts {
				got[name] = a.String()
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("Parse = %v, want %v", got, tc.want)
			}
		})
	}

	bad := []struct {
		spec, want string
	}{
		{"a", `entry 1 "a": want name=action`},
		{"a=panic;b", `entry 2 "b": want name=action`},
		{"=panic", "empty point name"},
		{"a b=panic", `point name "a b"`},
		{"a=", `unknown action ""`},
		{"a=explode", `unknown action "explode"`},
		{"a=error", "error needs a fault code"},
		{"a=error()", "error needs a fault code"},
		{"a=error(no.such_code)", "error(no.such_code): no such fault code"},
		{"a=error(site.http_200)", "error(site.http_200): no such fault code"},
		{"a=error(sandbox.oom", "missing closing parenthesis"},
		{"a=sleep", "sleep needs a duration"},
		{"a=sleep(soon)", `sleep(soon): time: invalid duration "soon"`},
		{"a=sleep(200)", `sleep(200): time: missing unit`},
		{"a=sleep(-1s)", "sleep(-1s): negative duration"},
		{"a=panic(now)", `panic takes no argument, got "now"`},
		{"a=0*panic", `count "0": want a positive integer`},
		{"a=-1*panic", `count "-1": want a positive integer`},
		{"a=x*panic", `count "x": want a positive integer`},
		{"a=*panic", `count "": want a positive integer`},
		{"a=panic;a=sleep(1s)", "point a is given twice"},
	}
	for _, tc := range bad {
		t.Run("bad "+tc.spec, func(t *testing.T) {
			t.Parallel()
			acts, err := Parse(tc.spec)
			if err == nil {
				t.Fatalf("Parse = %v, want an error", acts)
			}
			if !strings.HasPrefix(err.Error(), "parse failpoints: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestParsedErrorCarriesTheRegistryClass(t *testing.T) {
	acts, err := Parse("p=error(site.http_503);q=error(action.no_such_element)")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]faults.Info{
		"p": {Category: faults.Unavailable, Source: faults.Site, Code: "site.http_503", Message: "injected by failpoint p", Retryable: true},
		"q": {Category: faults.ActionFailed, Source: faults.Policy, Code: faults.CodeActionNoSuchElement, Message: "injected by failpoint q"},
	} {
		if got := acts[name].err.Info(); got != want {
			t.Errorf("%s: %+v, want %+v", name, got, want)
		}
	}
}

// childEnv marks the test binary started by the tests below as the child.
const childEnv = "FAILPOINT_TEST_CHILD"

// TestHelperProcess is the child process: it evaluates points enabled by
// ORCHARD_FAILPOINTS and prints what happened.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(childEnv) {
	case "":
		t.Skip("the child process of TestEnvInChildProcess")
	case "unguarded":
		Eval("c.any")
		fmt.Println("Eval returned")
		return
	}
	for _, name := range []string{"c.err", "c.err", "c.err", "c.sleep", "c.off", "c.panic"} {
		err, p, took := outcome(name)
		switch {
		case p != nil:
			fmt.Printf("%s: panic: %v\n", name, p)
		case err != nil:
			f := faults.Of(err)
			fmt.Printf("%s: %s %s %s retryable=%v\n", name, f.Code, f.Category, f.Source, f.Retryable)
		case name == "c.sleep":
			fmt.Printf("%s: slept=%v\n", name, took >= 50*time.Millisecond)
		default:
			fmt.Printf("%s: nil\n", name)
		}
	}
}

func runChild(t *testing.T, mode, spec string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, EnvVar+"="+spec)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String() + stderr.String(), err
}

func TestEnvInChildProcess(t *testing.T) {
	spec := "c.err=2*error(site.http_503); c.sleep=sleep(50ms); c.panic=panic"
	if _, err := Parse(spec); err != nil {
		t.Fatal(err)
	}
	out, err := runChild(t, "guarded", spec)
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := `c.err: site.http_503 unavailable site retryable=true
c.err: site.http_503 unavailable site retryable=true
c.err: nil
c.sleep: slept=true
c.off: nil
c.panic: panic: failpoint c.panic: injected panic
`
	if !strings.HasPrefix(out, want) {
		t.Fatalf("child printed:\n%s\nwant it to start with:\n%s", out, want)
	}
}

func TestBadEnvFailsLoudlyInChildProcess(t *testing.T) {
	out, err := runChild(t, "unguarded", "c.err=error(no.such_code)")
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child with a bad %s: err %v, want a failed exit\n%s", EnvVar, err, out)
	}
	want := `ORCHARD_FAILPOINTS: parse failpoints: entry 1 "c.err=error(no.such_code)": error(no.such_code): no such fault code`
	if !strings.Contains(out, want) {
		t.Fatalf("child output lacks %q:\n%s", want, out)
	}
}
