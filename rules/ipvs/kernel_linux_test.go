package ipvs

import (
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/internal/netnstest"
)

// TestKernelSetsRoundTrip adds members of every hash set type the writer uses to real ipsets in a network
// namespace and lists them back: what the kernel returns must be the entries added, so that a resync
// compares like with like. (KP_E2E=1, root.)
func TestKernelSetsRoundTrip(t *testing.T) {
	ns := netnstest.New(t)
	// The whole test runs on one thread moved into the namespace: bitmap:port members go over a socket of
	// the thread's own namespace, as in the daemon (which runs in its node's namespace).
	runtime.LockOSThread() // never unlocked: the thread ends with the test's goroutine
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	h, err := netns.GetFromName(ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	defer netns.Set(orig)
	nh, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
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
