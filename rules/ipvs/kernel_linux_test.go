package ipvs

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/internal/netnstest"
)

// TestKernelSetsRoundTrip adds members of every hash set type the writer uses to real ipsets in a network
// namespace and lists them back: what the kernel returns must be the entries added, so that a resync
// compares like with like. (KP_E2E=1, root.)
func TestKernelSetsRoundTrip(t *testing.T) {
	nh := enterNetns(t)
	s := &kernelSets{h: nh}
	ip := netip.MustParseAddr
	cases := []struct {
		typ     string
		family  v1.IPFamily
		entries []entry
	}{
		{typeHashIP, v1.IPv4Protocol, []entry{{ip: ipOf(ip("10.96.0.1"))}}},
		{typeHashIPPort, v1.IPv4Protocol, []entry{ipPortEntry(ip("10.96.0.1"), protoTCP, 80), ipPortEntry(ip("10.96.0.2"), protoUDP, 53)}},
		{typeHashIPPortIP, v1.IPv4Protocol, []entry{ipPortEntry(ip("10.1.0.1"), protoTCP, 8080).withIP2(ip("10.1.0.1"))}},
		{typeHashIPPortNet, v1.IPv4Protocol, []entry{ipPortEntry(ip("192.0.2.10"), protoTCP, 443).withNet(netip.MustParsePrefix("10.0.0.0/8")),
			ipPortEntry(ip("192.0.2.10"), protoTCP, 443).withNet(netip.MustParsePrefix("203.0.113.7/32"))}},
		{typeHashIPPortNet, v1.IPv6Protocol, []entry{ipPortEntry(ip("2001:db8::10"), protoTCP, 443).withNet(netip.MustParsePrefix("fd00::/8"))}},
		{typeBitmapPort, v1.IPv4Protocol, []entry{{port: 30080}}},
		// More members than one netlink message holds: the dump's later messages have no type name.
		{typeHashIPPortNet, v1.IPv4Protocol, manyNetEntries(3000)},
	}
	for i, tc := range cases {
		name := "KP-TEST-" + string(rune('A'+i))
		if err := s.createSet(name, tc.typ, tc.family); err != nil {
			t.Fatalf("creating %s %s: %v", tc.typ, tc.family, err)
		}
		for _, e := range tc.entries {
			if err := s.addEntry(name, tc.typ, e); err != nil {
				t.Fatalf("adding %s to %s: %v", e, tc.typ, err)
			}
		}
		got, err := s.listSet(name)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, entry.compare)
		want := slices.SortedFunc(slices.Values(tc.entries), entry.compare)
		if !slices.Equal(got, want) {
			t.Errorf("%s %s: listed %v, added %v", tc.typ, tc.family, got, want)
		}
	}
}

// enterNetns moves the test's goroutine, on a thread of its own, into a new network namespace until the
// test ends, and returns a netlink handle there. Everything a test does on that goroutine (sockets opened
// per request too) happens in the namespace, as in the daemon, which runs in its node's.
func enterNetns(t *testing.T) *netlink.Handle {
	t.Helper()
	ns := netnstest.New(t)
	runtime.LockOSThread() // never unlocked: the thread ends with the test's goroutine
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	h, err := netns.GetFromName(ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	nh, err := netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nh.Close()
		netns.Set(orig)
		orig.Close()
		h.Close()
	})
	return nh
}

