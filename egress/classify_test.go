package egress

import (
	"context"
	"testing"

	"github.com/orchard/orchard/faults"
)

// A dial its caller gave up on is client.canceled, whether it was still
// resolving the name or already connecting: the proxy's log is the
// evidence navigations are attributed by, and a canceled connection must
// not read there as a failing resolver.
func TestCanceledDialIsCanceled(t *testing.T) {
	t.Parallel()
	d := &Dialer{}
	cases := []struct{ name, host string }{
		{"resolving", "canceled.example.com"},
		{"connecting", "192.0.2.1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := d.Dial(ctx, Policy{}, c.host, 80)
			if f := faults.Of(err); f.Code != faults.CodeCanceled || f.Source != faults.Client {
				t.Errorf("dial of %s with its context canceled: %s from %s (%v), want %s from %s",
					c.host, f.Code, f.Source, err, faults.CodeCanceled, faults.Client)
			}
		})
	}
}
