package iptables

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/internal/netnstest"
	"kube-proxy/rules/iptables/iptrace"
)

// gen turns fuzz input into decisions; it yields zeros once the input is used up.
type gen struct {
	b []byte
	i int
}

func (g *gen) n(max int) int {
	if g.i >= len(g.b) || max <= 1 {
		g.i++
		return 0
	}
	v := int(g.b[g.i]) % max
	g.i++
	return v
}

func (g *gen) bit() bool { return g.n(2) == 1 }

func (g *gen) addr(ipv6 bool, net byte, host int) netip.Addr {
	if ipv6 {
		return netip.AddrFrom16([16]byte{0xfd, 0, 0, net, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(host >> 8), byte(host)})
	}
	return netip.AddrFrom4([4]byte{10, net, byte(host >> 8), byte(host)})
}

func (g *gen) config(ipv6 bool) Config {
	family, podCIDR := v4, netip.PrefixFrom(g.addr(false, 244, 0), 16)
	if ipv6 {
		family, podCIDR = v6, netip.PrefixFrom(g.addr(true, 244, 0), 48)
	}
	cfg := testConfig(family, proxy.LocalDetector{})
	cfg.MasqueradeAll, cfg.LocalhostNodePorts, cfg.TCPBeLiberal = g.bit(), g.bit(), g.bit()
	switch g.n(5) {
	case 1:
		cfg.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeClusterCIDR, CIDR: podCIDR}
	case 2:
		cfg.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeNodeCIDR}
	case 3:
		cfg.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeBridgeInterface, Interface: "cbr0"}
	case 4:
		cfg.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeInterfaceNamePrefix, Interface: "veth"}
	}
	switch g.n(5) {
	case 1:
		cfg.NodePortAddresses = npAddrs(family, "10.0.0.0/8", "127.0.0.0/8", "fd00::/8", "::1/128")
	case 2:
		cfg.NodePortAddresses = npAddrs(family, "primary")
	case 3:
		cfg.NodePortAddresses = npAddrs(family, "0.0.0.0/1", "::/1")
	case 4:
		cfg.NodePortAddresses = npAddrs(family, "192.168.0.0/16")
	}
	return cfg
}

var fuzzNames = []string{"a", "b", "c", "d"}
var fuzzProtocols = []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}

// servicePort generates one Service port with endpoints; the proxy package's invariants are kept
// (externalTrafficPolicy Local and health check ports only on externally accessible ports).
func (g *gen) servicePort(ipv6 bool, i int) *proxy.ServicePort {
	name := fuzzNames[g.n(len(fuzzNames))]
	portName := []string{"", "http", "dns"}[g.n(3)]
	proto := fuzzProtocols[g.n(3)]
	sp := port("ns/"+name, portName, proto, g.addr(ipv6, 96, i+1).String(), int32(1+g.n(65535)))
	if g.bit() {
		sp.NodePort = int32(30000 + g.n(2768))
	}
	for range g.n(3) {
		sp.ExternalIPs = append(sp.ExternalIPs, g.addr(ipv6, 192, g.n(256)))
	}
	for range g.n(3) {
		sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, g.addr(ipv6, 203, g.n(256)))
	}
	for range g.n(3) {
		if g.bit() {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.PrefixFrom(g.addr(ipv6, 0, 0), 24+g.n(8)))
		} else {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.PrefixFrom(g.addr(ipv6, 51, 0), 16).Masked())
		}
	}
	if g.bit() {
		sp.StickyMaxAgeSeconds = int32(1 + g.n(86400))
	}
	sp.InternalPolicyLocal = g.bit()
	if sp.ExternallyAccessible() && g.bit() {
		sp.ExternalPolicyLocal = true
		if len(sp.LoadBalancerIPs) > 0 {
			sp.HealthCheckNodePort = int32(31000 + g.n(1000))
		}
	}
	n := g.n(6)
	if g.n(64) == 63 {
		n = 1001 // large cluster mode
	}
	for j := range n {
		e := proxy.NewEndpoint(g.addr(ipv6, 244, j+1), int32(1+g.n(65535)))
		flags := g.n(16)
		e.Ready, e.Serving, e.Terminating, e.IsLocal = flags&1 == 0, flags&2 == 0, flags&4 != 0, flags&8 != 0
		if e.IsLocal {
			e.NodeName = testNode
		}
		sp.Endpoints = append(sp.Endpoints, e)
	}
	sortEndpoints(sp.Endpoints)
	return sp
}

