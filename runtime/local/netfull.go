package local

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/orchard/orchard/faults"
)

// Full-network mode gives a sandbox a real interface for tools that do not
// speak HTTP proxies: a veth pair (host end "ob<hash>", sandbox end eth0)
// with a /30 from fullNetPrefix, a default route through the host, and one
// nftables table on the host that masquerades the sandboxes' traffic and
// drops what they must not reach — the host itself, private, loopback and
// link-local ranges, the host's own networks, and each other. DNS reaches
// only the resolvers of the host's resolv.conf.

// fullNetPrefix holds the sandboxes' /30s: 16,384 of them.
var fullNetPrefix = netip.MustParsePrefix("10.200.0.0/16")

// nftTable is the host table full-network mode owns.
const nftTable = "orchard"

// hostLinkPrefix names the host ends of sandbox veths; the nft rules
// match it.
const hostLinkPrefix = "ob"

// fullNet allocates the sandboxes' subnets and installs the host rules.
type fullNet struct {
	mu    sync.Mutex // guards used, ready
	used  map[int]string
	ready bool
}

// hostLinkName is the host end of id's veth: interface names are at most
// 15 bytes, sandbox ids up to 63.
func hostLinkName(id string) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	return fmt.Sprintf("%s%08x", hostLinkPrefix, h.Sum32())
}

// subnet returns the host and sandbox addresses of /30 number i.
func subnet(i int) (host, box netip.Addr) {
	base := binary.BigEndian.Uint32(fullNetPrefix.Addr().AsSlice()) + uint32(4*i)
	var h, b [4]byte
	binary.BigEndian.PutUint32(h[:], base+1)
	binary.BigEndian.PutUint32(b[:], base+2)
	return netip.AddrFrom4(h), netip.AddrFrom4(b)
}

const subnets = 1 << 14

// allocate picks a free /30 for id, starting from its hash so that most
// ids get the same subnet on every attempt.
func (f *fullNet) allocate(id string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.used == nil {
		f.used = map[int]string{}
		f.scanLocked()
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	start := int(h.Sum32() % (subnets - 1))
	for k := range subnets - 1 {
		i := 1 + (start+k)%(subnets-1) // 0 is never used: it holds the network address
		if _, taken := f.used[i]; !taken {
			f.used[i] = id
			return i, nil
		}
	}
	return 0, faults.New(faults.CodeCapacity, faults.Capacity, faults.Platform, "full-network mode: no free sandbox subnet")
}

func (f *fullNet) release(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	link := hostLinkName(id)
	for i, owner := range f.used {
		if owner == id || owner == link {
			delete(f.used, i)
		}
	}
}

// scanLocked marks the subnets of veths an earlier server process left.
func (f *fullNet) scanLocked() {
	links, err := netlink.LinkList()
	if err != nil {
		return
	}
	for _, l := range links {
		if !strings.HasPrefix(l.Attrs().Name, hostLinkPrefix) {
			continue
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			ip, _ := netip.AddrFromSlice(a.IP.To4())
			if fullNetPrefix.Contains(ip) {
				off := binary.BigEndian.Uint32(ip.AsSlice()) - binary.BigEndian.Uint32(fullNetPrefix.Addr().AsSlice())
				f.used[int(off/4)] = l.Attrs().Name
			}
		}
	}
}

// setupFullNetwork connects the sandbox whose first process is pid.
func (l *Local) setupFullNetwork(id string, pid int) error {
	if err := l.fullNet.ensureRules(); err != nil {
		return err
	}
	i, err := l.fullNet.allocate(id)
	if err != nil {
		return err
	}
	hostIP, boxIP := subnet(i)
	name := hostLinkName(id)
	_ = deleteLink(name) // left by a crashed create of the same id
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		l.fullNet.release(id)
		return fmt.Errorf("add veth: %w", err)
	}
	fail := func(what string, err error) error {
		_ = deleteLink(name)
		l.fullNet.release(id)
		return fmt.Errorf("%s: %w", what, err)
	}
	peer, err := netlink.LinkByName(name + "p")
	if err != nil {
		return fail("find veth peer", err)
	}
	if err := netlink.LinkSetNsPid(peer, pid); err != nil {
		return fail("move veth into the sandbox", err)
	}
	host, err := netlink.LinkByName(name)
	if err != nil {
		return fail("find veth", err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(hostIP, 30)}); err != nil {
		return fail("address the host end", err)
	}
	// Strict reverse-path filtering on the host end: the kernel drops what
	// arrives from the sandbox with any source but the sandbox's own
	// address. Root in the sandbox has CAP_NET_RAW and writes its own IP
	// headers; without this, a forged source left the host un-NATed, or
	// NATed as another sandbox's (whose connection it then was).
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+name+"/rp_filter", []byte("1\n"), 0o644); err != nil {
		return fail("filter the host end's sources", err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fail("bring the host end up", err)
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return fail("open the sandbox's network namespace", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fail("enter the sandbox's network namespace", err)
	}
	defer h.Close()
	in, err := h.LinkByName(name + "p")
	if err != nil {
		return fail("find the sandbox end", err)
	}
	if err := h.LinkSetName(in, "eth0"); err != nil {
		return fail("name the sandbox end", err)
	}
	if err := h.AddrAdd(in, &netlink.Addr{IPNet: ipNet(boxIP, 30)}); err != nil {
		return fail("address the sandbox end", err)
	}
	if err := h.LinkSetUp(in); err != nil {
		return fail("bring the sandbox end up", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: in.Attrs().Index, Gw: net.IP(hostIP.AsSlice())}); err != nil {
		return fail("route the sandbox", err)
	}
	return nil
}

// teardownFullNetwork removes the host end (the sandbox end goes with its
// namespace) and frees the subnet.
func (l *Local) teardownFullNetwork(id string) error {
	err := deleteLink(hostLinkName(id))
	l.fullNet.release(id)
	return err
}

func deleteLink(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	// The kernel deletes the pair by itself when the sandbox's namespace
	// goes away, which may happen between the lookup and the delete.
	if err := netlink.LinkDel(link); err != nil && !errors.Is(err, syscall.ENODEV) {
		return err
	}
	return nil
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// ensureRules installs the host side once per process: forwarding on and
// the nft table (replaced whole, so a rule set from an earlier version of
// the server never lingers).
func (f *fullNet) ensureRules() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ready {
		return nil
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return faults.New(faults.CodeNetworkEgressOff, faults.NotImplemented, faults.Platform,
			"full-network mode needs nftables on the host (apt-get install nftables)")
	}
	script, err := nftRules(resolvers("/etc/resolv.conf"), hostNetworks())
	if err != nil {
		return err
	}
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install nft rules: %v: %s", err, bytes.TrimSpace(out))
	}
	// Host-wide: the kernel forwards only when this is on.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enable forwarding: %w", err)
	}
	f.ready = true
	return nil
}

