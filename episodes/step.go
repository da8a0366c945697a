package episodes

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/orchard/orchard/api"
	"github.com/orchard/orchard/evaluate"
	"github.com/orchard/orchard/faults"
)

// Step is one step of an episode as its sandbox runs it: the actions for
// the browser or desktop daemon and the observation to take after them.
// Actions stay JSON: they are the policy's action objects, passed through
// to the daemon, which reads them (a desktop's in any of its dialects).
type Step struct {
	Actions []json.RawMessage
	Observe *api.Observe
	// Reset marks step 0, the start page: ours, not the policy's, so it
	// is not counted, and not kept in the history or as an action.
	Reset bool
	// Action is what the policy sent, as the recording and the judge keep
	// it: the action object itself when it sent one (the replay marks its
	// x, y), else the list; nil for step 0 (FORMAT.md: no action on step 0).
	Action json.RawMessage

	// answer is the text of the last `answer` action; answered whether
	// there was one. An answer ends the episode.
	answer   string
	answered bool
}

// navigateRetry is the retry policy of the start page's load: a site that
// is slow to answer the first request is common and not the policy's fault.
var navigateRetry = api.RetryPolicy{Attempts: 3, InitialMS: 500, MaxMS: 4000}

// FirstStep is step 0: the start page, loaded with the navigation retry
// policy; on a desktop, the screen as the task's setup left it.
func (ep *Episode) FirstStep() Step {
	st := Step{Observe: ep.Observe, Reset: true}
	if ep.Task.StartURL != "" && ep.Browser() {
		retry := navigateRetry
		a, _ := json.Marshal(api.BrowserAction{Type: "navigate", URL: ep.Task.StartURL, Retry: &retry})
		st.Actions = []json.RawMessage{a}
	}
	return st
}

// NextStep is the step a POST /episodes/{id}/step asks for: its actions
// (Actions, then Action) with its observation settings, or the episode's.
func (ep *Episode) NextStep(req api.StepRequest) (Step, error) {
	actions := req.Actions
	if len(req.Action) > 0 {
		actions = append(actions, req.Action)
	}
	if len(actions) == 0 {
		return Step{}, faults.Validation(faults.FieldError{Type: "missing", Loc: []any{"body", "action"}, Msg: "Field required", Input: nil})
	}
	observe := ep.Observe
	if req.Observe != nil {
		observe = req.Observe
	}
	// Compacted, as the recording has always kept them.
	b, err := json.Marshal(actions)
	if err != nil {
		return Step{}, faults.Wrap(err, faults.CodeValidation, faults.InvalidRequest, faults.Client, "actions: "+err.Error())
	}
	var list []json.RawMessage
	_ = json.Unmarshal(b, &list)
	st := Step{Actions: list, Observe: observe, Action: b}
	if len(list) == 1 {
		st.Action = list[0]
	}
	for _, a := range list {
		var v map[string]any
		if json.Unmarshal(a, &v) != nil {
			continue
		}
		switch {
		case v["type"] == "answer":
			st.answer, _ = v["text"].(string)
			st.answered = true
		case v["type"] == "submit" && ep.Shell():
			// A shell policy's "done": the episode ends with the answer
			// it has, if any.
			if !st.answered {
				st.answer = ep.Answer
			}
			st.answered = true
		}
	}
	return st, nil
}

// ActionsRequest is the body of a browser's or desktop's actions call
// (api.BrowserActionsRequest, api.DesktopActionsRequest) with the actions
// as the policy sent them.
type ActionsRequest struct {
	Actions []json.RawMessage `json:"actions,omitempty"`
	Observe *api.Observe      `json:"observe,omitempty"`
}

// Request is the daemon's path on the sandbox's agent and the body that
// runs st. The browser takes `answer` as an action that does nothing; the
// desktop has no such action, so it is kept from the desktop, which gets
// the rest.
func (st Step) Request(desktop bool) (string, ActionsRequest) {
	if !desktop {
		return "/browser/actions", ActionsRequest{Actions: st.Actions, Observe: st.Observe}
	}
	var rest []json.RawMessage
	for _, a := range st.Actions {
		var v map[string]any
		if json.Unmarshal(a, &v) == nil && v["type"] == "answer" {
			continue
		}
		rest = append(rest, a)
	}
	if len(rest) == 0 {
		// Only an observation is wanted (step 0, an answer): the desktop
		// takes no request without actions.
		rest = []json.RawMessage{json.RawMessage(`{"type":"wait","ms":0}`)}
	}
	return "/desktop/actions", ActionsRequest{Actions: rest, Observe: st.Observe}
}

// StepTimeout is the budget of ep's next step and the fault that names
// its end: the policy's, as a step's actions are.
func (ep *Episode) StepTimeoutCause() (time.Duration, error) {
	return ep.StepTimeout, faults.Newf(faults.CodeEpisodeDeadline, faults.Timeout, faults.Policy,
		"step %d ran past its %s budget", ep.Steps+1, ep.StepTimeout)
}

// Outcome is what came of a step in the sandbox: the classified error of
// the call or of an action, the fault a fault plan injected, the
// observation, and how long it took.
type Outcome struct {
	Error       *faults.Info
	Injected    *faults.Truth
	Observation api.StepObservation
	Elapsed     time.Duration
}