func sortEndpoints(eps []proxy.Endpoint) {
	// Same address twice collapses, as the proxy package does; then sort by Addr.
	seen := map[string]bool{}
	out := eps[:0]
	for _, e := range eps {
		if !seen[e.Addr] {
			seen[e.Addr] = true
			out = append(out, e)
		}
	}
	eps = out
	for i := 1; i < len(eps); i++ {
		for j := i; j > 0 && eps[j].Addr < eps[j-1].Addr; j-- {
			eps[j], eps[j-1] = eps[j-1], eps[j]
		}
	}
}

// snapshots generates a configuration and two successive snapshots.
func (g *gen) snapshots() (cfg Config, prev, snap *proxy.Snapshot) {
	ipv6 := g.bit()
	cfg = g.config(ipv6)
	node := proxy.Node{Name: testNode, Known: true}
	if g.n(4) != 0 {
		node.IPs = []netip.Addr{g.addr(ipv6, 0, 1)}
	}
	if g.bit() {
		node.PodCIDRs = []netip.Prefix{netip.PrefixFrom(g.addr(ipv6, 244, 0), 24)}
	}
	family := v4
	if ipv6 {
		family = v6
	}
	var ports []*proxy.ServicePort
	for i := range g.n(7) {
		ports = append(ports, g.servicePort(ipv6, i))
	}
	prev = snapshot(family, node, ports...)

	var changed []*proxy.ServicePort
	var removed []proxy.ServicePortName
	for i, sp := range prev.Sorted() {
		switch g.n(4) {
		case 1:
			removed = append(removed, sp.Name)
		case 2:
			// Same port, new endpoints.
			np := g.servicePort(ipv6, i)
			cp := *sp
			cp.Endpoints = np.Endpoints
			changed = append(changed, &cp)
		}
	}
	for i := range g.n(3) {
		changed = append(changed, g.servicePort(ipv6, 10+i))
	}
	snap = derive(prev, removed, changed...)
	if g.n(8) == 7 {
		snap.Node.PodCIDRs = nil // node facts change: the partial render must rewrite everything
	}
	return cfg, prev, snap
}

func totalEndpoints(s *proxy.Snapshot) int {
	n := 0
	for _, sp := range s.Services {
		n += len(sp.Endpoints)
	}
	return n
}

// kernelBudget bounds how many fuzz inputs are also checked in a real kernel per test process.
var kernelBudget = struct {
	sync.Mutex
	left int
}{left: 40}

func takeKernelBudget() bool {
	kernelBudget.Lock()
	defer kernelBudget.Unlock()
	if kernelBudget.left == 0 {
		return false
	}
	kernelBudget.left--
	return true
}

func FuzzRender(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("kube-proxy iptables renderer seed"))
	f.Add(bytes.Repeat([]byte{1, 3, 5, 7, 11, 13}, 40))
	f.Add(bytes.Repeat([]byte{0xff, 0x80, 0x41, 0x02}, 60))
	f.Add([]byte{1, 1, 1, 1, 1, 1, 1, 6, 3, 1, 2, 200, 1, 1, 2, 2, 2, 1, 1, 1, 5, 5, 9, 9, 9, 9, 9, 9})
	f.Fuzz(checkRender)
}

// TestRenderRandom runs the fuzz checks over pseudo-random inputs in every test run (the first ones also
// against the kernel when KP_E2E is set).
func TestRenderRandom(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		data := make([]byte, 64+rnd.IntN(512))
		for j := range data {
			data[j] = byte(rnd.Uint32())
		}
		t.Run(strconv.Itoa(i), func(t *testing.T) { checkRender(t, data) })
	}
}

