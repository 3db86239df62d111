package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"kube-proxy/proxy"
	"kube-proxy/rules/xtables"
)

// Fragments of the shared chains one Service port contributes, in svcState.shared.
const (
	fragNATClusterIP      = iota // nat KUBE-SERVICES: the cluster IP rule (into a bucket when dispatching)
	fragNATServices              // nat KUBE-SERVICES: external and load balancer IP rules
	fragNATNodePortsLocal        // nat KUBE-NODEPORTS: the copy for 127.0.0.0/8 that counts packets (nfacct)
	fragNATNodePorts
	fragFilterServices
	fragFilterExternal
	fragFilterFirewall
	fragFilterNodePorts
	numFrags
)

// svcState is what the renderer remembers about one Service port between renders.
type svcState struct {
	key proxy.ServicePortName
	// sp is the port the fields below were computed from (nil before the first render), plan its decisions.
	sp   *proxy.ServicePort
	plan plan

	name  string // "ns/name[:port]"
	proto string // "tcp", "udp" or "sctp"
	svc   string // KUBE-SVC-…
	svl   string // KUBE-SVL-…
	ext   string // KUBE-EXT-…
	fw    string // KUBE-FW-…
	// seps caches the KUBE-SEP names of the reachable endpoints, sorted by address (a slice: a map per
	// Service port cost a few hundred bytes each at 10,000 Services).
	seps []sepName

	// shared holds the rules sp adds to the shared chains: fragment i is shared[off[i]:off[i+1]] with
	// lines[i] rules.
	shared []byte
	off    [numFrags + 1]int
	lines  [numFrags]int

	// chains are the nat chains of sp, sorted.
	chains []string
	// ownRules counts the rules last written into chains.
	ownRules int
}

// frag returns fragment i of the port's shared rules.
func (st *svcState) frag(i int) []byte { return st.shared[st.off[i]:st.off[i+1]] }

func newSvcState(spn proxy.ServicePortName) *svcState {
	name := spn.String()
	proto := protoLower(spn)
	hash := hashName("", name, proto) // "-XXXXXXXXXXXXXXXX"
	return &svcState{
		key:   spn,
		name:  name,
		proto: proto,
		svc:   PrefixService + hash,
		svl:   PrefixServiceLocal + hash,
		ext:   PrefixServiceExternal + hash,
		fw:    PrefixServiceFirewall + hash,
	}
}

type sepName struct{ addr, name string }

// sep returns the KUBE-SEP chain name of an endpoint address.
func (st *svcState) sep(addr string) string {
	i, ok := slices.BinarySearchFunc(st.seps, addr, func(s sepName, a string) int { return strings.Compare(s.addr, a) })
	if ok {
		return st.seps[i].name
	}
	n := hashName(PrefixEndpoint, st.name, st.proto, addr)
	st.seps = slices.Insert(st.seps, i, sepName{addr, n})
	return n
}

// pruneSeps makes the cache hold the names of sp's reachable endpoints, keeping the names it already has.
// Both are in address order, so this is one merge.
func (st *svcState) pruneSeps(sp *proxy.ServicePort) {
	old := st.seps
	next := make([]sepName, 0, len(sp.ClusterEndpoints)+len(sp.LocalEndpoints))
	i := 0
	forReachable(sp, func(e *proxy.Endpoint) {
		for i < len(old) && old[i].addr < e.Addr {
			i++
		}
		if i < len(old) && old[i].addr == e.Addr {
			next = append(next, sepName{e.Addr, old[i].name})
			return
		}
		next = append(next, sepName{e.Addr, hashName(PrefixEndpoint, st.name, st.proto, e.Addr)})
	})
	st.seps = slices.Clip(next)
}

// plan holds upstream's per-Service decisions: which chains exist and where traffic goes.
type plan struct {
	hasEndpoints bool // usable endpoints somewhere in the cluster
	hasInternal  bool // cluster IP traffic has endpoints to go to
	hasExternal  bool // external traffic from outside has endpoints to go to
	usesCluster  bool // KUBE-SVC exists
	usesLocal    bool // KUBE-SVL exists
	usesExt      bool // KUBE-EXT exists
	usesFW       bool // KUBE-FW exists

	internalChain string // where cluster IP traffic goes
	externalChain string // where the EXT chain finally sends traffic
	lbChain       string // where load balancer IP traffic goes (EXT or FW)

	// Targets and comments of the filter rules for traffic without endpoints.
	internalFilterTarget, internalFilterComment string
	externalFilterTarget, externalFilterComment string
}

