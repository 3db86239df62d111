package conntrack

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-proxy/proxy"
	"kube-proxy/rules/internal/metricstest"
)

// fakeTable simulates the kernel's conntrack table of one family: deleting with a filter removes the
// entries it matches and returns how many; interrupt makes the dump stop after the first entry, as the
// kernel may, after deleting what it saw.
type fakeTable struct {
	family    netlink.InetFamily
	flows     []*netlink.ConntrackFlow
	interrupt bool
}

func (f *fakeTable) delete(family netlink.InetFamily, filter netlink.CustomConntrackFilter) (uint, error) {
	if family != f.family {
		return 0, nil
	}
	var n uint
	seen := len(f.flows)
	if f.interrupt && seen > 1 {
		seen = 1
	}
	kept := slices.Clone(f.flows[seen:])
	for _, fl := range f.flows[:seen] {
		if filter.MatchConntrackFlow(fl) {
			n++
			continue
		}
		kept = append(kept, fl)
	}
	f.flows = kept
	if f.interrupt {
		return n, netlink.ErrDumpInterrupted
	}
	return n, nil
}

// flow is a conntrack entry: proto from a client to dst, answered by replySrc (where DNAT sent it).
func flow(proto uint8, dst, replySrc string) *netlink.ConntrackFlow {
	d, r := netip.MustParseAddrPort(dst), netip.MustParseAddrPort(replySrc)
	f := &netlink.ConntrackFlow{}
	f.Forward.Protocol, f.Reverse.Protocol = proto, proto
	f.Forward.SrcIP, f.Forward.SrcPort = net.ParseIP("10.244.7.7"), 40000
	f.Forward.DstIP, f.Forward.DstPort = net.IP(d.Addr().AsSlice()), d.Port()
	f.Reverse.SrcIP, f.Reverse.SrcPort = net.IP(r.Addr().AsSlice()), r.Port()
	f.Reverse.DstIP, f.Reverse.DstPort = f.Forward.SrcIP, f.Forward.SrcPort
	return f
}

// TestCleanerMetrics: every run of the reconciler is observed, as upstream observes each of its runs,
// also when the snapshot has no UDP Service and the table is not read; the deleted entries are counted.
func TestCleanerMetrics(t *testing.T) {
	name := func(n string, p v1.Protocol) proxy.ServicePortName {
		return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: n}, Protocol: p}
	}
	serving := proxy.NewEndpoint(netip.MustParseAddr("10.244.1.2"), 5353)
	serving.Ready, serving.Serving = true, true
	web := &proxy.ServicePort{Name: name("web", v1.ProtocolTCP), ClusterIP: netip.MustParseAddr("10.96.0.12"), Port: 80,
		Protocol: v1.ProtocolTCP, Endpoints: []proxy.Endpoint{serving}}
	dns := &proxy.ServicePort{Name: name("dns", v1.ProtocolUDP), ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 53,
		Protocol: v1.ProtocolUDP, Endpoints: []proxy.Endpoint{serving}}
	snap := func(sps ...*proxy.ServicePort) *proxy.Snapshot {
		s := &proxy.Snapshot{Family: v1.IPv4Protocol, Services: map[proxy.ServicePortName]*proxy.ServicePort{}}
		for _, sp := range sps {
			s.Services[sp.Name] = sp
		}
		return s
	}
	live := flow(protoUDP, "10.96.0.10:53", "10.244.1.2:5353")
	gone := flow(protoUDP, "10.96.0.10:53", "10.244.9.9:5353")
	tcp := flow(unix.IPPROTO_TCP, "10.96.0.12:80", "10.244.9.9:80")
	tests := []struct {
		name      string
		snap      *proxy.Snapshot
		flows     []*netlink.ConntrackFlow
		interrupt bool
		wantLeft  []*netlink.ConntrackFlow
		wantDel   float64
	}{
		{name: "no UDP Service: observed, table untouched", snap: snap(web), flows: []*netlink.ConntrackFlow{gone, tcp},
			wantLeft: []*netlink.ConntrackFlow{gone, tcp}},
		{name: "a flow to a gone endpoint deleted", snap: snap(web, dns), flows: []*netlink.ConntrackFlow{live, gone, tcp},
			wantLeft: []*netlink.ConntrackFlow{live, tcp}, wantDel: 1},
		{name: "an interrupted dump counts what it deleted", snap: snap(dns), flows: []*netlink.ConntrackFlow{gone, live},
			interrupt: true, wantLeft: []*netlink.ConntrackFlow{live}, wantDel: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			c := NewCleaner(v1.IPv4Protocol, NewMetrics(reg))
			table := &fakeTable{family: unix.AF_INET, flows: tt.flows, interrupt: tt.interrupt}
			c.deleteFlows = table.delete
			for run := 1; run <= 2; run++ {
				if err := c.Clean(tt.snap); err != nil {
					t.Fatalf("run %d: %v", run, err)
				}
				got := metricstest.Values(t, reg, "kubeproxy_conntrack_")
				want := map[string]float64{
					`kubeproxy_conntrack_reconciler_sync_duration_seconds{ip_family="IPv4"}`: float64(run),
					`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}`: tt.wantDel, // the second run finds nothing more
				}
				for k, v := range want {
					if g, ok := got[k]; !ok || g != v {
						t.Errorf("run %d: %s = %v (exported %v), want %v", run, k, g, ok, v)
					}
				}
			}
			if !slices.Equal(table.flows, tt.wantLeft) {
				t.Errorf("%d entries left, want %d", len(table.flows), len(tt.wantLeft))
			}
		})
	}
}
