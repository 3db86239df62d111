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

// service renders one Service port, following upstream's decisions for each traffic policy: the elements
// it adds to the shared sets and maps, then its chains, in upstream's order of creation, and its affinity
// sets.
func (r *renderer) service(sp *proxy.ServicePort, in *inputs) *svcObjects {
	s := r.newServiceRender(sp, in)
	s.hairpin()
	s.clusterIP()
	s.externalIPs()
	s.loadBalancerIPs()
	s.nodePort()

	s.endpointChains()
	s.policyChains()
	s.externalChain()
	s.firewallChain()
	s.affinitySets()
	return s.o
}

// serviceRender is one Service port being rendered: its names and what its traffic policies decide,
// shared by the steps of renderer.service, and the objects they add.
type serviceRender struct {
	r  *renderer
	sp *proxy.ServicePort
	in *inputs
	o  *svcObjects

	proto   uint8
	comment string // of its no-endpoint elements
	// chain names its cluster and local policy chains, its external chain and its firewall chain.
	chain struct{ cluster, local, external, firewall string }
	// internalPolicy and externalPolicy are the policy chains (cluster or local) that internal and
	// external traffic go to; hasInternal and hasExternal report whether they have endpoints for it.
	internalPolicy, externalPolicy string
	hasInternal, hasExternal       bool
	// noEndpoint is the verdict for traffic that has nowhere to go: reject without any endpoint, drop when
	// the endpoints are all on other nodes and the policy is Local.
	noEndpoint verdict
	// usesFirewall is set when loadBalancerSourceRanges restrict the load balancer IPs.
	usesFirewall bool
	// reachable are the endpoints reachable from this node, in address order.
	reachable []proxy.Endpoint
}

