package agent

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/orchard/orchard/faults"
)

// Fault injection at steps: each exec and each browser action request is
// a step. A fault that fires is applied before the step runs, and the
// response carries its kind in HeaderInjected so a chaos run can score the
// attribution it gets.

// HeaderInjected names the fault a plan injected into a response's step.
const HeaderInjected = "X-Orchard-Injected"

// injectPath is the browser daemon's path for step faults.
const injectPath = "/browser/_inject"

var errInvalidInject = errors.New("unknown fault kind")

// stepFault applies the fault the plan holds for this step, if any. kinds
// are those that can fire on this kind of step. It returns the kind
// applied, or "" when none fired.
func (s *Server) stepFault(w http.ResponseWriter, domain string, kinds ...string) string {
	if s.inject == nil {
		return ""
	}
	step := s.inject.Step(domain)
	f, _, ok := s.inject.AtStep(domain, kinds...)
	if !ok {
		return ""
	}
	s.log.Warn("injecting fault", "kind", f.Kind, "step", step)
	switch f.Kind {
	case faults.InjectAgentKill:
		// PID 1 exiting takes the sandbox with it, as a crashed agent does.
		fmt.Fprintln(os.Stderr, "orchard-agent: killed by fault plan")
		os.Exit(137)
	case faults.InjectBrowserCrash, faults.InjectHang:
		// Tagged only when applied: a browser still restarting from an
		// earlier fault cannot take this one, and the step's failure is
		// that earlier fault's.
		if s.browser == nil {
			return ""
		}
		if err := s.browser.inject(f.Kind); err != nil {
			s.log.Warn("inject", "kind", f.Kind, "err", err)
			return ""
		}
	}
	w.Header().Set(HeaderInjected, f.Kind)
	return f.Kind
}

// inject asks the browser daemon to apply a fault to its browser.
func (b *browserProc) inject(kind string) error {
	hc := &http.Client{Transport: b.proxy.Transport, Timeout: 5 * time.Second}
	resp, err := hc.Post("http://browser"+injectPath+"?kind="+kind, "application/json", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("browser daemon answered %s", resp.Status)
	}
	return nil
}

// Hog allocates memory until the kernel kills it: the command an injected
// oom fault runs in place of the step's command (`orchard-agent hog`).
func Hog() {
	const chunk = 8 << 20
	var keep [][]byte
	for {
		b := make([]byte, chunk)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		keep = append(keep, b)
	}
}
