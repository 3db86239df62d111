package ipvs

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
)

// protocol is an IP protocol number IPVS balances: TCP, UDP or SCTP.
type protocol uint8

const (
	protoTCP  protocol = 6
	protoUDP  protocol = 17
	protoSCTP protocol = 132
)

func protocolOf(p v1.Protocol) (protocol, bool) {
	switch p {
	case v1.ProtocolTCP:
		return protoTCP, true
	case v1.ProtocolUDP:
		return protoUDP, true
	case v1.ProtocolSCTP:
		return protoSCTP, true
	}
	return 0, false
}

// String returns the lower-case name ipset and iptables use.
func (p protocol) String() string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	case protoSCTP:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// gracefulDelete reports whether real servers of this protocol are drained (weight 0 until their
// connections end) rather than deleted at once: TCP only, as upstream. UDP and SCTP entries are expired by
// the kernel on their next packet (expire_nodest_conn=1).
func (p protocol) gracefulDelete() bool { return p == protoTCP }

// Virtual server flags (IP_VS_SVC_F_*).
const (
	flagPersistent = 0x0001
	flagHashed     = 0x0002 // set by the kernel on every service; ignored when comparing
	flagSched1     = 0x0008 // sh-fallback / mh-fallback
	flagSched2     = 0x0010 // sh-port / mh-port
)

// vsKey identifies a virtual server.
type vsKey struct {
	addr  netip.Addr
	port  uint16
	proto protocol
}

func (k vsKey) String() string {
	return k.proto.String() + "/" + netip.AddrPortFrom(k.addr, k.port).String()
}

func (k vsKey) compare(o vsKey) int {
	if c := k.addr.Compare(o.addr); c != 0 {
		return c
	}
	if c := cmp.Compare(k.port, o.port); c != 0 {
		return c
	}
	return cmp.Compare(k.proto, o.proto)
}

// realKey identifies a real server of a virtual server.
type realKey struct {
	addr netip.Addr
	port uint16
}

func (r realKey) String() string { return netip.AddrPortFrom(r.addr, r.port).String() }

func (r realKey) compare(o realKey) int {
	if c := r.addr.Compare(o.addr); c != 0 {
		return c
	}
	return cmp.Compare(r.port, o.port)
}

// virtualServer is a virtual server the plan wants, with its real servers (each of weight 1).
type virtualServer struct {
	key       vsKey
	scheduler string
	flags     uint32
	timeout   uint32
	reals     []realKey // sorted
}

// sameService reports whether two virtual servers have the same settings (not comparing real servers).
func (v *virtualServer) sameService(scheduler string, flags, timeout uint32) bool {
	return v.scheduler == scheduler && v.flags == flags&^flagHashed && v.timeout == timeout
}

// entry is a member of an ipset. Which fields are set depends on the set's type: port only (bitmap:port),
// ip (hash:ip), ip+proto+port (hash:ip,port), and ip2 (hash:ip,port,ip) or net (hash:ip,port,net) on top.
type entry struct {
	ip    netip.Addr
	proto protocol
	port  uint16
	ip2   netip.Addr
	net   netip.Prefix
}

// String writes the entry as the ipset tool does ("10.0.0.1,tcp:80,10.0.0.2").
func (e entry) String() string {
	if !e.ip.IsValid() {
		return strconv.Itoa(int(e.port))
	}
	if e.proto == 0 {
		return e.ip.String()
	}
	s := e.ip.String() + "," + e.proto.String() + ":" + strconv.Itoa(int(e.port))
	switch {
	case e.ip2.IsValid():
		s += "," + e.ip2.String()
	case e.net.IsValid():
		s += "," + e.net.String()
	}
	return s
}

