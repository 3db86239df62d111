package nftables

import (
	"fmt"
	"net/netip"
	"testing"

	"kube-proxy/proxy"
	"kube-proxy/rules/internal/tracecases"
	"kube-proxy/rules/nftables/nftrace"
)

// caseConfig is the configuration the table of truth assumes: the cluster CIDR as local-traffic
// detector, NodePorts on every node address.
func caseConfig() Config {
	return testConfig(v4, tracecases.ClusterCIDR)
}

// tracer adapts the nftables tracer to the shared case table.
func tracer(ts *nftrace.Tables) tracecases.Tracer {
	return func(p tracecases.Packet) (tracecases.Outcome, string, error) {
		var aff []string
		if p.From.StickyTo != "" {
			aff = []string{prefixAffinity + endpointBase(tracecases.StickyService, netip.MustParseAddrPort(p.From.StickyTo))}
		}
		res, err := ts.Trace(nftrace.Packet{Src: p.From.Src, Dst: p.Dst.Addr(), DPort: p.Dst.Port(), Protocol: p.Protocol,
			InIface: p.From.In, Local: p.From.In == "", LocalAddrs: p.LocalAddrs, Affinity: aff})
		if err != nil {
			return tracecases.Outcome{}, "", err
		}
		masq, ok := res.Masquerade()
		if !ok {
			return tracecases.Outcome{}, res.String(), fmt.Errorf("some branches masqueraded, some not:\n%s", res)
		}
		return tracecases.Outcome{Endpoints: res.Endpoints(), Masq: masq, Verdicts: res.Verdicts()}, res.String(), nil
	}
}

// TestTraceCases runs the table of truth every mode shares through the table a rebuild writes.
func TestTraceCases(t *testing.T) {
	d, k := testDataplane(caseConfig(), tracecases.NodeIP)
	apply(t, d, tracecases.Snapshot(), true)
	ts := nftrace.New()
	if err := ts.Load(k.fake.Dump()); err != nil {
		t.Fatalf("the tracer cannot read the table: %v", err)
	}
	tracecases.Run(t, tracecases.NFTables, tracer(ts))
}

// TestTraceCasesAfterPartialSyncs builds the same table through partial syncs from an unrelated state, so
// that the table of truth also checks what partial syncs leave.
func TestTraceCasesAfterPartialSyncs(t *testing.T) {
	d, k := testDataplane(caseConfig(), tracecases.NodeIP)
	for i, s := range steps() {
		apply(t, d, s, i == 0)
	}
	final := tracecases.Snapshot()
	var gone []proxy.ServicePortName
	for name := range d.state.Last().Services {
		if final.Services[name] == nil {
			gone = append(gone, name)
		}
	}
	var ports []*proxy.ServicePort
	for _, sp := range final.Services {
		ports = append(ports, sp)
	}
	next := derive(d.state.Last(), gone, ports...)
	next.Node, next.ServiceCIDRs = final.Node, final.ServiceCIDRs
	apply(t, d, next, false)
	apply(t, d, next, false)
	ts := nftrace.New()
	if err := ts.Load(k.fake.Dump()); err != nil {
		t.Fatal(err)
	}
	tracecases.Run(t, tracecases.NFTables, tracer(ts))
}
