package browser

import (
	"context"
	_ "embed"
	"encoding/json"
	"strings"

	"github.com/orchard/orchard/faults"
)

//go:embed page.js
var pageJS string

//go:embed pacer.js
var pacerJS string

//go:embed pending.js
var pendingJS string

// libExpr is an expression that installs the page library in the current
// document if needed (under a symbol, not enumerable) and calls it.
func libExpr(call string) string {
	var b strings.Builder
	b.Grow(len(pageJS) + len(call) + 160)
	b.WriteString("(function(){var k=Symbol.for('orchard.page'),L=window[k];if(!L){L=")
	b.WriteString(pageJS)
	b.WriteString(";Object.defineProperty(window,k,{value:L,configurable:true})}return L.")
	b.WriteString(call)
	b.WriteString("})()")
	return b.String()
}

// ref names an element for the page library: a set-of-marks id or a CSS
// selector.
type ref struct {
	ID  *int   `json:"id,omitempty"`
	Sel string `json:"sel,omitempty"`
}

func refOf(a Action) *ref {
	switch {
	case a.Element != nil:
		return &ref{ID: a.Element}
	case a.Selector != "":
		return &ref{Sel: a.Selector}
	}
	return nil
}

func (r *ref) js() string {
	if r == nil {
		return "null"
	}
	b, _ := json.Marshal(r)
	return string(b)
}

func (r *ref) String() string {
	if r.ID != nil {
		return "element " + itoa(*r.ID)
	}
	return "selector " + r.Sel
}

// libErr is the failure shape of the page library's answers.
type libErr struct {
	Err     string   `json:"err"`
	Msg     string   `json:"msg"`
	Tag     string   `json:"tag"`
	Options []string `json:"options"`
}

// class turns a page-library failure about target r into a faults.Error.
func (e libErr) class(what string, r *ref) *faults.Error {
	switch e.Err {
	case "stale":
		if r.ID != nil {
			return errStaleElement(*r.ID)
		}
	case "nosuch":
		if r.ID != nil {
			return errNoSuchElement("%s: no element %d in the last observation", what, *r.ID)
		}
		return errNoSuchElement("%s: no element matches %s", what, r.Sel)
	case "hidden":
		return errNoSuchElement("%s: %s is not visible", what, r)
	case "selector":
		return errInvalid("%s: invalid selector %q: %s", what, r.Sel, e.Msg)
	case "not_editable":
		return faults.Newf(faults.CodeActionNotEditable, faults.ActionFailed, faults.Policy, "%s: %s (%s) does not take text", what, r, e.Tag)
	case "not_select":
		return errInvalid("%s: %s (%s) is not a select", what, r, e.Tag)
	case "not_file":
		return errInvalid("%s: %s (%s) is not a file input", what, r, e.Tag)
	case "no_option":
		return faults.Newf(faults.CodeActionNoSuchOpt, faults.ActionFailed, faults.Policy, "%s: no such option; options: %s", what, strings.Join(e.Options, ", "))
	case "disabled":
		return faults.Newf(faults.CodeActionInvalid, faults.ActionFailed, faults.Policy, "%s: %s is disabled", what, r)
	}
	return errNoSuchElement("%s: %s: %s", what, r, e.Err)
}

// located is where the page library found an element.
type located struct {
	libErr
	X, Y, W, H float64
	Tag        string
}

// locate finds the element of r, scrolls it into view when needed and
// returns the centre of its box in viewport CSS pixels.
func (s *Session) locate(ctx context.Context, t *tab, what string, r *ref) (float64, float64, error) {
	var l located
	if err := t.evalInto(ctx, libExpr("locate("+r.js()+")"), false, s.opts.CallTimeout, &l); err != nil {
		return 0, 0, s.classify(ctx, t, what, err)
	}
	if l.Err != "" {
		return 0, 0, l.class(what, r)
	}
	return l.X, l.Y, nil
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// jsonString quotes s as a JavaScript string literal.
func jsonString(s string) (string, error) {
	b, err := json.Marshal(s)
	return string(b), err
}
