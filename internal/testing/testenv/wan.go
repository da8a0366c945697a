package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// WAN stands in for the internet in tests of routed (full-network)
// sandboxes: a network namespace one hop from the host, the host's end of
// the link at hostAddr and the namespace's at wanAddr (CIDR, a /30
// between them). inside runs in the namespace to open the sockets the
// test serves from, which stay there. name tells test binaries apart; the
// namespace and link are removed when the test ends.
func WAN(t *testing.T, name, hostAddr, wanAddr string, inside func() error) {
	t.Helper()
	_, err := exec.LookPath("nft")
	Require(t, "nftables", err == nil, "full-network mode needs nft")
	name = fmt.Sprintf("%s%d", name, os.Getpid()%100000)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			_ = netns.Set(host)
			t.Fatalf("%s: %v", what, err)
		}
	}
	wan, err := netns.NewNamed(name) // switches this thread into it
	must("new namespace", err)
	t.Cleanup(func() { wan.Close(); _ = netns.DeleteNamed(name) })
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	must("back to the host", netns.Set(host))
	must("veth", netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}))
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	addr := func(s string) *netlink.Addr {
		a, err := netlink.ParseAddr(s)
		must("address "+s, err)
		return a
	}
	hostEnd, err := netlink.LinkByName(name)
	must("host end", err)
	peer, err := netlink.LinkByName(name + "p")
	must("far end", err)
	must("move the far end", netlink.LinkSetNsFd(peer, int(wan)))
	must("address the host end", netlink.AddrAdd(hostEnd, addr(hostAddr)))
	must("host end up", netlink.LinkSetUp(hostEnd))
	h, err := netlink.NewHandleAt(wan)
	must("handle in the namespace", err)
	defer h.Close()
	in, err := h.LinkByName(name + "p")
	must("far end in the namespace", err)
	must("address the far end", h.AddrAdd(in, addr(wanAddr)))
	must("far end up", h.LinkSetUp(in))
	must("into the namespace", netns.Set(wan))
	err = inside()
	must("back to the host", netns.Set(host))
	must("serve in the namespace", err)
}