func (e entry) compare(o entry) int {
	if c := e.ip.Compare(o.ip); c != 0 {
		return c
	}
	if c := cmp.Compare(e.port, o.port); c != 0 {
		return c
	}
	if c := cmp.Compare(e.proto, o.proto); c != 0 {
		return c
	}
	if c := e.ip2.Compare(o.ip2); c != 0 {
		return c
	}
	if c := e.net.Addr().Compare(o.net.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(e.net.Bits(), o.net.Bits())
}

// setEntry is an entry of a given set.
type setEntry struct {
	set setID
	e   entry
}

// servicePlan is what one Service port contributes to the kernel state.
type servicePlan struct {
	vss     []*virtualServer
	binds   []netip.Addr // addresses for kube-ipvs0
	entries []setEntry
	// noNodeAccess lists load-balancer ip+proto+port whose source ranges do not include the node, so the
	// node itself must not reach them (KUBE-IPVS-OUT-FILTER rules).
	noNodeAccess []entry
}

// env is what the plan needs to know about the node besides the snapshot: its addresses, read from the
// kernel at full syncs.
type env struct {
	// nodePortIPs are the addresses NodePorts are served on: the node's addresses (not on kube-ipvs0, no
	// loopback, no IPv6 link-local) that nodePortAddresses selects. Sorted.
	nodePortIPs []netip.Addr
	// local are all the node's addresses of the family that are not on kube-ipvs0, sorted: external and
	// load-balancer IPs among them are not bound to kube-ipvs0.
	local []netip.Addr
}

func (e *env) equal(o *env) bool {
	return slices.Equal(e.nodePortIPs, o.nodePortIPs) && slices.Equal(e.local, o.local)
}

func (e *env) isLocal(a netip.Addr) bool {
	_, ok := slices.BinarySearchFunc(e.local, a, netip.Addr.Compare)
	return ok
}

// newEnv derives the env from the node's addresses of the family (in any order, duplicates allowed).
func newEnv(cfg *Config, node *proxy.Node, addrs []netip.Addr) env {
	var e env
	for _, a := range addrs {
		a = a.Unmap()
		if familyOf(a) != cfg.Family {
			continue
		}
		e.local = append(e.local, a)
	}
	slices.SortFunc(e.local, netip.Addr.Compare)
	e.local = slices.Compact(e.local)
	cidrs, all := cfg.NodePortCIDRs(node)
	for _, a := range e.local {
		if a.IsLoopback() || (a.Is6() && a.IsLinkLocalUnicast()) {
			continue
		}
		if all || slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a) }) {
			e.nodePortIPs = append(e.nodePortIPs, a)
		}
	}
	return e
}

