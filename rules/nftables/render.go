package nftables

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
)

// Config is everything besides the snapshot and the node's addresses that shapes the table of one family.
type Config struct {
	proxy.Settings
	// LocalhostReject is the KubeProxyNFTablesLocalhostNodePorts feature gate: NodePorts on loopback
	// addresses are rejected and counted, but for TCP ones when LocalhostProxy is set.
	LocalhostReject bool
	// LocalhostProxy is set when the gate is on and nodePortAddresses lists a loopback CIDR of the family
	// (the "localhost" keyword, say), as upstream's alpha decides it: TCP NodePorts on 127.0.0.1 (::1)
	// are then served by the userspace proxy engine listening there, and not rejected.
	LocalhostProxy bool
}

// rejectedLocalhost returns the protocols whose loopback NodePorts the table rejects and counts.
func (c *Config) rejectedLocalhost() []v1.Protocol {
	switch {
	case !c.LocalhostReject:
		return nil
	case c.LocalhostProxy:
		return []v1.Protocol{v1.ProtocolUDP, v1.ProtocolSCTP}
	}
	return localhostProtocols
}

// inputs are the facts besides the Service ports that the table depends on, read for each sync.
type inputs struct {
	// local is the local-traffic detector resolved for the node.
	local proxy.LocalMatch
	// nodeIP is the node's primary IP (loadBalancerSourceRanges lets it through when a range holds it).
	nodeIP netip.Addr
	// nodePortAll is set when NodePorts answer on every local address; otherwise nodePortIPs lists the
	// local addresses they answer on.
	nodePortAll bool
	nodePortIPs []netip.Addr
	// serviceCIDRs are the ServiceCIDRs of the family: traffic to unallocated addresses inside them is
	// dropped.
	serviceCIDRs []netip.Prefix
}

// sameServiceInputs reports whether the per-Service chains rendered with in and o are the same: only the
// local-traffic detector and the node IP reach them.
func (in *inputs) sameServiceInputs(o *inputs) bool {
	return in.local == o.local && in.nodeIP == o.nodeIP
}

// renderer turns a configuration and node facts into the table's objects. It is a pure function of its
// arguments.
type renderer struct {
	cfg  Config
	fam  *family
	mark uint32
}

func newRenderer(cfg Config) *renderer {
	return &renderer{cfg: cfg, fam: familyOf(cfg.Family), mark: cfg.MasqueradeMark()}
}

// chainRules is a chain with its rules.
type chainRules struct {
	spec  chainSpec
	rules []ruleSpec
}

func (c *chainRules) equal(o *chainRules) bool {
	return c.spec == o.spec && slices.EqualFunc(c.rules, o.rules, func(a, b ruleSpec) bool { return a.equal(&b) })
}

// baseObjects are the table's objects besides the per-Service ones, in the order they are created.
type baseObjects struct {
	chains   []chainRules
	sets     []setSpec
	counters []string
	// nodePortIPs are the elements of the nodeport-ips set; the set exists only when nodePortSet is set.
	nodePortSet bool
	nodePortIPs []netip.Addr
	// localhostReject is set when the localhost NodePort reject map and its chains exist.
	localhostReject bool
}

// Names of the base chains, with their hooks and priorities: the contract other components integrate
// against (upstream's README for this mode).
var baseChains = []chainSpec{
	{name: chainFilterPreroutingPreDNAT, typ: "filter", hook: "prerouting", prio: -110},
	{name: chainFilterOutputPreDNAT, typ: "filter", hook: "output", prio: -110},
	{name: chainFilterInput, typ: "filter", hook: "input", prio: 0},
	{name: chainFilterForward, typ: "filter", hook: "forward", prio: 0},
	{name: chainFilterOutput, typ: "filter", hook: "output", prio: 0},
	{name: chainNATPrerouting, typ: "nat", hook: "prerouting", prio: -100},
	{name: chainNATOutput, typ: "nat", hook: "output", prio: -100},
	{name: chainNATPostrouting, typ: "nat", hook: "postrouting", prio: 100},
}