// Decode reads a daemon's answer (HTTP 200) of kind (a sandbox kind; ""
// is a browser, as episodes stored before kinds): the last action error
// and injected fault, the observation.
func (o *Outcome) Decode(raw []byte, kind string) {
	var err error
	if kind == api.KindDesktop {
		var resp api.DesktopActionsResponse
		err = json.Unmarshal(raw, &resp)
		for _, r := range resp.Results {
			if r.Error != nil {
				o.Error = r.Error
			}
		}
		o.Observation = api.StepObservation{Desktop: resp.Observation}
	} else {
		var resp api.BrowserActionsResponse
		err = json.Unmarshal(raw, &resp)
		for _, r := range resp.Results {
			if r.Error != nil {
				o.Error = r.Error
			}
			if r.Injected != nil {
				o.Injected = r.Injected
			}
		}
		o.Observation = api.StepObservation{Browser: resp.Observation}
	}
	if err != nil {
		if kind == "" {
			kind = api.KindBrowser
		}
		i := faults.Wrap(err, faults.CodeBadResponse, faults.Unavailable, faults.Platform, "bad "+kind+" answer").Info()
		o.Error = &i
	}
}

// historyOutput bounds the output a shell step keeps in the episode's
// history: a judge reads how each command ended, and the stored episode
// stays small however long its commands' output.
const historyOutput = 400

// shellOutput is how a shell step ended, as its history keeps it: the
// exit code and the last historyOutput bytes of stdout and stderr.
func shellOutput(o *api.ShellObservation) string {
	if o == nil {
		return ""
	}
	out := strings.TrimSpace(o.Stdout + "\n" + o.Stderr)
	if len(out) > historyOutput {
		cut := len(out) - historyOutput
		for cut < len(out) && !utf8.RuneStart(out[cut]) {
			cut++
		}
		out = "…" + out[cut:]
	}
	if out == "" {
		return fmt.Sprintf("exit %d", o.ExitCode)
	}
	return fmt.Sprintf("exit %d: %s", o.ExitCode, out)
}

// Observation is the part of a browser's or desktop's observation an
// episode and its recording read.
type Observation struct {
	URL        string
	Title      string
	Text       string
	AXTree     string
	Frame      int64
	Scale      float64
	Screenshot *Screenshot
}

// Screenshot is an observation's image.
type Screenshot struct {
	Format string
	Data   []byte
	Width  int
	Height int
}

// observationOf is the part of o an episode reads; a desktop's frame and
// scale are its screenshot's.
func observationOf(o api.StepObservation) Observation {
	switch {
	case o.Browser != nil:
		b := o.Browser
		obs := Observation{URL: b.URL, Title: b.Title, Text: b.Text, AXTree: b.AXTree, Frame: b.Frame, Scale: b.Scale}
		if sc := b.Screenshot; sc != nil {
			obs.Screenshot = &Screenshot{Format: sc.Format, Data: sc.Data, Width: sc.Width, Height: sc.Height}
		}
		return obs
	case o.Desktop != nil && o.Desktop.Screenshot != nil:
		sc := o.Desktop.Screenshot
		return Observation{Frame: sc.ID, Scale: sc.Scale,
			Screenshot: &Screenshot{Format: sc.Format, Data: sc.Data, Width: sc.Width, Height: sc.Height}}
	}
	return Observation{}
}

// Apply moves ep past st, which came to o: it counts the step, ends ep
// env_error on an environment fault, done on an answer, the step budget or
// the deadline, and keeps the history and the last screenshots. It returns
// the step's answer to the policy and the observation it read. Failures
// are the step's info, not an error: the trainer gets them as the step's
// outcome.
func (ep *Episode) Apply(st Step, o Outcome, now time.Time) (api.StepResult, Observation) {
	info := api.StepInfo{Step: ep.Steps, Error: o.Error, Injected: o.Injected}
	if st.answered {
		ep.Answer = st.answer
	}
	if !st.Reset {
		ep.Steps++
		info.Step = ep.Steps
	}
	info.StepMS = float64(o.Elapsed.Microseconds()) / 1000
	done := false
	if IsEnvFault(info.Error) {
		ep.EndEnvError(*info.Error, info.Step)
		done = true
	}
	if st.answered {
		done = true
	}
	if ep.Steps >= ep.MaxSteps || now.After(ep.Deadline) {
		done = true
	}
	if done && ep.Status == api.EpisodeRunning {
		ep.Status = api.EpisodeDone
	}
	obs := observationOf(o.Observation)
	if obs.URL != "" {
		ep.LastURL = obs.URL
	}
	errText := ""
	if info.Error != nil {
		errText = info.Error.Code
	}
	if !st.Reset {
		ep.History = append(ep.History, evaluate.Step{N: info.Step, Action: st.Action, URL: obs.URL, Error: errText,
			Output: shellOutput(o.Observation.Shell)})
	}
	if obs.Screenshot != nil && len(obs.Screenshot.Data) > 0 {
		ep.screens = append(ep.screens, obs.Screenshot.Data)
		if len(ep.screens) > judgeScreenshots {
			ep.screens = ep.screens[len(ep.screens)-judgeScreenshots:]
		}
		ep.screensDirty = true
	}
	return api.StepResult{Observation: o.Observation, Done: done, Info: info}, obs
}
