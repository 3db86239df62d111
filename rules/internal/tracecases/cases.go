// Package tracecases is the table of truth every dataplane's packet tracer is checked against: one
// snapshot with a Service of each kind, packets from each kind of source, and what must happen to them
// (the endpoints reached, masquerading, or a drop or reject). Each dataplane's tests render the snapshot,
// load the result into its tracer and run the table through an adapter; where a mode behaves
// differently by design (as upstream's modes do), the case says so for that mode.
package tracecases

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
)

// Mode names a dataplane whose expectations may differ.
type Mode string

// The modes with tracers.
const (
	IPTables Mode = "iptables"
	NFTables Mode = "nftables"
	IPVS     Mode = "ipvs"
)

// NodeIP is the node's address, ClusterCIDR the cluster's pod CIDR (the local-traffic detector of the
// configuration the table assumes), LocalEP and RemoteEP the two endpoints of most Services.
const (
	NodeIP      = "10.0.0.1"
	ClusterCIDR = "10.244.0.0/16"
	LocalEP     = "10.244.1.5:8080"
	RemoteEP    = "10.244.2.6:8080"
)

// ServiceCIDR is the cluster's ServiceCIDR: inside it, addresses no Service has are unallocated.
var ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")

// Source is where a packet comes from.
type Source struct {
	Name string
	Src  netip.Addr
	// In is the interface it arrives on; "" for a packet of the node itself.
	In string
	// StickyTo is the endpoint ("ip:port") this client has session affinity with, if any.
	StickyTo string
}

// The sources of the table.
var (
	FromPod       = Source{Name: "local pod", Src: netip.MustParseAddr("10.244.1.7"), In: "veth7"}
	FromOtherNode = Source{Name: "other node", Src: netip.MustParseAddr("192.168.0.2"), In: "eth0"}
	FromOutside   = Source{Name: "outside client", Src: netip.MustParseAddr("198.51.100.9"), In: "eth0"}
	FromNode      = Source{Name: "node itself", Src: netip.MustParseAddr(NodeIP)}
	FromLocalhost = Source{Name: "localhost", Src: netip.MustParseAddr("127.0.0.1")}
)

// Packet is the first packet of a connection, as a tracer walks it.
type Packet struct {
	From     Source
	Dst      netip.AddrPort
	Protocol string // "tcp", "udp" or "sctp"
	// LocalAddrs are the node's addresses.
	LocalAddrs []netip.Addr
}

// Outcome is what happened to a packet: the endpoints it can reach (sorted), whether it is masqueraded,
// and its verdicts (sorted, each once).
type Outcome struct {
	Endpoints []string
	Masq      bool
	Verdicts  []string
}

// Reach is an accepted packet DNATed to one of endpoints.
func Reach(masq bool, endpoints ...string) Outcome {
	return Outcome{Endpoints: endpoints, Masq: masq, Verdicts: []string{"ACCEPT"}}
}

// The outcomes without DNAT.
var (
	Dropped   = Outcome{Verdicts: []string{"DROP"}}
	Rejected  = Outcome{Verdicts: []string{"REJECT"}}
	Untouched = Outcome{Verdicts: []string{"ACCEPT"}}
)

// Case is one packet and what must happen to it.
type Case struct {
	Dst   string // "ip:port"
	Proto string
	From  Source
	Want  Outcome
	// Differ holds what a mode does instead, where it differs by design, and why.
	Differ map[Mode]Difference
}

// Difference is a mode's own outcome for a case.
type Difference struct {
	Want Outcome
	Why  string
}