// jumps are the rules in the base chains, in upstream's order: to, from, and whether only new
// connections jump.
var jumps = []struct {
	to, from string
	ctNew    bool
}{
	{chainNodePortEndpointsCheck, chainFilterInput, true},
	{chainServiceEndpointsCheck, chainFilterInput, true},
	{chainServiceEndpointsCheck, chainFilterForward, true},
	{chainServiceEndpointsCheck, chainFilterOutput, true},
	{chainFirewallCheck, chainFilterPreroutingPreDNAT, true},
	{chainFirewallCheck, chainFilterOutputPreDNAT, true},
	{chainServices, chainNATOutput, false},
	{chainServices, chainNATPrerouting, false},
	{chainMasquerading, chainNATPostrouting, false},
	{chainClusterIPsCheck, chainFilterForward, true},
	{chainClusterIPsCheck, chainFilterOutput, true},
}

// localhostProtocols are the protocols whose loopback NodePorts are rejected with the gate on (all of
// them, unless the userspace proxy serves TCP ones: Config.rejectedLocalhost).
var localhostProtocols = []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}

// LocalhostRejectCounter names the counter of rejected loopback NodePort packets of a protocol (upstream's
// name, which its metric reads).
func LocalhostRejectCounter(p v1.Protocol) string {
	return "localhost-nodeport-rejected-" + strings.ToLower(string(p))
}

func localhostRejectChain(p v1.Protocol) string {
	return "localhost-nodeport-reject-" + strings.ToLower(string(p))
}

