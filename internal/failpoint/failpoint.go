// Package failpoint puts named fault points in production code that tests
// switch on: a point returns a classified error, sleeps, or panics, so that
// retry, attribution and recording are tested on real code paths instead of
// mock runtimes.
//
// Code under test calls Eval at the point:
//
//	if err := failpoint.Eval("runtime.local.create"); err != nil {
//		return err
//	}
//
// and a test enables it:
//
//	t.Cleanup(failpoint.Enable("runtime.local.create",
//		failpoint.Return(faults.New(faults.CodeCreateFailed, faults.Internal, faults.Platform, "injected")).Times(1)))
//
// While no point is enabled anywhere in the process, Eval is one atomic load
// and allocates nothing, so points may sit on hot paths.
//
// A child process (the agent, started by a test) takes its points from the
// environment variable ORCHARD_FAILPOINTS, read at the first Eval or Enable:
//
//	ORCHARD_FAILPOINTS = entry *( ";" entry )
//	entry   = name "=" [ count "*" ] action
//	name    = 1*( letter / digit / "." / "_" / "-" / "/" )
//	count   = positive decimal integer: the action fires that many times, then the point is off
//	action  = "error(" code ")"      ; return faults.Error with code; class from faults.Lookup
//	        / "sleep(" duration ")"  ; time.ParseDuration syntax, then return nil
//	        / "panic" / "panic()"
//
// For example "agent.exec=2*error(sandbox.oom);browser.navigate=sleep(200ms)".
// Spaces around entries and their parts are ignored, and so are empty
// entries. A malformed value makes that first Eval or Enable panic with the
// reason: a mistyped point must not pass silently. Parse checks a value
// before a test hands it to a child.
//
// Points are process-wide, so tests that enable the same name must not run
// in parallel.
package failpoint

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orchard/orchard/faults"
)

// EnvVar is the environment variable a process reads its points from.
const EnvVar = "ORCHARD_FAILPOINTS"

type kind uint8

const (
	kindNone kind = iota
	kindError
	kindSleep
	kindPanic
)

// Action is what an enabled point does when evaluated. Build one with
// Return, Sleep or Panic; the zero Action is invalid.
type Action struct {
	kind  kind
	err   *faults.Error
	delay time.Duration
	times int // 0: every evaluation
}

// Return is the action that makes Eval return a copy of err.
func Return(err *faults.Error) Action {
	if err == nil {
		panic("failpoint: Return(nil)")
	}
	return Action{kind: kindError, err: err}
}

// Sleep is the action that makes Eval sleep for d, then return nil. The
// sleep ignores contexts, as a hung dependency would.
func Sleep(d time.Duration) Action {
	if d < 0 {
		panic(fmt.Sprintf("failpoint: Sleep(%v): negative duration", d))
	}
	return Action{kind: kindSleep, delay: d}
}

// Panic is the action that makes Eval panic with a message naming the point.
func Panic() Action { return Action{kind: kindPanic} }

// Times returns a fires only for the first n evaluations; after them the
// point behaves as if disabled.
func (a Action) Times(n int) Action {
	if n < 1 {
		panic(fmt.Sprintf("failpoint: Times(%d): want at least 1", n))
	}
	a.times = n
	return a
}

// String is the action in the ORCHARD_FAILPOINTS grammar.
func (a Action) String() string {
	var s string
	switch a.kind {
	case kindError:
		s = "error(" + a.err.Code + ")"
	case kindSleep:
		s = "sleep(" + a.delay.String() + ")"
	case kindPanic:
		s = "panic"
	default:
		return "invalid"
	}
	if a.times > 0 {
		s = fmt.Sprintf("%d*%s", a.times, s)
	}
	return s
}

// point is an enabled failpoint.
type point struct {
	name string
	act  Action
	left atomic.Int64 // fires left when act.times > 0
}

func newPoint(name string, a Action) *point {
	p := &point{name: name, act: a}
	p.left.Store(int64(a.times))
	return p
}

func (p *point) fire() error {
	if p.act.times > 0 && p.left.Add(-1) < 0 {
		return nil
	}
	switch p.act.kind {
	case kindError:
		// A copy per caller: callers may set Status or Retryable on the
		// error they receive.
		e := *p.act.err
		return &e
	case kindSleep:
		time.Sleep(p.act.delay)
	case kindPanic:
		panic(fmt.Sprintf("failpoint %s: injected panic", p.name))
	}
	return nil
}

// table maps names to enabled points. A published table is never modified:
// Enable and disable publish a new one.
type table map[string]*point

var (
	// armed is false while no point is enabled and the environment has
	// been read: all Eval checks on its fast path. It follows active.
	armed atomic.Bool
	// active is the published table: nil when no point is enabled, unread
	// before the environment has been read.
	active atomic.Pointer[table]
	unread = new(table)
	// mu guards publishing active and armed, so that concurrent Enables do
	// not lose each other's points.
	mu sync.Mutex
)

func init() { publishTableLocked(unread) }

// Eval evaluates the point called name: nil unless a test enabled it, else
// what its action says.
func Eval(name string) error {
	if armed.Load() {
		return evalSlow(name)
	}
	return nil
}

func evalSlow(name string) error {
	t := active.Load()
	if t == unread {
		t = loadEnv()
	}
	if t == nil {
		return nil
	}
	p := (*t)[name]
	if p == nil {
		return nil
	}
	return p.fire()
}

// publishTableLocked makes t the table Eval sees. mu must be held, except
// in init.
func publishTableLocked(t *table) {
	active.Store(t)
	armed.Store(t != nil)
}

func loadEnv() *table {
	mu.Lock()
	defer mu.Unlock()
	return loadEnvLocked()
}

// loadEnvLocked reads EnvVar into active if that has not happened yet and
// returns the published table. mu must be held.
func loadEnvLocked() *table {
	t := active.Load()
	if t != unread {
		return t
	}
	acts, err := Parse(os.Getenv(EnvVar))
	if err != nil {
		panic(fmt.Sprintf("%s: %v", EnvVar, err))
	}
	t = nil
	if len(acts) > 0 {
		m := make(table, len(acts))
		for name, a := range acts {
			m[name] = newPoint(name, a)
		}
		t = &m
	}
	publishTableLocked(t)
	return t
}

// Enable switches the point called name on with action a, replacing what it
// did before, and returns the function that switches it off again. The
// returned function is safe to call more than once and does nothing once
// the point has been enabled again by someone else. An invalid name or
// action panics: both are mistakes in the test.
func Enable(name string, a Action) (disable func()) {
	if err := checkName(name); err != nil {
		panic("failpoint: Enable: " + err.Error())
	}
	if a.kind == kindNone {
		panic(fmt.Sprintf("failpoint: Enable(%q): zero Action", name))
	}
	p := newPoint(name, a)
	mu.Lock()
	defer mu.Unlock()
	editLocked(func(m table) { m[name] = p })
	return func() {
		mu.Lock()
		defer mu.Unlock()
		editLocked(func(m table) {
			if m[name] == p {
				delete(m, name)
			}
		})
	}
}

// editLocked publishes a copy of the current table changed by edit. mu
// must be held.
func editLocked(edit func(table)) {
	old := loadEnvLocked()
	m := make(table)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	edit(m)
	if len(m) == 0 {
		publishTableLocked(nil)
		return
	}
	publishTableLocked(&m)
}