// Snapshot returns the table's snapshot: the node, its ServiceCIDR and a Service of each kind.
func Snapshot() *proxy.Snapshot {
	both := proxytest.Endpoints(LocalEP+",local", RemoteEP)
	remoteOnly := proxytest.Endpoints(RemoteEP)
	port := proxytest.Port
	s := proxytest.Snapshot(v1.IPv4Protocol, proxytest.Node(NodeIP),
		port("t/cluster", "", v1.ProtocolTCP, "10.96.1.1", 80, both),
		port("t/nodeport", "", v1.ProtocolTCP, "10.96.1.2", 80, proxytest.NodePort(30002), both),
		port("t/local", "", v1.ProtocolTCP, "10.96.1.3", 80, proxytest.NodePort(30003), proxytest.LoadBalancerIPs("203.0.113.3"),
			proxytest.ExternalIPs("192.0.2.3"), proxytest.ExternalLocal(31003), both),
		port("t/local-none", "", v1.ProtocolTCP, "10.96.1.4", 80, proxytest.NodePort(30004), proxytest.LoadBalancerIPs("203.0.113.4"),
			proxytest.ExternalLocal(31004), remoteOnly),
		port("t/itp", "", v1.ProtocolUDP, "10.96.1.5", 53, proxytest.InternalLocal, proxytest.Endpoints("10.244.1.5:53,local", "10.244.2.6:53")),
		port("t/itp-none", "", v1.ProtocolUDP, "10.96.1.6", 53, proxytest.InternalLocal, proxytest.Endpoints("10.244.2.6:53")),
		port("t/fw", "", v1.ProtocolTCP, "10.96.1.7", 80, proxytest.NodePort(30007), proxytest.LoadBalancerIPs("203.0.113.7"),
			proxytest.SourceRanges("198.51.100.0/24"), remoteOnly),
		port("t/empty", "", v1.ProtocolTCP, "10.96.1.8", 80, proxytest.NodePort(30008), proxytest.ExternalIPs("192.0.2.8")),
		port("t/external", "", v1.ProtocolSCTP, "10.96.1.9", 80, proxytest.ExternalIPs("192.0.2.9"), both),
		port("t/sticky", "", v1.ProtocolTCP, "10.96.1.10", 80, proxytest.Affinity(60), both),
	)
	s.ServiceCIDRs = []netip.Prefix{ServiceCIDR}
	return s
}

// StickyService is the Service port with session affinity.
var StickyService = proxytest.Port("t/sticky", "", v1.ProtocolTCP, "10.96.1.10", 80).Name

const (
	whyUnknownPort = "upstream's nftables mode rejects traffic to ports a cluster IP does not serve (cluster-ips-check)"
	whyUnallocated = "upstream's nftables mode drops traffic to unallocated addresses of the ServiceCIDRs (cluster-ips-check)"
	whyLocalhost   = "nftables cannot DNAT packets to 127.0.0.1: upstream's nftables mode serves no NodePort on localhost"

	whyIPVSFilter     = "IPVS mode (as upstream's) rejects new connections to ports a Service address does not serve (KUBE-IPVS-FILTER): the address is local, on kube-ipvs0"
	whyIPVSLocalhost  = "IPVS mode (as upstream's) serves no NodePort on 127.0.0.1: IPVS cannot return a pod's reply to a loopback source"
	whyIPVSLocalOnly  = "IPVS mode (as upstream's) sends a Local-policy external address to local endpoints only, from the node and its pods too, and the node's own source address needs no masquerading"
	whyIPVSNoLocalSrc = "IPVS mode (as upstream's) does not masquerade Local-policy NodePort traffic; the node's own source address needs none"
	whyIPVSUnreach    = "in IPVS mode the node's own traffic to a virtual server without real servers gets IPVS's ICMP port unreachable; the DROP (KUBE-PROXY-FIREWALL, in INPUT and FORWARD) sees only arriving traffic"
)