// base renders the table's objects besides the per-Service ones.
func (r *renderer) base(in *inputs) *baseObjects {
	f := r.fam
	b := &baseObjects{}
	chains := map[string]*chainRules{}
	add := func(c chainSpec) *chainRules {
		b.chains = append(b.chains, chainRules{spec: c})
		return &b.chains[len(b.chains)-1]
	}
	for _, c := range baseChains {
		add(c)
	}
	for _, name := range []string{chainNodePortEndpointsCheck, chainServiceEndpointsCheck, chainFirewallCheck,
		chainServices, chainMasquerading, chainClusterIPsCheck} {
		add(chainSpec{name: name})
	}
	add(chainSpec{name: chainReject, comment: "helper for @no-endpoint-services / @no-endpoint-nodeports"})
	if r.cfg.LocalhostReject {
		b.localhostReject = true
		for _, p := range r.cfg.rejectedLocalhost() {
			add(chainSpec{name: localhostRejectChain(p)})
			b.counters = append(b.counters, LocalhostRejectCounter(p))
		}
	}
	for i := range b.chains {
		chains[b.chains[i].spec.name] = &b.chains[i]
	}
	rule := func(chain string, comment string, terms ...term) {
		c := chains[chain]
		c.rules = append(c.rules, ruleSpec{terms: terms, comment: comment})
	}

	for _, j := range jumps {
		if j.ctNew {
			rule(j.from, "", ctStateNew(), jump(j.to))
		} else {
			rule(j.from, "", jump(j.to))
		}
	}
	rule(chainMasquerading, "", markNonZero(r.mark), markXor(r.mark), masquerade())
	rule(chainMasquerading, "", ctStatusDNAT(), hairpin(setHairpinConnections), masquerade())
	rule(chainClusterIPsCheck, "Reject traffic to invalid ports of ClusterIPs", addrInSet(false, setClusterIPs), reject())
	if len(in.serviceCIDRs) > 0 {
		rule(chainClusterIPsCheck, "Drop traffic to unallocated ClusterIPs", addrsIn(false, false, in.serviceCIDRs), drop())
	}
	rule(chainReject, "", reject())
	rule(chainServiceEndpointsCheck, "", vmapAddrProtoPort(mapNoEndpointServices))
	if in.nodePortAll {
		rule(chainNodePortEndpointsCheck, "", addrIs(false, true, f.loopback), vmapProtoPort(mapNoEndpointNodePorts))
	} else {
		rule(chainNodePortEndpointsCheck, "", addrInSet(false, setNodePortIPs), vmapProtoPort(mapNoEndpointNodePorts))
	}
	if b.localhostReject {
		for _, p := range r.cfg.rejectedLocalhost() {
			rule(localhostRejectChain(p), "", counter(LocalhostRejectCounter(p)), reject())
		}
		rule(chainNodePortEndpointsCheck, "", addrIs(false, false, f.loopback), vmapProtoPort(mapLocalhostNodePortReject))
	}
	rule(chainFirewallCheck, "", vmapAddrProtoPort(mapFirewallIPs))
	if r.cfg.MasqueradeAll {
		rule(chainServices, "masquerade all clusterIP traffic", addrInSet(false, setClusterIPs), markOr(r.mark))
	} else if in.local.Implemented() {
		rule(chainServices, "masquerade clusterIP traffic from outside cluster",
			addrInSet(false, setClusterIPs), r.ifLocal(in.local, true), markOr(r.mark))
	}
	rule(chainServices, "", vmapAddrProtoPort(mapServiceIPs))
	if in.nodePortAll {
		rule(chainServices, "", fibLocal(false), addrIs(false, true, f.loopback), vmapProtoPort(mapServiceNodePorts))
	} else {
		rule(chainServices, "", addrInSet(false, setNodePortIPs), vmapProtoPort(mapServiceNodePorts))
	}

	b.sets = []setSpec{
		{name: setHairpinConnections, key: layoutHairpin, comment: "service hairpin connections"},
		{name: setClusterIPs, key: layoutAddr, comment: "Active ClusterIPs"},
		{name: mapNoEndpointServices, key: layoutAddrProtoPort, isMap: true, comment: "vmap to drop or reject packets to services with no endpoints"},
		{name: mapNoEndpointNodePorts, key: layoutProtoPort, isMap: true, comment: "vmap to drop or reject packets to service nodeports with no endpoints"},
		{name: mapFirewallIPs, key: layoutAddrProtoPort, isMap: true, comment: "destinations that are subject to LoadBalancerSourceRanges"},
		{name: mapServiceIPs, key: layoutAddrProtoPort, isMap: true, comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
		{name: mapServiceNodePorts, key: layoutProtoPort, isMap: true, comment: "NodePort traffic"},
	}
	if !in.nodePortAll {
		b.nodePortSet = true
		b.sets = append(b.sets, setSpec{name: setNodePortIPs, key: layoutAddr, comment: "IPs that accept NodePort traffic"})
		for _, a := range in.nodePortIPs {
			if !a.IsLoopback() {
				b.nodePortIPs = append(b.nodePortIPs, a)
			}
		}
	}
	if b.localhostReject {
		b.sets = append(b.sets, setSpec{name: mapLocalhostNodePortReject, key: layoutProtoPort, isMap: true, comment: "localhost NodePorts rejected by kube-proxy"})
	}
	return b
}

// ifLocal returns the match for traffic from a local pod (or, with not, from anywhere else).
func (r *renderer) ifLocal(m proxy.LocalMatch, not bool) term {
	if m.CIDR.IsValid() {
		return addrIs(true, not, m.CIDR)
	}
	return iifname(not, m.Interface, m.Prefix)
}

// svcObjects are what one Service port adds to the table: its own chains and affinity sets, and the
// elements it puts in the shared sets and maps.
type svcObjects struct {
	chains []chainRules
	sets   []setSpec
	elems  []setElem
}

// setElem is one element of a shared set or map.
type setElem struct {
	set   string
	key   elemKey
	value elemValue
}

// service renders one Service port, following upstream's decisions for each traffic policy.
func (r *renderer) service(sp *proxy.ServicePort, in *inputs) *svcObjects {
	o := &svcObjects{}
	base := serviceBase(sp.Name)
	proto := protoNumbers[sp.Protocol]
	comment := truncComment(sp.Name.String())
	clusterChain, localChain := prefixService+base, prefixLocal+base
	externalChain, firewallChain := prefixExternal+base, prefixFirewall+base
	affinity := sp.SessionAffinity()

	hasEndpoints := sp.HasAnyEndpoints
	usesCluster := len(sp.ClusterEndpoints) > 0 && sp.UsesClusterEndpoints()
	usesLocal := len(sp.LocalEndpoints) > 0 && sp.UsesLocalEndpoints()
	internalChain, hasInternal := clusterChain, hasEndpoints
	if sp.InternalPolicyLocal {
		internalChain = localChain
		hasInternal = hasInternal && len(sp.LocalEndpoints) > 0
	}
	externalPolicyChain, hasExternal := clusterChain, hasEndpoints
	if sp.ExternalPolicyLocal {
		externalPolicyChain = localChain
		hasExternal = hasExternal && len(sp.LocalEndpoints) > 0
	}
	usesExternal := hasEndpoints && sp.ExternallyAccessible()
	usesFirewall := len(sp.LoadBalancerIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0

	// The verdicts for traffic that has nowhere to go: reject without any endpoint, drop when the
	// endpoints are all on other nodes and the policy is Local.
	noInternal, noExternal := verdict{kind: verdictGoto, chain: chainReject}, verdict{kind: verdictGoto, chain: chainReject}
	if hasEndpoints {
		noInternal, noExternal = verdict{kind: verdictDrop}, verdict{kind: verdictDrop}
	}

	elem := func(set string, k elemKey, v verdict, withComment bool) {
		e := setElem{set: set, key: k, value: elemValue{verdict: v}}
		if withComment {
			e.value.comment = comment
		}
		o.elems = append(o.elems, e)
	}
	addrKey := func(a netip.Addr) elemKey { return elemKey{addr: a, proto: proto, port: uint16(sp.Port)} }

	// Endpoint chains and affinity sets (affinity only), and the hairpin set for local endpoints.
	reachable := reachableEndpoints(sp)
	for _, ep := range reachable {
		if ep.IsLocal {
			o.elems = append(o.elems, setElem{set: setHairpinConnections,
				key: elemKey{addr: ep.IP, addr2: ep.IP, proto: proto, port: uint16(ep.Port)}})
		}
	}

	elem(setClusterIPs, elemKey{addr: sp.ClusterIP}, verdict{}, false)
	if hasInternal {
		elem(mapServiceIPs, addrKey(sp.ClusterIP), verdict{kind: verdictGoto, chain: internalChain}, false)
	} else {
		elem(mapNoEndpointServices, addrKey(sp.ClusterIP), noInternal, true)
	}
	for _, ip := range sp.ExternalIPs {
		if hasEndpoints {
			elem(mapServiceIPs, addrKey(ip), verdict{kind: verdictGoto, chain: externalChain}, false)
		}
		if !hasExternal {
			elem(mapNoEndpointServices, addrKey(ip), noExternal, true)
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		if hasEndpoints {
			elem(mapServiceIPs, addrKey(ip), verdict{kind: verdictGoto, chain: externalChain}, false)
		}
		if usesFirewall {
			elem(mapFirewallIPs, addrKey(ip), verdict{kind: verdictGoto, chain: firewallChain}, false)
		}
	}
	if !hasExternal {
		for _, ip := range sp.LoadBalancerIPs {
			elem(mapNoEndpointServices, addrKey(ip), noExternal, true)
		}
	}
	if sp.NodePort != 0 {
		npKey := elemKey{proto: proto, port: uint16(sp.NodePort)}
		if r.cfg.LocalhostReject && !(r.cfg.LocalhostProxy && sp.Protocol == v1.ProtocolTCP) {
			elem(mapLocalhostNodePortReject, npKey, verdict{kind: verdictGoto, chain: localhostRejectChain(sp.Protocol)}, false)
		}
		if hasEndpoints {
			elem(mapServiceNodePorts, npKey, verdict{kind: verdictGoto, chain: externalChain}, false)
		}
		if !hasExternal {
			elem(mapNoEndpointNodePorts, npKey, noExternal, true)
		}
	}

	// The chains, in upstream's order of creation. The capacity holds them all, so the pointers kept below
	// stay valid.
	o.chains = make([]chainRules, 0, len(reachable)+4)
	chain := func(name string) *chainRules {
		o.chains = append(o.chains, chainRules{spec: chainSpec{name: name}})
		return &o.chains[len(o.chains)-1]
	}
	var endpointChains []*chainRules
	if affinity {
		for _, ep := range reachable {
			endpointChains = append(endpointChains, chain(prefixEndpoint+endpointBase(sp.Name, ep.AddrPort())))
		}
	}
	var cluster, local, external, firewall *chainRules
	if usesCluster {
		cluster = chain(clusterChain)
	}
	if usesLocal {
		local = chain(localChain)
	}
	if usesExternal {
		external = chain(externalChain)
	}
	if usesFirewall {
		firewall = chain(firewallChain)
	}

	if external != nil {
		if !sp.ExternalPolicyLocal {
			external.rules = append(external.rules, ruleSpec{terms: []term{markOr(r.mark)}, comment: "masquerade"})
		} else {
			if in.local.Implemented() {
				external.rules = append(external.rules, ruleSpec{terms: []term{r.ifLocal(in.local, false), goTo(clusterChain)},
					comment: "short-circuit pod traffic"})
			}
			external.rules = append(external.rules,
				ruleSpec{terms: []term{fibLocal(true), markOr(r.mark)}, comment: "masquerade local traffic"},
				ruleSpec{terms: []term{fibLocal(true), goTo(clusterChain)}, comment: "short-circuit local traffic"})
		}
		if hasExternal {
			external.rules = append(external.rules, ruleSpec{terms: []term{goTo(externalPolicyChain)}})
		}
	}
	if firewall != nil {
		var sources []netip.Prefix
		allowNode := false
		for _, p := range sp.LoadBalancerSourceRanges {
			sources = append(sources, p)
			allowNode = allowNode || (in.nodeIP.IsValid() && p.Contains(in.nodeIP))
		}
		if allowNode {
			// A load balancer IP that is also a local address loops a node's own request back with the
			// load balancer IP as its source.
			for _, ip := range sp.LoadBalancerIPs {
				sources = append(sources, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
		firewall.rules = append(firewall.rules, ruleSpec{terms: []term{addrSetOf(true, true, sources), drop()}})
	}

	if affinity {
		timeout := time.Duration(sp.StickyMaxAgeSeconds) * time.Second
		for _, ep := range reachable {
			o.sets = append(o.sets, setSpec{name: prefixAffinity + endpointBase(sp.Name, ep.AddrPort()),
				key: layoutAddr, dynamic: true, timeout: timeout})
		}
		if cluster != nil {
			cluster.rules = affinityRules(sp.Name, sp.ClusterEndpoints)
		}
		if local != nil {
			local.rules = affinityRules(sp.Name, sp.LocalEndpoints)
		}
		for i, ep := range reachable {
			endpointChains[i].rules = []ruleSpec{
				{terms: []term{updateSaddr(prefixAffinity + endpointBase(sp.Name, ep.AddrPort()))}},
				{terms: []term{l4proto(proto), dnatTo(ep.AddrPort())}},
			}
		}
	} else {
		if cluster != nil {
			cluster.rules = dnatRules(proto, sp.ClusterEndpoints)
		}
		if local != nil {
			local.rules = dnatRules(proto, sp.LocalEndpoints)
		}
	}
	return o
}

// addrSetOf matches an address against prefixes, always written as an anonymous set (as upstream writes
// source ranges; nft turns one element into a plain comparison).
func addrSetOf(saddr, neg bool, ps []netip.Prefix) term { return addrsIn(saddr, neg, ps) }

// dnatRules spreads traffic over endpoints: one DNAT for one endpoint, else a random pick in a map.
func dnatRules(proto uint8, eps []proxy.Endpoint) []ruleSpec {
	if len(eps) == 1 {
		return []ruleSpec{{terms: []term{l4proto(proto), dnatTo(eps[0].AddrPort())}}}
	}
	targets := make([]netip.AddrPort, len(eps))
	for i := range eps {
		targets[i] = eps[i].AddrPort()
	}
	return []ruleSpec{{terms: []term{l4proto(proto), dnatMap(targets)}}}
}

// affinityRules sends clients with an affinity entry to their endpoint, and the others to a random one.
func affinityRules(name proxy.ServicePortName, eps []proxy.Endpoint) []ruleSpec {
	rules := make([]ruleSpec, 0, len(eps)+1)
	chains := make([]string, len(eps))
	for i := range eps {
		base := endpointBase(name, eps[i].AddrPort())
		chains[i] = prefixEndpoint + base
		rules = append(rules, ruleSpec{terms: []term{addrInSet(true, prefixAffinity+base), goTo(chains[i])}})
	}
	return append(rules, ruleSpec{terms: []term{numgenVmap(chains)}})
}

// reachableEndpoints returns the endpoints reachable from this node under the port's policies: the union
// of its Cluster and Local endpoints, in address order.
func reachableEndpoints(sp *proxy.ServicePort) []proxy.Endpoint {
	var c, l []proxy.Endpoint
	if sp.UsesClusterEndpoints() {
		c = sp.ClusterEndpoints
	}
	if sp.UsesLocalEndpoints() {
		l = sp.LocalEndpoints
	}
	if len(l) == 0 {
		return c
	}
	if len(c) == 0 {
		return l
	}
	out := make([]proxy.Endpoint, 0, len(c)+len(l))
	i, j := 0, 0
	for i < len(c) || j < len(l) {
		switch {
		case j == len(l) || (i < len(c) && c[i].Addr < l[j].Addr):
			out = append(out, c[i])
			i++
		case i == len(c) || l[j].Addr < c[i].Addr:
			out = append(out, l[j])
			j++
		default:
			out = append(out, c[i])
			i++
			j++
		}
	}
	return out
}