func makePlan(st *svcState, sp *proxy.ServicePort) (plan, error) {
	var p plan
	p.hasEndpoints = sp.HasAnyEndpoints
	p.usesCluster = len(sp.ClusterEndpoints) > 0 && sp.UsesClusterEndpoints()
	p.usesLocal = len(sp.LocalEndpoints) > 0 && sp.UsesLocalEndpoints()

	p.internalChain, p.hasInternal = st.svc, p.hasEndpoints
	internalUsed := p.usesCluster
	if sp.InternalPolicyLocal {
		p.internalChain, internalUsed = st.svl, p.usesLocal
		if len(sp.LocalEndpoints) == 0 {
			p.hasInternal = false
		}
	}
	p.externalChain, p.hasExternal = st.svc, p.hasEndpoints
	externalUsed := p.usesCluster
	if sp.ExternalPolicyLocal {
		p.externalChain, externalUsed = st.svl, p.usesLocal
		if len(sp.LocalEndpoints) == 0 {
			p.hasExternal = false
		}
	}
	// The EXT chain is needed even without endpoints for external traffic: it short-circuits traffic from
	// this node and its pods to the Cluster endpoints.
	p.usesExt = p.hasEndpoints && sp.ExternallyAccessible()
	p.lbChain = st.ext
	p.usesFW = p.hasEndpoints && len(sp.LoadBalancerIPs) > 0 && len(sp.LoadBalancerSourceRanges) > 0
	if p.usesFW {
		p.lbChain = st.fw
	}

	switch {
	case p.hasInternal && !internalUsed:
		return p, fmt.Errorf("service port %s: inconsistent snapshot: cluster IP traffic has endpoints but %s has none", st.name, p.internalChain)
	case p.usesExt && p.hasExternal && !externalUsed:
		return p, fmt.Errorf("service port %s: inconsistent snapshot: external traffic has endpoints but %s has none", st.name, p.externalChain)
	case p.usesExt && sp.ExternalPolicyLocal && !p.usesCluster:
		return p, fmt.Errorf("service port %s: inconsistent snapshot: no Cluster endpoints for short-circuited external traffic", st.name)
	}

	if !p.hasEndpoints {
		p.internalFilterTarget, p.internalFilterComment = "REJECT", st.name+commentNoEndpoints
		p.externalFilterTarget, p.externalFilterComment = "REJECT", p.internalFilterComment
	} else {
		if !p.hasInternal {
			p.internalFilterTarget, p.internalFilterComment = "DROP", st.name+commentNoLocalEndpoints
		}
		if !p.hasExternal {
			p.externalFilterTarget, p.externalFilterComment = "DROP", st.name+commentNoLocalEndpoints
		}
	}
	return p, nil
}

// ownChains returns the nat chains a port needs, sorted.
func ownChains(st *svcState, sp *proxy.ServicePort, p *plan, dst []string) []string {
	dst = dst[:0]
	if p.usesExt {
		dst = append(dst, st.ext)
	}
	if p.usesFW {
		dst = append(dst, st.fw)
	}
	if p.usesCluster {
		dst = append(dst, st.svc)
	}
	if p.usesLocal {
		dst = append(dst, st.svl)
	}
	forReachable(sp, func(e *proxy.Endpoint) { dst = append(dst, st.sep(e.Addr)) })
	slices.Sort(dst)
	return dst
}

// forReachable calls fn for every endpoint reachable from this node under the port's policies (the union of
// its Cluster and Local endpoints), in address order. Both lists are sorted by address.
func forReachable(sp *proxy.ServicePort, fn func(e *proxy.Endpoint)) {
	var c, l []proxy.Endpoint
	if sp.UsesClusterEndpoints() {
		c = sp.ClusterEndpoints
	}
	if sp.UsesLocalEndpoints() {
		l = sp.LocalEndpoints
	}
	i, j := 0, 0
	for i < len(c) || j < len(l) {
		switch {
		case j == len(l) || (i < len(c) && c[i].Addr < l[j].Addr):
			fn(&c[i])
			i++
		case i == len(c) || l[j].Addr < c[i].Addr:
			fn(&l[j])
			j++
		default: // the same endpoint in both
			fn(&c[i])
			i++
			j++
		}
	}
}

