package ipvs

import (
	"bytes"
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

// vsKey identifies a virtual server. Keys hold their address as an ipAddr (no pointer, 20 bytes instead of
// 32): the writer keeps several per virtual server and real server, in maps and sorted slices.
type vsKey struct {
	ip    ipAddr
	port  uint16
	proto protocol
}

func newVSKey(addr netip.Addr, port uint16, proto protocol) vsKey {
	return vsKey{ip: ipOf(addr), port: port, proto: proto}
}

// Addr is the virtual server's address.
func (k vsKey) Addr() netip.Addr { return k.ip.addr() }

func (k vsKey) String() string {
	return k.proto.String() + "/" + netip.AddrPortFrom(k.Addr(), k.port).String()
}

func (k vsKey) compare(o vsKey) int {
	if c := k.ip.Compare(o.ip); c != 0 {
		return c
	}
	if c := cmp.Compare(k.port, o.port); c != 0 {
		return c
	}
	return cmp.Compare(k.proto, o.proto)
}

// realKey identifies a real server of a virtual server.
type realKey struct {
	ip   ipAddr
	port uint16
}

func newRealKey(addr netip.Addr, port uint16) realKey { return realKey{ip: ipOf(addr), port: port} }

// Addr is the real server's address.
func (r realKey) Addr() netip.Addr { return r.ip.addr() }

func (r realKey) String() string { return netip.AddrPortFrom(r.Addr(), r.port).String() }

func (r realKey) compare(o realKey) int {
	if c := r.ip.Compare(o.ip); c != 0 {
		return c
	}
	return cmp.Compare(r.port, o.port)
}

// virtualServer is a virtual server the desired state wants, with its real servers (each of weight 1).
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
// ip (hash:ip), ip+proto+port (hash:ip,port), and a third part on top: an address (hash:ip,port,ip) or a
// network (hash:ip,port,net).
//
// Entries are the writer's most numerous values (one per Service port and address, one per local
// endpoint), kept in each port's desired state and as map keys: they hold addresses as ipAddr, without netip.Addr's
// zone pointer, in 40 bytes instead of 88, and maps of them are not scanned by the garbage collector.
type entry struct {
	ip    ipAddr
	third ipAddr // the address of ip2 or of net
	isNet bool   // third is a network of bits bits
	bits  uint8
	proto protocol
	port  uint16
}

// ipPortEntry is ip,proto:port.
func ipPortEntry(ip netip.Addr, proto protocol, port uint16) entry {
	return entry{ip: ipOf(ip), proto: proto, port: port}
}

// withIP2 returns e with the address ip2 as its third part (hash:ip,port,ip).
func (e entry) withIP2(ip2 netip.Addr) entry {
	e.third, e.isNet, e.bits = ipOf(ip2), false, 0
	return e
}

// withNet returns e with the network n as its third part (hash:ip,port,net).
func (e entry) withNet(n netip.Prefix) entry {
	e.third, e.isNet, e.bits = ipOf(n.Addr()), true, uint8(n.Bits())
	return e
}

// ip2 is the entry's third part when it is an address (invalid otherwise).
func (e entry) ip2() netip.Addr {
	if e.isNet {
		return netip.Addr{}
	}
	return e.third.addr()
}

// net is the entry's third part when it is a network (invalid otherwise).
func (e entry) net() netip.Prefix {
	if !e.isNet {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(e.third.addr(), int(e.bits))
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
	case e.isNet:
		s += "," + e.net().String()
	case e.third.IsValid():
		s += "," + e.third.String()
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
	if e.isNet != o.isNet { // addresses before networks
		if o.isNet {
			return -1
		}
		return 1
	}
	if c := e.third.Compare(o.third); c != 0 {
		return c
	}
	return cmp.Compare(e.bits, o.bits)
}

// ipAddr is an IP address without a zone (ipset members have none) and without netip.Addr's pointer: its
// 16 bytes (IPv4 as the last four) and its length, 0 when invalid.
type ipAddr struct {
	b   [16]byte
	len uint8
}

// ipOf converts a (zone-less) address.
func ipOf(a netip.Addr) ipAddr {
	switch {
	case a.Is4():
		return ipAddr{b: a.As16(), len: 4}
	case a.IsValid():
		return ipAddr{b: a.As16(), len: 16}
	}
	return ipAddr{}
}

// addr converts back.
func (a ipAddr) addr() netip.Addr {
	switch a.len {
	case 4:
		return netip.AddrFrom16(a.b).Unmap()
	case 16:
		return netip.AddrFrom16(a.b)
	}
	return netip.Addr{}
}

func (a ipAddr) IsValid() bool   { return a.len != 0 }
func (a ipAddr) String() string  { return a.addr().String() }
func (a ipAddr) AsSlice() []byte { return a.addr().AsSlice() }

// Compare orders like netip.Addr.Compare: invalid, then IPv4, then IPv6, each by value.
func (a ipAddr) Compare(o ipAddr) int {
	if c := cmp.Compare(a.len, o.len); c != 0 {
		return c
	}
	return bytes.Compare(a.b[:], o.b[:])
}

// setEntry is an entry of a given set.
type setEntry struct {
	set setID
	e   entry
}

// portDesired is what one Service port contributes to the kernel state.
type portDesired struct {
	vss     []*virtualServer
	binds   []netip.Addr // addresses for kube-ipvs0
	entries []setEntry
	// noNodeAccess lists load-balancer ip+proto+port whose source ranges do not include the node, so the
	// node itself must not reach them (KUBE-IPVS-OUT-FILTER rules).
	noNodeAccess []entry
}

// env is what rendering needs to know about the node besides the snapshot: its addresses, read from the
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
	// IPVS serves no NodePort on loopback or IPv6 link-local addresses, whatever nodePortAddresses says.
	candidates := slices.DeleteFunc(slices.Clone(e.local), func(a netip.Addr) bool {
		return a.IsLoopback() || (a.Is6() && a.IsLinkLocalUnicast())
	})
	ips, all, _ := cfg.NodePortIPs(node, func() ([]netip.Addr, error) { return candidates, nil })
	if all {
		ips = candidates
	}
	e.nodePortIPs = ips
	return e
}

// renderPort decides the kernel state for one Service port. It uses the endpoints proxy/ selected:
// ClusterEndpoints for Cluster-policy traffic and LocalEndpoints for Local-policy traffic. It returns nil
// for a port IPVS cannot serve (an unknown protocol, or a cluster IP of the other family).
func renderPort(cfg *Config, en *env, node *proxy.Node, sp *proxy.ServicePort) *portDesired {
	proto, ok := protocolOf(sp.Protocol)
	if !ok || !sp.ClusterIP.IsValid() || familyOf(sp.ClusterIP) != cfg.Family {
		return nil
	}
	pl := newPortRenderer(cfg, en, sp, proto)
	pl.addHairpin()
	pl.addClusterIP()
	pl.addExternalIPs()
	pl.addLoadBalancerIPs(node)
	pl.addNodePort()
	pl.addHealthCheckNodePort()
	pl.addBoundIPs()
	return pl.p
}

// portRenderer renders the desired state of one Service port: its steps append to p, and share what every virtual
// server of the port has in common.
type portRenderer struct {
	cfg   *Config
	en    *env
	sp    *proxy.ServicePort
	proto protocol
	port  uint16
	// flags and timeout are every virtual server's: persistence for session affinity, port hashing for mh.
	flags, timeout uint32
	trafficReals
	p *portDesired
}

func newPortRenderer(cfg *Config, en *env, sp *proxy.ServicePort, proto protocol) portRenderer {
	pl := portRenderer{cfg: cfg, en: en, sp: sp, proto: proto, port: uint16(sp.Port), p: &portDesired{}}
	if sp.SessionAffinity() {
		pl.flags, pl.timeout = flagPersistent, uint32(sp.StickyMaxAgeSeconds)
	}
	if cfg.Scheduler == "mh" {
		// As upstream: hash on the source port too, so one client's connections spread.
		pl.flags |= flagSched2
	}
	pl.trafficReals = realsByTraffic(sp)
	return pl
}

// trafficReals are the real servers each kind of traffic goes to, and whether Local traffic lacks local
// endpoints while endpoints exist elsewhere (iptables mode DROPs such traffic; see the package
// documentation).
type trafficReals struct {
	internal, external               []realKey
	internalNoLocal, externalNoLocal bool
}

func realsByTraffic(sp *proxy.ServicePort) trafficReals {
	var t trafficReals
	t.internal = reals(sp.ClusterEndpoints)
	if sp.InternalPolicyLocal {
		t.internal = reals(sp.LocalEndpoints)
		t.internalNoLocal = len(sp.LocalEndpoints) == 0 && sp.HasAnyEndpoints
	}
	t.external = reals(sp.ClusterEndpoints)
	if sp.ExternalPolicyLocal {
		if len(sp.LocalEndpoints) > 0 {
			t.external = reals(sp.LocalEndpoints)
		} else {
			// The node and its pods still reach the Service through the Cluster endpoints (as iptables
			// mode's short-circuit does); traffic from elsewhere is dropped by KUBE-EXTERNAL-NO-LOCAL.
			t.externalNoLocal = sp.HasAnyEndpoints
		}
	}
	return t
}

// newVS adds a virtual server of the port's settings.
func (pl *portRenderer) newVS(addr netip.Addr, port uint16, reals []realKey) {
	pl.p.vss = append(pl.p.vss, &virtualServer{key: newVSKey(addr, port, pl.proto), scheduler: pl.cfg.Scheduler,
		flags: pl.flags, timeout: pl.timeout, reals: reals})
}

// add adds an entry to a set.
func (pl *portRenderer) add(id setID, e entry) { pl.p.entries = append(pl.p.entries, setEntry{id, e}) }

// ipPort is the entry ip,proto:port of the Service port.
func (pl *portRenderer) ipPort(ip netip.Addr) entry { return ipPortEntry(ip, pl.proto, pl.port) }

// bindUnlessLocal binds an external or load-balancer IP to kube-ipvs0, unless it is one of the node's.
func (pl *portRenderer) bindUnlessLocal(ip netip.Addr) {
	if !pl.en.isLocal(ip) {
		pl.p.binds = append(pl.p.binds, ip)
	}
}

// addHairpin adds the masquerading of a local endpoint reaching itself through the Service.
func (pl *portRenderer) addHairpin() {
	for i := range pl.sp.Endpoints {
		if e := &pl.sp.Endpoints[i]; e.IsLocal && familyOf(e.IP) == pl.cfg.Family {
			pl.add(setLoopBack, ipPortEntry(e.IP, pl.proto, uint16(e.Port)).withIP2(e.IP))
		}
	}
}

// addClusterIP adds the cluster IP: its virtual server, its set entries and its kube-ipvs0 address.
func (pl *portRenderer) addClusterIP() {
	ip := pl.sp.ClusterIP
	pl.add(setClusterIP, pl.ipPort(ip))
	if pl.internalNoLocal {
		pl.add(setInternalNoLocal, pl.ipPort(ip))
	}
	pl.newVS(ip, pl.port, pl.internal)
	pl.p.binds = append(pl.p.binds, ip)
}

// addExternalIPs adds the external IPs of the family.
func (pl *portRenderer) addExternalIPs() {
	for _, ip := range pl.sp.ExternalIPs {
		if familyOf(ip) != pl.cfg.Family {
			continue
		}
		if pl.sp.ExternalPolicyLocal {
			pl.add(setExternalIPLocal, pl.ipPort(ip))
		} else {
			pl.add(setExternalIP, pl.ipPort(ip))
		}
		if pl.externalNoLocal {
			pl.add(setExternalNoLocal, pl.ipPort(ip))
		}
		pl.newVS(ip, pl.port, pl.external)
		pl.bindUnlessLocal(ip)
	}
}

// addLoadBalancerIPs adds the load-balancer IPs of the family, with their source-range firewall.
func (pl *portRenderer) addLoadBalancerIPs(node *proxy.Node) {
	for _, ip := range pl.sp.LoadBalancerIPs {
		if familyOf(ip) != pl.cfg.Family {
			continue
		}
		pl.add(setLoadBalancer, pl.ipPort(ip))
		if pl.sp.ExternalPolicyLocal {
			pl.add(setLoadBalancerLocal, pl.ipPort(ip))
		}
		if len(pl.sp.LoadBalancerSourceRanges) > 0 {
			pl.addSourceRanges(ip, node)
		}
		if pl.externalNoLocal {
			pl.add(setExternalNoLocal, pl.ipPort(ip))
		}
		pl.newVS(ip, pl.port, pl.external)
		pl.bindUnlessLocal(ip)
	}
}

// addSourceRanges adds the firewall of a load-balancer IP: the source ranges of the family it admits,
// and whether the node itself may reach it.
func (pl *portRenderer) addSourceRanges(ip netip.Addr, node *proxy.Node) {
	pl.add(setLoadBalancerFW, pl.ipPort(ip))
	allowNode, nodeIP := false, pl.cfg.NodeIP(node)
	for _, r := range pl.sp.LoadBalancerSourceRanges {
		if familyOf(r.Addr()) != pl.cfg.Family {
			continue
		}
		pl.add(setLoadBalancerSourceCIDR, pl.ipPort(ip).withNet(r.Masked()))
		if nodeIP.IsValid() && r.Contains(nodeIP) {
			allowNode = true
		}
	}
	if allowNode {
		// Traffic from a backend host to the load balancer may be routed back to this node with
		// the load-balancer IP as its source.
		pl.add(setLoadBalancerSourceIP, pl.ipPort(ip).withIP2(ip))
	} else {
		pl.p.noNodeAccess = append(pl.p.noNodeAccess, pl.ipPort(ip))
	}
}

// addNodePort adds the node port, on every selected node address.
func (pl *portRenderer) addNodePort() {
	if pl.sp.NodePort == 0 || len(pl.en.nodePortIPs) == 0 {
		return
	}
	np := uint16(pl.sp.NodePort)
	pl.addNodePortSets(np)
	for _, ip := range pl.en.nodePortIPs {
		if pl.externalNoLocal {
			pl.add(setExternalNoLocal, ipPortEntry(ip, pl.proto, np))
		}
		pl.newVS(ip, np, pl.external)
	}
}

// addNodePortSets adds the node port's entries in the node-port sets of its protocol: the port alone for
// TCP and UDP, the port on every selected node address for SCTP.
func (pl *portRenderer) addNodePortSets(np uint16) {
	switch pl.proto {
	case protoTCP, protoUDP:
		all, local := setNodePortTCP, setNodePortLocalTCP
		if pl.proto == protoUDP {
			all, local = setNodePortUDP, setNodePortLocalUDP
		}
		pl.add(all, entry{port: np})
		if pl.sp.ExternalPolicyLocal {
			pl.add(local, entry{port: np})
		}
	case protoSCTP:
		for _, ip := range pl.en.nodePortIPs {
			pl.add(setNodePortSCTP, ipPortEntry(ip, pl.proto, np))
			if pl.sp.ExternalPolicyLocal {
				pl.add(setNodePortLocalSCTP, ipPortEntry(ip, pl.proto, np))
			}
		}
	}
}

// addHealthCheckNodePort adds the health-check node port's entry.
func (pl *portRenderer) addHealthCheckNodePort() {
	if pl.sp.HealthCheckNodePort != 0 {
		pl.add(setHealthCheckNodePort, entry{port: uint16(pl.sp.HealthCheckNodePort)})
	}
}

// addBoundIPs adds the entries of the addresses the earlier steps bound to kube-ipvs0.
func (pl *portRenderer) addBoundIPs() {
	for _, ip := range pl.p.binds {
		pl.add(setIPVSIPs, entry{ip: ipOf(ip)})
	}
}

// reals converts selected endpoints to real servers, sorted.
func reals(eps []proxy.Endpoint) []realKey {
	out := make([]realKey, 0, len(eps))
	for i := range eps {
		out = append(out, newRealKey(eps[i].IP, uint16(eps[i].Port)))
	}
	slices.SortFunc(out, realKey.compare)
	return slices.Compact(out)
}
