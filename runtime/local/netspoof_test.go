package local

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/orchard/orchard/internal/testing/testenv"
	"github.com/orchard/orchard/runtime"
)

// spoofWAN stands in for the internet: a network namespace one hop from
// the host (host 203.0.113.1, it 203.0.113.2) with a UDP socket that
// reports each datagram's source.
func spoofWAN(t *testing.T) (addr string, from <-chan string) {
	t.Helper()
	var pc net.PacketConn
	testenv.WAN(t, "orsp", "203.0.113.1/30", "203.0.113.2/30", func() (err error) {
		pc, err = net.ListenPacket("udp4", "203.0.113.2:0")
		return err
	})
	t.Cleanup(func() { pc.Close() })
	ch := make(chan string, 16)
	go func() {
		buf := make([]byte, 512)
		for {
			n, src, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			ch <- src.(*net.UDPAddr).IP.String() + " " + string(buf[:n])
		}
	}()
	return pc.LocalAddr().String(), ch
}

// TestFullNetworkNoSpoofing: a full-network sandbox (root, CAP_NET_RAW)
// must not send packets with a source address other than its own: they
// would leave the host un-NATed, or be NATed as another sandbox's.
func TestFullNetworkNoSpoofing(t *testing.T) {
	_, err := exec.LookPath("perl")
	testenv.Require(t, "perl", err == nil, "the raw-socket probe is a perl script")
	addr, from := spoofWAN(t)
	host, port, _ := net.SplitHostPort(addr)
	l := newLocal(t)
	create(t, l, runtime.Spec{ID: "spoof", NetworkMode: runtime.NetworkFull})

	// Honest traffic goes out, masqueraded.
	if out, code := agentExecForTest(t, l, "spoof", fmt.Sprintf("echo honest > /dev/udp/%s/%s", host, port)); code != 0 {
		t.Fatalf("udp send: %d %s", code, out)
	}
	select {
	case got := <-from:
		if got != "203.0.113.1 honest\n" {
			t.Fatalf("honest datagram arrived as %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("honest datagram never arrived: full network not working")
	}

	script := fmt.Sprintf(`use Socket;
socket(my $s, AF_INET, SOCK_RAW, 255) or die "socket: $!";
my ($src, $dst, $p) = (inet_aton("198.51.100.77"), inet_aton("%s"), "spoofed");
my $udp = pack("nnnn", 40000, %s, 8 + length($p), 0) . $p;
my $ip = pack("CCnnnCCna4a4", 0x45, 0, 20 + length($udp), 0, 0, 64, 17, 0, $src, $dst);
send($s, $ip . $udp, 0, pack_sockaddr_in(0, $dst)) or die "send: $!";
print "sent\n";`, host, port)
	if out, _ := agentExecForTest(t, l, "spoof", "perl -e '"+script+"'"); !strings.Contains(out, "sent") {
		t.Fatalf("the raw send failed in the sandbox, so nothing is shown: %s", out)
	}
	select {
	case got := <-from:
		t.Errorf("a datagram with a forged source left the host: %q", got)
	case <-time.After(2 * time.Second):
	}
}