// checkRender is the body of FuzzRender: render a generated snapshot fully, then its successor partially
// and fully, and check that the payloads load and agree.
func checkRender(t *testing.T, data []byte) {
	{
		g := &gen{b: data}
		cfg, prev, snap := g.snapshots()
		ipv6 := cfg.Family == v6

		// A long-lived renderer: full render of prev, then a partial render of snap.
		r := NewRenderer(cfg)
		resPrev, err := r.Render(prev, nil, true, nil)
		if err != nil {
			t.Fatalf("full render of prev: %v", err)
		}
		prevPayload := bytes.Clone(resPrev.Payload)
		fake := iptrace.New(ipv6)
		if err := fake.Restore(prevPayload, iptrace.RestoreOptions{NoFlush: true}); err != nil {
			t.Fatalf("full payload of prev does not load: %v\n%s", err, prevPayload)
		}
		resPartial, err := r.Render(snap, prev, false, nil)
		if err != nil {
			t.Fatalf("partial render: %v", err)
		}
		partialPayload := bytes.Clone(resPartial.Payload)
		if err := fake.Restore(partialPayload, iptrace.RestoreOptions{NoFlush: true}); err != nil {
			t.Fatalf("partial payload does not load: %v\n%s", err, partialPayload)
		}

		// A full render of snap by the long-lived renderer equals a fresh renderer's.
		resFull, err := r.Render(snap, prev, true, nil)
		if err != nil {
			t.Fatalf("full render of snap: %v", err)
		}
		fullPayload := bytes.Clone(resFull.Payload)
		fresh, err := NewRenderer(cfg).Render(snap, nil, true, nil)
		if err != nil {
			t.Fatalf("fresh full render: %v", err)
		}
		if diff := cmp.Diff(string(fresh.Payload), string(fullPayload)); diff != "" {
			t.Fatalf("cached and fresh full renders differ (-fresh +cached):\n%s", diff)
		}

		// Partial on top of prev gives the same tables as a full render of snap (unless the comment
		// style flipped between them, which upstream does not rewrite either).
		if (totalEndpoints(prev) > largeClusterEndpoints) == (totalEndpoints(snap) > largeClusterEndpoints) {
			want := iptrace.New(ipv6)
			if err := want.Restore(fullPayload, iptrace.RestoreOptions{NoFlush: true}); err != nil {
				t.Fatalf("full payload does not load: %v", err)
			}
			if diff := cmp.Diff(want.SaveAll(), fake.SaveAll()); diff != "" {
				t.Fatalf("partial render left other tables than a full one (-full +partial):\n%s\npartial payload:\n%s", diff, partialPayload)
			}
		}
		if fmt.Sprint(resPartial.Chains) != fmt.Sprint(resFull.Chains) {
			t.Errorf("Chains after partial %v, after full %v", resPartial.Chains, resFull.Chains)
		}

		if !netnstest.Enabled() || !takeKernelBudget() {
			return
		}
		ns := kernelNS(t, "nft", ipv6, nil)
		if err := ns.Restore("nft", ipv6, fullPayload, "--noflush", "--test"); err != nil {
			t.Fatalf("iptables-restore --test refuses the full payload: %v\n%s", err, fullPayload)
		}
		// Apply prev and the partial payload for real and compare with the fake.
		if err := ns.Restore("nft", ipv6, prevPayload, "--noflush"); err != nil {
			t.Fatalf("kernel refuses prev's payload: %v", err)
		}
		if err := ns.Restore("nft", ipv6, partialPayload, "--noflush"); err != nil {
			t.Fatalf("kernel refuses the partial payload: %v\n%s", err, partialPayload)
		}
		for _, table := range []string{"filter", "nat"} {
			real, err := ns.Save("nft", ipv6, table)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(real, fake.Save(table)); diff != "" {
				t.Fatalf("table %s (-kernel +iptrace):\n%s", table, diff)
			}
		}
	}
}