// newServiceRender names the port's chains and works out what its traffic policies decide.
func (r *renderer) newServiceRender(sp *proxy.ServicePort, in *inputs) serviceRender {
	base := serviceBase(sp.Name)
	reachable := reachableEndpoints(sp)
	s := serviceRender{r: r, sp: sp, in: in, proto: protoNumbers[sp.Protocol], comment: truncComment(sp.Name.String()),
		reachable: reachable, o: &svcObjects{chains: make([]chainRules, 0, len(reachable)+4)}}
	s.chain.cluster, s.chain.local = prefixService+base, prefixLocal+base
	s.chain.external, s.chain.firewall = prefixExternal+base, prefixFirewall+base

	s.internalPolicy, s.hasInternal = s.chain.cluster, sp.HasAnyEndpoints
	if sp.InternalPolicyLocal {
		s.internalPolicy = s.chain.local
		s.hasInternal = s.hasInternal && len(sp.LocalEndpoints) > 0
	}
	s.externalPolicy, s.hasExternal = s.chain.cluster, sp.HasAnyEndpoints
	if sp.ExternalPolicyLocal {
		s.externalPolicy = s.chain.local
		s.hasExternal = s.hasExternal && len(sp.LocalEndpoints) > 0
	}
	s.noEndpoint = goToChain(chainReject)
	if sp.HasAnyEndpoints {
		s.noEndpoint = verdict{kind: verdictDrop}
	}
	s.usesFirewall = len(sp.LoadBalancerIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0
	return s
}

// elem adds an element to a shared set or map.
func (s *serviceRender) elem(set string, k elemKey, v verdict) {
	s.o.elems = append(s.o.elems, setElem{set: set, key: k, value: elemValue{verdict: v}})
}

// noEndpointElem adds an element to a no-endpoint map, with the verdict for traffic that has nowhere to go
// and the port's name as comment.
func (s *serviceRender) noEndpointElem(set string, k elemKey) {
	s.o.elems = append(s.o.elems, setElem{set: set, key: k, value: elemValue{verdict: s.noEndpoint, comment: s.comment}})
}

// addrKey is the key of the port on address a in the maps of addresses, protocols and ports.
func (s *serviceRender) addrKey(a netip.Addr) elemKey {
	return elemKey{addr: a, proto: s.proto, port: uint16(s.sp.Port)}
}

// goToChain is the verdict of an element that sends traffic to chain.
func goToChain(chain string) verdict { return verdict{kind: verdictGoto, chain: chain} }

// hairpin adds the local endpoints to the hairpin set: they are masqueraded when they reach themselves.
func (s *serviceRender) hairpin() {
	for _, ep := range s.reachable {
		if ep.IsLocal {
			s.elem(setHairpinConnections, elemKey{addr: ep.IP, addr2: ep.IP, proto: s.proto, port: uint16(ep.Port)}, verdict{})
		}
	}
}

// clusterIP adds the cluster IP, sent to the internal policy chain or, without endpoints for it, to the
// no-endpoint verdict.
func (s *serviceRender) clusterIP() {
	s.elem(setClusterIPs, elemKey{addr: s.sp.ClusterIP}, verdict{})
	if s.hasInternal {
		s.elem(mapServiceIPs, s.addrKey(s.sp.ClusterIP), goToChain(s.internalPolicy))
	} else {
		s.noEndpointElem(mapNoEndpointServices, s.addrKey(s.sp.ClusterIP))
	}
}

// externalIPs adds the external IPs, sent to the external chain, and to the no-endpoint verdict when
// external traffic has no endpoint.
func (s *serviceRender) externalIPs() {
	for _, ip := range s.sp.ExternalIPs {
		if s.sp.HasAnyEndpoints {
			s.elem(mapServiceIPs, s.addrKey(ip), goToChain(s.chain.external))
		}
		if !s.hasExternal {
			s.noEndpointElem(mapNoEndpointServices, s.addrKey(ip))
		}
	}
}

// loadBalancerIPs adds the load balancer IPs, sent to the external chain and, with source ranges, through
// the firewall chain; and to the no-endpoint verdict when external traffic has no endpoint.
func (s *serviceRender) loadBalancerIPs() {
	for _, ip := range s.sp.LoadBalancerIPs {
		if s.sp.HasAnyEndpoints {
			s.elem(mapServiceIPs, s.addrKey(ip), goToChain(s.chain.external))
		}
		if s.usesFirewall {
			s.elem(mapFirewallIPs, s.addrKey(ip), goToChain(s.chain.firewall))
		}
	}
	if !s.hasExternal {
		for _, ip := range s.sp.LoadBalancerIPs {
			s.noEndpointElem(mapNoEndpointServices, s.addrKey(ip))
		}
	}
}

// nodePort adds the node port: rejected on loopback addresses when the gate says so, sent to the external
// chain, and to the no-endpoint verdict when external traffic has no endpoint.
func (s *serviceRender) nodePort() {
	if s.sp.NodePort == 0 {
		return
	}
	cfg := &s.r.cfg
	key := elemKey{proto: s.proto, port: uint16(s.sp.NodePort)}
	if cfg.LocalhostReject && !(cfg.LocalhostProxy && s.sp.Protocol == v1.ProtocolTCP) {
		s.elem(mapLocalhostNodePortReject, key, goToChain(localhostRejectChain(s.sp.Protocol)))
	}
	if s.sp.HasAnyEndpoints {
		s.elem(mapServiceNodePorts, key, goToChain(s.chain.external))
	}
	if !s.hasExternal {
		s.noEndpointElem(mapNoEndpointNodePorts, key)
	}
}

// addChain adds one of the port's chains.
func (s *serviceRender) addChain(name string, rules []ruleSpec) {
	s.o.chains = append(s.o.chains, chainRules{spec: chainSpec{name: name}, rules: rules})
}

// endpointChains adds, with session affinity, a chain for each reachable endpoint: it records the client
// in the endpoint's affinity set and DNATs to the endpoint.
func (s *serviceRender) endpointChains() {
	if !s.sp.SessionAffinity() {
		return
	}
	for _, ep := range s.reachable {
		base := endpointBase(s.sp.Name, ep.AddrPort())
		s.addChain(prefixEndpoint+base, []ruleSpec{
			{terms: []term{updateSaddr(prefixAffinity + base)}},
			{terms: []term{l4proto(s.proto), dnatTo(ep.AddrPort())}},
		})
	}
}

// policyChains adds the cluster and local policy chains that have endpoints in use: each spreads traffic
// over its endpoints (through their chains, with session affinity).
func (s *serviceRender) policyChains() {
	sp := s.sp
	if len(sp.ClusterEndpoints) > 0 && sp.UsesClusterEndpoints() {
		s.addChain(s.chain.cluster, s.toEndpoints(sp.ClusterEndpoints))
	}
	if len(sp.LocalEndpoints) > 0 && sp.UsesLocalEndpoints() {
		s.addChain(s.chain.local, s.toEndpoints(sp.LocalEndpoints))
	}
}

// toEndpoints returns the rules of a policy chain with endpoints eps.
func (s *serviceRender) toEndpoints(eps []proxy.Endpoint) []ruleSpec {
	if s.sp.SessionAffinity() {
		return affinityRules(s.sp.Name, eps)
	}
	return dnatRules(s.proto, eps)
}

// externalChain adds, when the port is externally accessible and has endpoints, the chain that its
// external IPs, load balancer IPs and node port go to: with policy Cluster it masquerades; with policy
// Local, pod and local traffic short-circuit to the cluster policy chain (local traffic masqueraded).
// Then, when external traffic has endpoints, it goes to its policy chain.
func (s *serviceRender) externalChain() {
	sp := s.sp
	if !sp.HasAnyEndpoints || !sp.ExternallyAccessible() {
		return
	}
	var rules []ruleSpec
	if !sp.ExternalPolicyLocal {
		rules = append(rules, ruleSpec{terms: []term{markOr(s.r.mark)}, comment: "masquerade"})
	} else {
		if s.in.local.Implemented() {
			rules = append(rules, ruleSpec{terms: []term{s.r.ifLocal(s.in.local, false), goTo(s.chain.cluster)},
				comment: "short-circuit pod traffic"})
		}
		rules = append(rules,
			ruleSpec{terms: []term{fibLocal(true), markOr(s.r.mark)}, comment: "masquerade local traffic"},
			ruleSpec{terms: []term{fibLocal(true), goTo(s.chain.cluster)}, comment: "short-circuit local traffic"})
	}
	if s.hasExternal {
		rules = append(rules, ruleSpec{terms: []term{goTo(s.externalPolicy)}})
	}
	s.addChain(s.chain.external, rules)
}

// firewallChain adds, when loadBalancerSourceRanges restrict the load balancer IPs, the chain that drops
// traffic to them from other sources.
func (s *serviceRender) firewallChain() {
	if !s.usesFirewall {
		return
	}
	var sources []netip.Prefix
	allowNode := false
	for _, p := range s.sp.LoadBalancerSourceRanges {
		sources = append(sources, p)
		allowNode = allowNode || (s.in.nodeIP.IsValid() && p.Contains(s.in.nodeIP))
	}
	if allowNode {
		// A load balancer IP that is also a local address loops a node's own request back with the
		// load balancer IP as its source.
		for _, ip := range s.sp.LoadBalancerIPs {
			sources = append(sources, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	s.addChain(s.chain.firewall, []ruleSpec{{terms: []term{addrSetOf(true, true, sources), drop()}}})
}

// affinitySets adds, with session affinity, the affinity set of each reachable endpoint: the clients sent
// to it, for the affinity timeout.
func (s *serviceRender) affinitySets() {
	if !s.sp.SessionAffinity() {
		return
	}
	timeout := time.Duration(s.sp.StickyMaxAgeSeconds) * time.Second
	for _, ep := range s.reachable {
		s.o.sets = append(s.o.sets, setSpec{name: prefixAffinity + endpointBase(s.sp.Name, ep.AddrPort()),
			key: layoutAddr, dynamic: true, timeout: timeout})
	}
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