// TestKernelAddrs lists a link's addresses and the node's (every link but one) with the writer's lean
// dump, in a network namespace, and compares them with netlink.AddrList's. (KP_E2E=1, root.)
func TestKernelAddrs(t *testing.T) {
	nh := enterNetns(t)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kp-a"}, PeerName: "kp-b"}
	if err := nh.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"lo", "kp-a", "kp-b"} {
		lk, err := nh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := nh.LinkSetUp(lk); err != nil {
			t.Fatal(err)
		}
	}
	add := func(link, cidr string) {
		lk, err := nh.LinkByName(link)
		if err != nil {
			t.Fatal(err)
		}
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			t.Fatal(err)
		}
		a.Flags = unix.IFA_F_NODAD
		if err := nh.AddrAdd(lk, a); err != nil {
			t.Fatalf("adding %s to %s: %v", cidr, link, err)
		}
	}
	for i := 1; i <= 50; i++ { // like Service addresses on kube-ipvs0
		add("kp-a", fmt.Sprintf("10.96.0.%d/32", i))
		add("kp-a", fmt.Sprintf("fd00:96::%x/128", i))
	}
	add("kp-b", "192.168.7.2/24")
	add("kp-b", "fd00:7::2/64")
	l := &kernelLinks{h: nh, index: map[string]int{}}
	a, err := nh.LinkByName("kp-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		want := func(keep func(netlink.Addr) bool) []netip.Addr {
			list, err := nh.AddrList(nil, nlFamily(fam))
			if err != nil {
				t.Fatal(err)
			}
			var out []netip.Addr
			for _, x := range list {
				if keep(x) {
					out = append(out, addrOf(x.IP))
				}
			}
			return out
		}
		got, err := l.addrs("kp-a", fam)
		if w := want(func(x netlink.Addr) bool { return x.LinkIndex == a.Attrs().Index }); err != nil || !slices.Equal(got, w) || len(got) < 50 {
			t.Errorf("%s addrs(kp-a) = %v, %v; AddrList says %v", fam, got, err, w)
		}
		got, err = l.localAddrs(fam, "kp-a")
		if w := want(func(x netlink.Addr) bool { return x.LinkIndex != a.Attrs().Index }); err != nil || !slices.Equal(got, w) || len(got) < 2 {
			t.Errorf("%s localAddrs(but kp-a) = %v, %v; AddrList says %v", fam, got, err, w)
		}
	}
}

func manyNetEntries(n int) []entry {
	out := make([]entry, n)
	for i := range out {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)})
		out[i] = ipPortEntry(ip, protoTCP, 443).withNet(netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(i % 256), 0}), 24))
	}
	return out
}

// TestParseIPVSService reads virtual servers from attributes laid out as the kernel sends them.
func TestParseIPVSService(t *testing.T) {
	svc := func(af uint16, addr []byte, proto uint16, port uint16, sched string, flags, timeout, fwmark uint32) []byte {
		a := nl.NewRtAttr(ipvsCmdAttrService|unix.NLA_F_NESTED, nil)
		a.AddRtAttr(ipvsSvcAttrAf, nl.Uint16Attr(af))
		a.AddRtAttr(ipvsSvcAttrProto, nl.Uint16Attr(proto))
		a.AddRtAttr(ipvsSvcAttrAddr, addr)
		a.AddRtAttr(ipvsSvcAttrPort, []byte{byte(port >> 8), byte(port)})
		if fwmark != 0 {
			a.AddRtAttr(ipvsSvcAttrFwmark, nl.Uint32Attr(fwmark))
		}
		a.AddRtAttr(ipvsSvcAttrSched, nl.ZeroTerminated(sched))
		a.AddRtAttr(ipvsSvcAttrFlags, append(nl.Uint32Attr(flags), 0xff, 0xff, 0xff, 0xff))
		a.AddRtAttr(ipvsSvcAttrTimeout, nl.Uint32Attr(timeout))
		a.AddRtAttr(10, make([]byte, 40)) // stats, ignored
		return a.Serialize()
	}
	v4 := netip.MustParseAddr("10.96.0.10").AsSlice()
	v4 = append(v4, make([]byte, 12)...) // the kernel sends 16 bytes for both families
	v6 := netip.MustParseAddr("fd00:96::10").AsSlice()
	var got []kernelVS
	for _, msg := range [][]byte{
		svc(unix.AF_INET, v4, unix.IPPROTO_TCP, 80, "rr", 0, 0, 0),
		svc(unix.AF_INET6, v6, unix.IPPROTO_UDP, 53, "sh", 0x8|flagHashed, 10800, 0),
		svc(unix.AF_INET, v4, 0, 0, "rr", 0, 0, 7), // fwmark: skipped
	} {
		eachAttr(msg, func(typ uint16, v []byte) {
			if typ != ipvsCmdAttrService {
				t.Fatalf("outer attribute %d", typ)
			}
			if vs, ok := parseIPVSService(v); ok {
				got = append(got, vs)
			}
		})
	}
	want := []kernelVS{
		{key: newVSKey(netip.MustParseAddr("10.96.0.10"), 80, protoTCP), scheduler: "rr"},
		{key: newVSKey(netip.MustParseAddr("fd00:96::10"), 53, protoUDP), scheduler: "sh", flags: 0x8, timeout: 10800},
	}
	if !slices.Equal(got, want) {
		t.Errorf("parsed %+v, want %+v", got, want)
	}
	if _, ok := parseIPVSService(svc(unix.AF_INET, v4[:2], unix.IPPROTO_TCP, 80, "rr", 0, 0, 0)[unix.SizeofRtAttr:]); ok {
		t.Error("a short address parsed")
	}
}
