package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"kube-proxy/rules/internal/tracecases"
	"kube-proxy/rules/iptables/iptrace"
)

// traceState gives the fake kernel's iptables model what IPVS mode's rules and packets meet besides the
// rules: the ipsets (already handed over at each restore) and the IPVS virtual servers of the family.
func traceState(t *testing.T, k *fakeKernel, cfg Config) *iptrace.Tables {
	t.Helper()
	f := k.rules[cfg.Family]
	if err := f.syncSets(); err != nil {
		t.Fatal(err)
	}
	f.ts.ClearVirtualServers()
	list, _ := k.ipvs.services()
	for _, v := range list {
		if familyOf(v.key.Addr()) != cfg.Family {
			continue
		}
		vs := iptrace.VirtualServer{Addr: v.key.Addr(), Port: v.key.port, Protocol: v.key.proto.String(),
			Persistent: v.flags&flagPersistent != 0}
		rs, _ := k.ipvs.reals(v.key)
		for _, r := range rs {
			vs.Reals = append(vs.Reals, iptrace.RealServer{Addr: netip.AddrPortFrom(r.key.Addr(), r.key.port), Weight: int(r.weight)})
		}
		if err := f.ts.AddVirtualServer(vs); err != nil {
			t.Fatal(err)
		}
	}
	return f.ts
}

// TestTraceCases runs the table of truth every mode shares (rules/internal/tracecases) through what a
// full sync leaves in the fake kernel: the iptables rules with the ipsets they match, and IPVS.
func TestTraceCases(t *testing.T) {
	snap := tracecases.Snapshot()
	cfg := testConfig(v4)
	cfg.LocalDetector.CIDR = netip.MustParsePrefix(tracecases.ClusterCIDR)
	k := newFakeKernel(t, tracecases.NodeIP)
	d := newTestDataplane(t, k, cfg, nil)
	apply(t, d, snap, true)
	ts := traceState(t, k, cfg)
	// The Service addresses are local: they are bound to kube-ipvs0.
	bound, _ := k.links.addrs(DummyLink, v4)
	sticky := snap.Services[tracecases.StickyService]
	tracecases.Run(t, tracecases.IPVS, func(p tracecases.Packet) (tracecases.Outcome, string, error) {
		pkt := iptrace.Packet{Src: p.From.Src, Dst: p.Dst.Addr(), DPort: p.Dst.Port(), Protocol: p.Protocol,
			InIface: p.From.In, Local: p.From.In == "", LocalAddrs: append(slices.Clone(p.LocalAddrs), bound...)}
		if pkt.Local && !pkt.Src.IsLoopback() && slices.Contains(pkt.LocalAddrs, pkt.Dst) {
			// The node's own connection to one of its addresses leaves from that address (the source
			// the kernel picks for a local destination); Service addresses are local in IPVS mode.
			pkt.Src = pkt.Dst
		}
		if p.From.StickyTo != "" {
			vs := newVSKey(sticky.ClusterIP, uint16(sticky.Port), protoTCP)
			pkt.Persistence = map[string]netip.AddrPort{vs.String(): netip.MustParseAddrPort(p.From.StickyTo)}
		}
		res, err := ts.Trace(pkt)
		if err != nil {
			return tracecases.Outcome{}, "", err
		}
		masq, ok := res.Masquerade()
		if !ok {
			return tracecases.Outcome{}, res.String(), fmt.Errorf("some branches masqueraded, some not:\n%s", res)
		}
		return tracecases.Outcome{Endpoints: res.Endpoints(), Masq: masq, Verdicts: res.Verdicts()}, res.String(), nil
	})
}
