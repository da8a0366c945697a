package egress

import (
	"net"
	"testing"
)

func TestSpliceable(t *testing.T) {
	tcp, unixc := &net.TCPConn{}, &net.UnixConn{}
	cases := []struct {
		name string
		a, b any
		want bool
	}{
		{"tcp and tcp", tcp, tcp, true},
		{"tcp and unix", tcp, unixc, true},
		{"unix and tcp", unixc, tcp, true},
		{"unix and unix", unixc, unixc, false},
		{"tcp and a wrapper", tcp, &bufConn{Conn: tcp}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := spliceable(c.a, c.b); got != c.want {
				t.Errorf("spliceable = %v, want %v", got, c.want)
			}
		})
	}
}
