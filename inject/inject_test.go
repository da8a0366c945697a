package inject

import (
	"testing"

	"github.com/orchard/orchard/faults"
)

func TestStepFaultsCountTheirDomain(t *testing.T) {
	in := New(&faults.Plan{Faults: []faults.Injection{
		{Kind: faults.InjectBrowserCrash, P: 1, AfterSteps: 2, Times: 1},
		{Kind: faults.InjectOOM, P: 1, AfterSteps: 1, Times: 1},
	}}, 1)
	// A task's setup exec does not count towards the browser fault.
	in.Step(Exec)
	if _, _, ok := in.AtStep(Exec, faults.InjectOOM); !ok {
		t.Fatal("oom at the first exec")
	}
	in.Step(Browser)
	if _, _, ok := in.AtStep(Browser, faults.InjectBrowserCrash); ok {
		t.Fatal("crash fired at the first browser step")
	}
	in.Step(Browser)
	f, truth, ok := in.AtStep(Browser, faults.InjectBrowserCrash)
	if !ok || f.Kind != faults.InjectBrowserCrash || truth.Code != faults.CodeBrowserCrashed || truth.Step != 2 {
		t.Fatalf("crash at browser step 2: %v %+v %+v", ok, f, truth)
	}
	in.Step(Browser)
	if _, _, ok := in.AtStep(Browser, faults.InjectBrowserCrash); ok {
		t.Fatal("times: 1 fired twice")
	}
	if in.Steps("") != 4 || in.Steps(Browser) != 3 {
		t.Fatalf("steps: all %d, browser %d", in.Steps(""), in.Steps(Browser))
	}
}

func TestConnectionFaults(t *testing.T) {
	in := New(&faults.Plan{Faults: []faults.Injection{
		{Kind: faults.InjectDNSFailure, P: 1, Match: "*.example.com"},
		{Kind: faults.InjectHTTPStatus, P: 0, Status: 503},
	}}, 1)
	cases := []struct {
		host string
		want bool
	}{{"a.example.com", true}, {"example.com", true}, {"notexample.com", false}, {"other.org", false}}
	for _, c := range cases {
		f, truth, ok := in.Connection(c.host)
		if ok != c.want || ok && (f.Kind != faults.InjectDNSFailure || truth.Host != c.host || truth.Code != faults.CodeSiteDNS) {
			t.Errorf("%s: %v %+v %+v", c.host, ok, f, truth)
		}
	}
	var nilIn *Injector
	if _, _, ok := nilIn.Connection("x"); ok || nilIn.Step(Exec) != 0 {
		t.Error("a nil injector fires")
	}
}
