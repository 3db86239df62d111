package nftables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
)

// The builders of hand-made snapshots.
var (
	port         = proxytest.Port
	eps          = proxytest.Endpoints
	nodePort     = proxytest.NodePort
	externalIPs  = proxytest.ExternalIPs
	lbIPs        = proxytest.LoadBalancerIPs
	sourceRanges = proxytest.SourceRanges
	affinity     = proxytest.Affinity
	etpLocal     = proxytest.ExternalLocal
	itpLocal     = proxytest.InternalLocal
	snapshot     = proxytest.Snapshot
	derive       = proxytest.Derive
	node         = proxytest.Node
)

const (
	v4 = v1.IPv4Protocol
	v6 = v1.IPv6Protocol
)

// spn names a Service port "ns/name".
func spn(nsName, portName string, proto v1.Protocol) proxy.ServicePortName {
	ns, name, _ := strings.Cut(nsName, "/")
	return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: portName, Protocol: proto}
}

func prefixes(list ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range list {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// testConfig is the configuration of family with the default masquerade bit and the cluster CIDR as local
// detector; NodePorts answer on every local address.
func testConfig(family v1.IPFamily, clusterCIDR string) Config {
	d := proxy.LocalDetector{Mode: config.LocalModeClusterCIDR}
	if clusterCIDR != "" {
		d.CIDR = netip.MustParsePrefix(clusterCIDR)
	}
	return Config{Settings: proxy.Settings{Family: family, MasqueradeBit: config.DefaultMasqueradeBit, LocalDetector: d}}
}

// fakeKernel is knftables' Fake behind the kernel interface, with a switch to make Run fail.
type fakeKernel struct {
	*knftKernel
	fake *knftables.Fake
	fail func(t *tx) error
	runs int
}

func newFakeKernel(family v1.IPFamily) *fakeKernel {
	f := familyOf(family)
	kf := knftables.IPv4Family
	if family == v6 {
		kf = knftables.IPv6Family
	}
	fake := knftables.NewFake(kf, TableName)
	return &fakeKernel{knftKernel: &knftKernel{nft: fake, fam: f}, fake: fake}
}

func (k *fakeKernel) Run(ctx context.Context, t *tx) error {
	k.runs++
	if k.fail != nil {
		if err := k.fail(t); err != nil {
			return err
		}
	}
	return k.knftKernel.Run(ctx, t)
}

// testDataplane returns a dataplane on a fake kernel, whose node addresses are addrs and whose clock
// advances a minute per call.
func testDataplane(cfg Config, addrs ...string) (*Dataplane, *fakeKernel) {
	k := newFakeKernel(cfg.Family)
	d := newDataplane(cfg, k, nil, NewMetrics(nil, false))
	var local []netip.Addr
	for _, a := range addrs {
		local = append(local, netip.MustParseAddr(a))
	}
	d.localAddrs = func() ([]netip.Addr, error) { return local, nil }
	clock := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	d.now = func() time.Time { clock = clock.Add(time.Minute); return clock }
	return d, k
}

func apply(t *testing.T, d *Dataplane, snap *proxy.Snapshot, full bool) {
	t.Helper()
	if err := d.Apply(context.Background(), snap, full); err != nil {
		t.Fatalf("Apply(generation %d, full=%v): %v", snap.Generation, full, err)
	}
}

// rebuilt returns the fake kernel's dump after a fresh dataplane with cfg applied snap to an empty table.
func rebuilt(t *testing.T, cfg Config, snap *proxy.Snapshot, addrs ...string) string {
	t.Helper()
	d, k := testDataplane(cfg, addrs...)
	apply(t, d, snap, true)
	return dump(k)
}

// dump returns the fake kernel's table with elements sorted (the kernel keeps no element order; rules
// keep theirs, and the Fake lists chains and sets by name).
func dump(k *fakeKernel) string {
	var lines, elems []string
	for _, l := range strings.Split(k.fake.Dump(), "\n") {
		if strings.HasPrefix(l, "add element ") {
			elems = append(elems, l)
		} else if l != "" {
			lines = append(lines, l)
		}
	}
	slices.Sort(elems)
	return strings.Join(append(lines, elems...), "\n") + "\n"
}

// richSnapshot has a Service of every shape the renderer writes.
func richSnapshot(family v1.IPFamily) *proxy.Snapshot {
	if family == v6 {
		s := snapshot(v6, node("fd00::1", "fd00:10:244:1::/64"),
			port("ns/web", "http", v1.ProtocolTCP, "fd00:96::10", 80, nodePort(30080), eps("[fd00:10:244:1::5]:8080,local", "[fd00:10:244:2::6]:8080")),
			port("ns/one", "", v1.ProtocolSCTP, "fd00:96::11", 80, eps("[fd00:10:244:2::6]:8080")),
			port("ns/sticky", "", v1.ProtocolTCP, "fd00:96::30", 80, affinity(600), eps("[fd00:10:244:1::5]:8080,local", "[fd00:10:244:3::7]:8080")),
			port("ns/lb", "", v1.ProtocolTCP, "fd00:96::40", 443, nodePort(30443), lbIPs("2001:db8::40"),
				sourceRanges("2001:db8:1::/48", "fd00::/64", "8000::/1"), etpLocal(31443), eps("[fd00:10:244:1::40]:443,local")),
			port("ns/empty", "", v1.ProtocolUDP, "fd00:96::20", 53, nodePort(30053), externalIPs("2001:db8::20")),
			port("ns/itp", "", v1.ProtocolUDP, "fd00:96::50", 53, itpLocal, eps("[fd00:10:244:2::50]:53")),
		)
		s.ServiceCIDRs = prefixes("fd00:96::/112", "fd00:97::/112")
		return s
	}
	s := snapshot(v4, node("10.0.0.1", "10.244.1.0/24"),
		port("ns/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, nodePort(30080), eps("10.244.1.5:8080,local", "10.244.2.6:8080", "10.244.3.6:8080")),
		port("ns/one", "", v1.ProtocolSCTP, "10.96.0.11", 80, eps("10.244.2.6:8080")),
		port("ns/sticky", "", v1.ProtocolTCP, "10.96.0.30", 80, affinity(600), eps("10.244.1.5:8080,local", "10.244.3.7:8080")),
		port("ns/lb", "", v1.ProtocolTCP, "10.96.0.40", 443, nodePort(30443), lbIPs("203.0.113.40"),
			sourceRanges("198.51.100.0/24", "10.0.0.0/9", "128.0.0.0/1", "10.1.0.0/16"), etpLocal(31443), eps("10.244.1.40:443,local")),
		port("ns/empty", "", v1.ProtocolUDP, "10.96.0.20", 53, nodePort(30053), externalIPs("192.0.2.20")),
		port("ns/itp", "", v1.ProtocolUDP, "10.96.0.50", 53, itpLocal, eps("10.244.2.50:53")),
		port("ns/fw1", "", v1.ProtocolTCP, "10.96.0.60", 80, lbIPs("203.0.113.60"), sourceRanges("0.0.0.0/8"), eps("10.244.2.60:80")),
	)
	s.ServiceCIDRs = prefixes("10.96.0.0/16", "10.97.0.0/16")
	return s
}