// planService decides the kernel state for one Service port. It uses the endpoints proxy/ selected:
// ClusterEndpoints for Cluster-policy traffic and LocalEndpoints for Local-policy traffic. It returns nil
// for a port IPVS cannot serve (an unknown protocol, or a cluster IP of the other family).
func planService(cfg *Config, en *env, node *proxy.Node, sp *proxy.ServicePort) *servicePlan {
	proto, ok := protocolOf(sp.Protocol)
	if !ok || !sp.ClusterIP.IsValid() || familyOf(sp.ClusterIP) != cfg.Family {
		return nil
	}
	p := &servicePlan{}
	port := uint16(sp.Port)
	flags, timeout := uint32(0), uint32(0)
	if sp.SessionAffinity() {
		flags, timeout = flagPersistent, uint32(sp.StickyMaxAgeSeconds)
	}
	if cfg.Scheduler == "mh" {
		// As upstream: hash on the source port too, so one client's connections spread.
		flags |= flagSched2
	}
	newVS := func(addr netip.Addr, port uint16, reals []realKey) {
		p.vss = append(p.vss, &virtualServer{key: vsKey{addr, port, proto}, scheduler: cfg.Scheduler,
			flags: flags, timeout: timeout, reals: reals})
	}
	add := func(id setID, e entry) { p.entries = append(p.entries, setEntry{id, e}) }
	ipPort := func(ip netip.Addr) entry { return entry{ip: ip, proto: proto, port: port} }

	// Hairpin: a local endpoint reaching itself through the Service is masqueraded.
	for i := range sp.Endpoints {
		if e := &sp.Endpoints[i]; e.IsLocal && familyOf(e.IP) == cfg.Family {
			add(setLoopBack, entry{ip: e.IP, proto: proto, port: uint16(e.Port), ip2: e.IP})
		}
	}

	// Which real servers each kind of traffic goes to, and whether Local traffic lacks local endpoints
	// while endpoints exist elsewhere (iptables mode DROPs such traffic; see the package documentation).
	internal, internalNoLocal := reals(sp.ClusterEndpoints), false
	if sp.InternalPolicyLocal {
		internal = reals(sp.LocalEndpoints)
		internalNoLocal = len(sp.LocalEndpoints) == 0 && sp.HasAnyEndpoints
	}
	external, externalNoLocal := reals(sp.ClusterEndpoints), false
	if sp.ExternalPolicyLocal {
		if len(sp.LocalEndpoints) > 0 {
			external = reals(sp.LocalEndpoints)
		} else {
			// The node and its pods still reach the Service through the Cluster endpoints (as iptables
			// mode's short-circuit does); traffic from elsewhere is dropped by KUBE-EXTERNAL-NO-LOCAL.
			externalNoLocal = sp.HasAnyEndpoints
		}
	}

	// Cluster IP.
	add(setClusterIP, ipPort(sp.ClusterIP))
	if internalNoLocal {
		add(setInternalNoLocal, ipPort(sp.ClusterIP))
	}
	newVS(sp.ClusterIP, port, internal)
	p.binds = append(p.binds, sp.ClusterIP)

	// External IPs.
	for _, ip := range sp.ExternalIPs {
		if familyOf(ip) != cfg.Family {
			continue
		}
		if sp.ExternalPolicyLocal {
			add(setExternalIPLocal, ipPort(ip))
		} else {
			add(setExternalIP, ipPort(ip))
		}
		if externalNoLocal {
			add(setExternalNoLocal, ipPort(ip))
		}
		newVS(ip, port, external)
		if !en.isLocal(ip) {
			p.binds = append(p.binds, ip)
		}
	}

	// Load-balancer IPs.
	for _, ip := range sp.LoadBalancerIPs {
		if familyOf(ip) != cfg.Family {
			continue
		}
		add(setLoadBalancer, ipPort(ip))
		if sp.ExternalPolicyLocal {
			add(setLoadBalancerLocal, ipPort(ip))
		}
		if len(sp.LoadBalancerSourceRanges) > 0 {
			add(setLoadBalancerFW, ipPort(ip))
			allowNode, nodeIP := false, cfg.NodeIP(node)
			for _, r := range sp.LoadBalancerSourceRanges {
				if familyOf(r.Addr()) != cfg.Family {
					continue
				}
				add(setLoadBalancerSourceCIDR, entry{ip: ip, proto: proto, port: port, net: r.Masked()})
				if nodeIP.IsValid() && r.Contains(nodeIP) {
					allowNode = true
				}
			}
			if allowNode {
				// Traffic from a backend host to the load balancer may be routed back to this node with
				// the load-balancer IP as its source.
				add(setLoadBalancerSourceIP, entry{ip: ip, proto: proto, port: port, ip2: ip})
			} else {
				p.noNodeAccess = append(p.noNodeAccess, ipPort(ip))
			}
		}
		if externalNoLocal {
			add(setExternalNoLocal, ipPort(ip))
		}
		newVS(ip, port, external)
		if !en.isLocal(ip) {
			p.binds = append(p.binds, ip)
		}
	}

	// Node port, on every selected node address.
	if sp.NodePort != 0 && len(en.nodePortIPs) > 0 {
		np := uint16(sp.NodePort)
		switch proto {
		case protoTCP, protoUDP:
			all, local := setNodePortTCP, setNodePortLocalTCP
			if proto == protoUDP {
				all, local = setNodePortUDP, setNodePortLocalUDP
			}
			add(all, entry{port: np})
			if sp.ExternalPolicyLocal {
				add(local, entry{port: np})
			}
		case protoSCTP:
			for _, ip := range en.nodePortIPs {
				add(setNodePortSCTP, entry{ip: ip, proto: proto, port: np})
				if sp.ExternalPolicyLocal {
					add(setNodePortLocalSCTP, entry{ip: ip, proto: proto, port: np})
				}
			}
		}
		for _, ip := range en.nodePortIPs {
			if externalNoLocal {
				add(setExternalNoLocal, entry{ip: ip, proto: proto, port: np})
			}
			newVS(ip, np, external)
		}
	}

	if sp.HealthCheckNodePort != 0 {
		add(setHealthCheckNodePort, entry{port: uint16(sp.HealthCheckNodePort)})
	}
	for _, ip := range p.binds {
		add(setIPVSIPs, entry{ip: ip})
	}
	return p
}

// reals converts selected endpoints to real servers, sorted.
func reals(eps []proxy.Endpoint) []realKey {
	out := make([]realKey, 0, len(eps))
	for i := range eps {
		out = append(out, realKey{eps[i].IP, uint16(eps[i].Port)})
	}
	slices.SortFunc(out, realKey.compare)
	return slices.Compact(out)
}