// Cases returns the table: ClusterIP, NodePort, externalIP and load balancer addresses × traffic
// policies × sources.
func Cases() []Case {
	nft := func(want Outcome, why string) map[Mode]Difference {
		return map[Mode]Difference{NFTables: {Want: want, Why: why}}
	}
	ipvs := func(want Outcome, why string) map[Mode]Difference {
		return map[Mode]Difference{IPVS: {Want: want, Why: why}}
	}
	both := func(a, b map[Mode]Difference) map[Mode]Difference {
		out := map[Mode]Difference{}
		for _, m := range []map[Mode]Difference{a, b} {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	return []Case{
		// ClusterIP: spread over all endpoints; masqueraded unless from a local pod.
		{Dst: "10.96.1.1:80", Proto: "tcp", From: FromPod, Want: Reach(false, LocalEP, RemoteEP)},
		{Dst: "10.96.1.1:80", Proto: "tcp", From: FromOtherNode, Want: Reach(true, LocalEP, RemoteEP)},
		{Dst: "10.96.1.1:80", Proto: "tcp", From: FromNode, Want: Reach(true, LocalEP, RemoteEP)},
		{Dst: "10.96.1.1:81", Proto: "tcp", From: FromPod, Want: Untouched, Differ: both(nft(Rejected, whyUnknownPort), ipvs(Rejected, whyIPVSFilter))},
		{Dst: "10.96.1.1:80", Proto: "udp", From: FromPod, Want: Untouched, Differ: both(nft(Rejected, whyUnknownPort), ipvs(Rejected, whyIPVSFilter))},
		{Dst: "10.96.200.1:80", Proto: "tcp", From: FromPod, Want: Untouched, Differ: nft(Dropped, whyUnallocated)},
		// NodePort with Cluster policy: always masqueraded, on the node IP (and on localhost in mode iptables).
		{Dst: NodeIP + ":30002", Proto: "tcp", From: FromOtherNode, Want: Reach(true, LocalEP, RemoteEP)},
		{Dst: NodeIP + ":30002", Proto: "tcp", From: FromPod, Want: Reach(true, LocalEP, RemoteEP)},
		{Dst: NodeIP + ":30002", Proto: "tcp", From: FromNode, Want: Reach(true, LocalEP, RemoteEP)},
		{Dst: "127.0.0.1:30002", Proto: "tcp", From: FromLocalhost, Want: Reach(true, LocalEP, RemoteEP),
			Differ: both(nft(Untouched, whyLocalhost), ipvs(Untouched, whyIPVSLocalhost))},
		{Dst: "10.0.0.9:30002", Proto: "tcp", From: FromOtherNode, Want: Untouched}, // not a local address
		// externalTrafficPolicy Local: outside traffic keeps its source and stays on this node; pods and the
		// node itself are short-circuited to all endpoints.
		{Dst: NodeIP + ":30003", Proto: "tcp", From: FromOtherNode, Want: Reach(false, LocalEP)},
		{Dst: "203.0.113.3:80", Proto: "tcp", From: FromOutside, Want: Reach(false, LocalEP)},
		{Dst: "192.0.2.3:80", Proto: "tcp", From: FromOutside, Want: Reach(false, LocalEP)},
		{Dst: "203.0.113.3:80", Proto: "tcp", From: FromPod, Want: Reach(false, LocalEP, RemoteEP), Differ: ipvs(Reach(false, LocalEP), whyIPVSLocalOnly)},
		{Dst: NodeIP + ":30003", Proto: "tcp", From: FromNode, Want: Reach(true, LocalEP, RemoteEP), Differ: ipvs(Reach(false, LocalEP), whyIPVSLocalOnly)},
		{Dst: "127.0.0.1:30003", Proto: "tcp", From: FromLocalhost, Want: Reach(true, LocalEP, RemoteEP),
			Differ: both(nft(Untouched, whyLocalhost), ipvs(Untouched, whyIPVSLocalhost))},
		{Dst: "10.96.1.3:80", Proto: "tcp", From: FromOtherNode, Want: Reach(true, LocalEP, RemoteEP)},
		// ... without local endpoints: outside traffic is dropped, short-circuited traffic still works.
		{Dst: NodeIP + ":30004", Proto: "tcp", From: FromOtherNode, Want: Dropped},
		{Dst: "203.0.113.4:80", Proto: "tcp", From: FromOutside, Want: Dropped},
		{Dst: "203.0.113.4:80", Proto: "tcp", From: FromPod, Want: Reach(false, RemoteEP)},
		{Dst: NodeIP + ":30004", Proto: "tcp", From: FromNode, Want: Reach(true, RemoteEP), Differ: ipvs(Reach(false, RemoteEP), whyIPVSNoLocalSrc)},
		{Dst: "10.96.1.4:80", Proto: "tcp", From: FromPod, Want: Reach(false, RemoteEP)},
		// internalTrafficPolicy Local.
		{Dst: "10.96.1.5:53", Proto: "udp", From: FromPod, Want: Reach(false, "10.244.1.5:53")},
		{Dst: "10.96.1.5:53", Proto: "udp", From: FromOtherNode, Want: Reach(true, "10.244.1.5:53")},
		{Dst: "10.96.1.6:53", Proto: "udp", From: FromPod, Want: Dropped},
		{Dst: "10.96.1.6:53", Proto: "udp", From: FromNode, Want: Dropped, Differ: ipvs(Rejected, whyIPVSUnreach)},
		// loadBalancerSourceRanges: only listed sources reach the LB IP; NodePorts are not filtered.
		{Dst: "203.0.113.7:80", Proto: "tcp", From: FromOutside, Want: Reach(true, RemoteEP)},
		{Dst: "203.0.113.7:80", Proto: "tcp", From: FromOtherNode, Want: Dropped},
		{Dst: "203.0.113.7:80", Proto: "tcp", From: FromNode, Want: Dropped},
		{Dst: NodeIP + ":30007", Proto: "tcp", From: FromOtherNode, Want: Reach(true, RemoteEP)},
		// No endpoints: rejected everywhere.
		{Dst: "10.96.1.8:80", Proto: "tcp", From: FromPod, Want: Rejected},
		{Dst: "10.96.1.8:80", Proto: "tcp", From: FromNode, Want: Rejected},
		{Dst: NodeIP + ":30008", Proto: "tcp", From: FromOtherNode, Want: Rejected},
		{Dst: "192.0.2.8:80", Proto: "tcp", From: FromOutside, Want: Rejected},
		// externalIPs with Cluster policy (SCTP): masqueraded, all endpoints.
		{Dst: "192.0.2.9:80", Proto: "sctp", From: FromOutside, Want: Reach(true, LocalEP, RemoteEP)},
		{Dst: "192.0.2.9:80", Proto: "sctp", From: FromPod, Want: Reach(true, LocalEP, RemoteEP)},
		// Session affinity: a known client sticks to its endpoint.
		{Dst: "10.96.1.10:80", Proto: "tcp", From: FromPod, Want: Reach(false, LocalEP, RemoteEP)},
		{Dst: "10.96.1.10:80", Proto: "tcp", From: Source{Name: "sticky pod", Src: FromPod.Src, In: FromPod.In, StickyTo: RemoteEP}, Want: Reach(false, RemoteEP)},
		// Hairpin: a pod reaching itself through its Service is masqueraded, so that the reply comes back
		// through the node.
		{Dst: "10.96.1.5:53", Proto: "udp", From: Source{Name: "the endpoint itself", Src: netip.MustParseAddr("10.244.1.5"), In: "veth5"},
			Want: Reach(true, "10.244.1.5:53")},
	}
}

// Tracer traces one packet through a mode's rules.
type Tracer func(p Packet) (Outcome, string, error)

// Run checks every case against tr, for mode: the case's own outcome for the mode where it has one.
func Run(t *testing.T, mode Mode, tr Tracer) {
	t.Helper()
	local := []netip.Addr{netip.MustParseAddr(NodeIP)}
	for _, c := range Cases() {
		want := c.Want
		if d, ok := c.Differ[mode]; ok {
			want = d.Want
		}
		name := fmt.Sprintf("%s->%s/%s", c.From.Name, c.Dst, c.Proto)
		t.Run(name, func(t *testing.T) {
			got, trace, err := tr(Packet{From: c.From, Dst: netip.MustParseAddrPort(c.Dst), Protocol: c.Proto, LocalAddrs: local})
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(got.Verdicts, "DROP") || slices.Contains(got.Verdicts, "REJECT") {
				got.Masq = false // a dropped packet reaches no POSTROUTING
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\ntrace:\n%s", diff, trace)
			}
		})
	}
}