// renderShared records the rules sp contributes to the shared chains of both tables.
func (r *Renderer) renderShared(st *svcState, sp *proxy.ServicePort, p *plan) {
	w := &r.scratch
	w.B = st.shared[:0]
	w.Lines = 0
	mark := func(i int) {
		st.off[i+1] = len(w.B)
		st.lines[i] = w.Lines
		w.Lines = 0
	}
	st.off[0] = 0

	// nat KUBE-SERVICES: cluster IP, external IPs, load balancer IPs.
	if p.hasInternal {
		w.Rule(chainServices).Comment(st.name, commentClusterIP).Proto(st.proto).
			T("-d").Addr(sp.ClusterIP).T("--dport").Num(sp.Port).T("-j", p.internalChain).End()
	}
	mark(fragNATClusterIP)
	if p.hasEndpoints {
		for _, ip := range sp.ExternalIPs {
			w.Rule(chainServices).Comment(st.name, commentExternalIP).Proto(st.proto).
				T("-d").Addr(ip).T("--dport").Num(sp.Port).T("-j", st.ext).End()
		}
		for _, ip := range sp.LoadBalancerIPs {
			w.Rule(chainServices).Comment(st.name, commentLoadBalancerIP).Proto(st.proto).
				T("-d").Addr(ip).T("--dport").Num(sp.Port).T("-j", p.lbChain).End()
		}
	}
	mark(fragNATServices)

	// nat KUBE-NODEPORTS, with upstream's copy for 127.0.0.0/8 ahead that counts the packets for
	// kubeproxy_iptables_localhost_nodeports_accepted_packets_total (used only while NodePorts answer on
	// loopback: see buildNAT).
	if sp.NodePort != 0 && p.hasEndpoints && r.cfg.countsLocalhostNodePorts() {
		w.Rule(chainNodePorts).T("-m", "comment", "--comment", st.name).Proto(st.proto).
			T("-d", "127.0.0.0/8", "--dport").Num(sp.NodePort).
			T("-m", "nfacct", "--nfacct-name", CounterLocalhostNodePorts, "-j", st.ext).End()
	}
	mark(fragNATNodePortsLocal)
	if sp.NodePort != 0 && p.hasEndpoints {
		w.Rule(chainNodePorts).T("-m", "comment", "--comment", st.name).Proto(st.proto).
			T("--dport").Num(sp.NodePort).T("-j", st.ext).End()
	}
	mark(fragNATNodePorts)

	// filter KUBE-SERVICES: cluster IP without endpoints.
	if !p.hasInternal {
		w.Rule(chainServices).Comment(p.internalFilterComment).Proto(st.proto).
			T("-d").Addr(sp.ClusterIP).T("--dport").Num(sp.Port).T("-j", p.internalFilterTarget).End()
	}
	mark(fragFilterServices)

	// filter KUBE-EXTERNAL-SERVICES: external destinations without endpoints for outside traffic.
	if !p.hasExternal {
		for _, ip := range sp.ExternalIPs {
			w.Rule(chainExternalServices).Comment(p.externalFilterComment).Proto(st.proto).
				T("-d").Addr(ip).T("--dport").Num(sp.Port).T("-j", p.externalFilterTarget).End()
		}
		for _, ip := range sp.LoadBalancerIPs {
			w.Rule(chainExternalServices).Comment(p.externalFilterComment).Proto(st.proto).
				T("-d").Addr(ip).T("--dport").Num(sp.Port).T("-j", p.externalFilterTarget).End()
		}
		if sp.NodePort != 0 {
			w.Rule(chainExternalServices).Comment(p.externalFilterComment).
				T("-m", "addrtype", "--dst-type", "LOCAL").Proto(st.proto).
				T("--dport").Num(sp.NodePort).T("-j", p.externalFilterTarget).End()
		}
	}
	mark(fragFilterExternal)

	// filter KUBE-PROXY-FIREWALL: load balancer traffic the FW chain did not accept.
	if p.usesFW {
		for _, ip := range sp.LoadBalancerIPs {
			w.Rule(chainProxyFirewall).Comment(st.name, commentNotAccepted, st.fw).Proto(st.proto).
				T("-d").Addr(ip).T("--dport").Num(sp.Port).T("-j", "DROP").End()
		}
	}
	mark(fragFilterFirewall)

	// filter KUBE-NODEPORTS: the health check node port is always accepted.
	if sp.HealthCheckNodePort != 0 {
		w.Rule(chainNodePorts).Comment(st.name, " health check node port").Proto("tcp").
			T("--dport").Num(sp.HealthCheckNodePort).T("-j", "ACCEPT").End()
	}
	mark(fragFilterNodePorts)

	st.shared = w.B
	w.B = nil
}

// globals are the inputs besides the Service port that change its own chains.
type globals struct {
	large      bool       // more than 1000 endpoints: no comments in endpoint rules
	nodeIP     netip.Addr // the node's primary IP, for loadBalancerSourceRanges
	ifLocal    []string   // matches traffic from local pods (nil: no detection)
	ifNotLocal []string
}

// sameSemantics reports whether two globals render rules that treat traffic alike (comments aside).
func (g *globals) sameSemantics(o *globals) bool {
	return g.nodeIP == o.nodeIP && slices.Equal(g.ifLocal, o.ifLocal) && slices.Equal(g.ifNotLocal, o.ifNotLocal)
}