// blockedRanges are never reached from a sandbox (the egress proxy's list).
var blockedRanges = []string{
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
	"192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
}

func nftRules(dns []netip.Addr, hostNets []netip.Prefix) (string, error) {
	blocked := append([]string(nil), blockedRanges...)
	for _, p := range hostNets {
		blocked = append(blocked, p.Masked().String())
	}
	var res []string
	for _, a := range dns {
		res = append(res, a.String())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\ntable inet %s {\n", nftTable, nftTable, nftTable)
	fmt.Fprintf(&b, "  set blocked { type ipv4_addr; flags interval; auto-merge; elements = { %s } }\n", strings.Join(blocked, ", "))
	if len(res) > 0 {
		fmt.Fprintf(&b, "  set resolvers { type ipv4_addr; elements = { %s } }\n", strings.Join(res, ", "))
	} else {
		b.WriteString("  set resolvers { type ipv4_addr; }\n")
	}
	fmt.Fprintf(&b, `  chain forward {
    type filter hook forward priority -10; policy accept;
    iifname "%[1]s*" oifname "%[1]s*" drop
    iifname "%[1]s*" meta nfproto ipv6 drop
    iifname "%[1]s*" ip daddr @resolvers meta l4proto { tcp, udp } th dport 53 accept
    iifname "%[1]s*" ip daddr @blocked drop
  }
  chain input {
    type filter hook input priority -10; policy accept;
    iifname "%[1]s*" ct state established,related accept
    iifname "%[1]s*" drop
  }
  chain postrouting {
    type nat hook postrouting priority 100; policy accept;
    ip saddr %[2]s oifname != "%[1]s*" masquerade
  }
}
`, hostLinkPrefix, fullNetPrefix)
	return b.String(), nil
}

// resolvers lists the IPv4 name servers of a resolv.conf.
func resolvers(path string) []netip.Addr {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil && a.Is4() && !a.IsLoopback() {
				out = append(out, a)
			}
		}
	}
	return out
}

// hostNetworks are the networks of the host's uplinks (its LAN):
// a sandbox reaches the internet through the host, never the host's
// neighbours.
func hostNetworks() []netip.Prefix {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil
	}
	uplinks := map[int]bool{}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			uplinks[r.LinkIndex] = true
		}
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if !uplinks[a.LinkIndex] {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || ip.IsLoopback() || fullNetPrefix.Contains(ip) {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip, ones))
	}
	return out
}