// renderOwn writes the port's own nat chains' rules into w and returns how many it wrote.
func (r *Renderer) renderOwn(w *xtables.Lines, st *svcState, sp *proxy.ServicePort, p *plan, g *globals) int {
	start := w.Lines

	// Masquerade cluster IP traffic that does not come from a local pod (or all of it).
	if p.hasInternal && (r.cfg.MasqueradeAll || g.ifNotLocal != nil) {
		w.Rule(p.internalChain).Comment(st.name, commentClusterIP).Proto(st.proto).
			T("-d").Addr(sp.ClusterIP).T("--dport").Num(sp.Port)
		if !r.cfg.MasqueradeAll {
			w.T(g.ifNotLocal...)
		}
		w.T("-j", chainMarkMasq).End()
	}

	if p.usesExt {
		if !sp.ExternalPolicyLocal {
			// Endpoints may be on other nodes: masquerade so replies come back here.
			w.Rule(st.ext).Comment("masquerade traffic for ", st.name, " external destinations").
				T("-j", chainMarkMasq).End()
		} else {
			// Source IP is kept. Pods and the node itself reach external destinations as if through an
			// outside load balancer: Cluster endpoints, and the node's traffic masqueraded.
			if g.ifLocal != nil {
				w.Rule(st.ext).Comment("pod traffic for ", st.name, " external destinations").
					T(g.ifLocal...).T("-j", st.svc).End()
			}
			w.Rule(st.ext).Comment("masquerade LOCAL traffic for ", st.name, " external destinations").
				T("-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq).End()
			w.Rule(st.ext).Comment("route LOCAL traffic for ", st.name, " external destinations").
				T("-m", "addrtype", "--src-type", "LOCAL", "-j", st.svc).End()
		}
		if p.hasExternal {
			w.Rule(st.ext).T("-j", p.externalChain).End()
		}
	}

	if p.usesFW {
		allowFromNode := false
		for _, cidr := range sp.LoadBalancerSourceRanges {
			w.Rule(st.fw).Comment(st.name, commentLoadBalancerIP).T("-s").Prefix(cidr).T("-j", st.ext).End()
			if g.nodeIP.IsValid() && cidr.Contains(g.nodeIP) {
				allowFromNode = true
			}
		}
		// A VIP load balancer's address is often local: the node's own requests to it then come from
		// the VIP itself.
		if allowFromNode {
			for _, ip := range sp.LoadBalancerIPs {
				w.Rule(st.fw).Comment(st.name, commentLoadBalancerIP).T("-s").Addr(ip).T("-j", st.ext).End()
			}
		}
		// What falls through is dropped by KUBE-PROXY-FIREWALL in the filter table (this rule only counts).
		w.Rule(st.fw).Comment("other traffic to ", st.name, " will be dropped by KUBE-PROXY-FIREWALL").End()
	}

	if p.usesCluster {
		r.renderEndpointJumps(w, st, sp, st.svc, sp.ClusterEndpoints, g)
	}
	if p.usesLocal {
		r.renderEndpointJumps(w, st, sp, st.svl, sp.LocalEndpoints, g)
	}

	affinity := sp.SessionAffinity()
	forReachable(sp, func(e *proxy.Endpoint) {
		sep := st.sep(e.Addr)
		// Hairpin: a pod reaching itself through the Service must be masqueraded.
		w.Rule(sep)
		if !g.large {
			w.T("-m", "comment", "--comment", st.name)
		}
		w.T("-s").Addr(e.IP).T("-j", chainMarkMasq).End()

		w.Rule(sep)
		if !g.large {
			w.T("-m", "comment", "--comment", st.name)
		}
		if affinity {
			w.T("-m", "recent", "--name", sep, "--set")
		}
		w.Proto(st.proto).T("-j", "DNAT", "--to-destination", e.Addr).End()
	})
	return w.Lines - start
}

// renderEndpointJumps writes a KUBE-SVC or KUBE-SVL chain: session affinity checks first, then one rule per
// endpoint with probability 1/(n-i), the last one unconditional.
func (r *Renderer) renderEndpointJumps(w *xtables.Lines, st *svcState, sp *proxy.ServicePort, chain string, eps []proxy.Endpoint, g *globals) {
	if sp.SessionAffinity() {
		for i := range eps {
			e := &eps[i]
			sep := st.sep(e.Addr)
			w.Rule(chain)
			if !g.large {
				w.Comment(st.name, " -> ", e.Addr)
			}
			w.T("-m", "recent", "--name", sep, "--rcheck", "--seconds").Num(sp.StickyMaxAgeSeconds).
				T("--reap", "-j", sep).End()
		}
	}
	n := len(eps)
	for i := range eps {
		e := &eps[i]
		w.Rule(chain)
		if !g.large {
			w.Comment(st.name, " -> ", e.Addr)
		}
		if i < n-1 {
			w.T("-m", "statistic", "--mode", "random", "--probability", r.probability(n-i))
		}
		w.T("-j", st.sep(e.Addr)).End()
	}
}
