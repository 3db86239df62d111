package userspace

import (
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/engine"
	"kube-proxy/rules/xtables"
)

// Chain names. The portal chains (and the filter) share portalsPrefix, upstream's as ours.
const (
	ChainPortalsContainer  = portalsPrefix + "CONTAINER"
	ChainPortalsHost       = portalsPrefix + "HOST"
	ChainNodePortContainer = "KUBE-NODEPORT-CONTAINER"
	ChainNodePortHost      = "KUBE-NODEPORT-HOST"
	ChainFilter            = portalsPrefix + "FILTER"

	portalsPrefix = "KUBE-PORTALS-"
)

// Policies name a Service port's endpoint selections (engine.Key.Policy).
const (
	PolicyCluster = "cluster"
	PolicyLocal   = "local"
)

// JumpRules are the rules from built-in chains into ours, in the order they are ensured (each prepended).
func JumpRules() []xtables.JumpRule {
	ctNew := []string{"-m", "conntrack", "--ctstate", "NEW"}
	local := []string{"-m", "addrtype", "--dst-type", "LOCAL"}
	const comment = "kubernetes userspace proxy"
	return []xtables.JumpRule{
		{Table: "nat", Chain: "PREROUTING", Target: ChainNodePortContainer, Args: local, Comment: comment},
		{Table: "nat", Chain: "PREROUTING", Target: ChainPortalsContainer, Comment: comment},
		{Table: "nat", Chain: "OUTPUT", Target: ChainNodePortHost, Args: local, Comment: comment},
		{Table: "nat", Chain: "OUTPUT", Target: ChainPortalsHost, Comment: comment},
		{Table: "filter", Chain: "INPUT", Target: ChainFilter, Args: ctNew, Comment: comment},
		{Table: "filter", Chain: "FORWARD", Target: ChainFilter, Args: ctNew, Comment: comment},
		{Table: "filter", Chain: "OUTPUT", Target: ChainFilter, Args: ctNew, Comment: comment},
	}
}

// Chains returns our chains by table.
func Chains() map[string][]string {
	return map[string][]string{
		"nat":    {ChainNodePortContainer, ChainNodePortHost, ChainPortalsContainer, ChainPortalsHost},
		"filter": {ChainFilter},
	}
}

// Supported reports whether the userspace proxy can serve the protocol (TCP and UDP; not SCTP).
func Supported(p v1.Protocol) bool { return p == v1.ProtocolTCP || p == v1.ProtocolUDP }

// KeyOf is the listener key of one of a Service port's endpoint selections.
func KeyOf(sp *proxy.ServicePort, policy string) engine.Key {
	return engine.Key{Name: sp.Name.String(), Protocol: sp.Protocol, Policy: policy}
}

func policy(local bool) string {
	if local {
		return PolicyLocal
	}
	return PolicyCluster
}

func endpointsOf(sp *proxy.ServicePort, policy string) []proxy.Endpoint {
	if policy == PolicyLocal {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

// Targets returns the listeners a snapshot needs, with what each forwards to: one per endpoint selection
// in use that has endpoints.
func Targets(snap *proxy.Snapshot) map[engine.Key]engine.Target {
	out := map[engine.Key]engine.Target{}
	for _, sp := range snap.Services {
		if !Supported(sp.Protocol) {
			continue
		}
		var policies []string
		if sp.ClusterIP.IsValid() {
			policies = append(policies, policy(sp.InternalPolicyLocal))
		}
		if sp.ExternallyAccessible() {
			policies = append(policies, policy(sp.ExternalPolicyLocal), PolicyCluster)
		}
		for _, p := range policies {
			eps := endpointsOf(sp, p)
			if len(eps) == 0 {
				continue
			}
			t := engine.Target{Affinity: time.Duration(sp.StickyMaxAgeSeconds) * time.Second}
			for _, ep := range eps {
				t.Endpoints = append(t.Endpoints, ep.AddrPort())
			}
			out[KeyOf(sp, p)] = t
		}
	}
	return out
}

// Config is what besides the snapshot shapes the rules.
type Config struct {
	proxy.Settings
}

// Render returns the iptables-restore payload (nat and filter tables) that rewrites our chains for snap.
// port gives each listener's port (0 when it has none: then the selection has no endpoints).
func Render(cfg Config, snap *proxy.Snapshot, port func(engine.Key) uint16) []byte {
	r := renderer{cfg: cfg, snap: snap, port: port}
	r.local, _ = xtables.LocalArgs(cfg.LocalDetector.For(cfg.Family, &snap.Node))
	cidrs, all := cfg.NodePortCIDRs(&snap.Node)
	if !all {
		r.nodePortDsts = cidrs
	}
	r.noLoopbackNodePorts = !cfg.LocalhostNodePorts && cfg.Family == v1.IPv4Protocol
	for _, sp := range snap.Sorted() {
		if Supported(sp.Protocol) {
			r.service(sp)
		}
	}
	var b bytes.Buffer
	b.WriteString("*nat\n")
	for _, c := range Chains()["nat"] {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, rules := range []*xtables.Lines{&r.npContainer, &r.npHost, &r.container, &r.host} {
		b.Write(rules.B)
	}
	b.WriteString("COMMIT\n*filter\n")
	fmt.Fprintf(&b, ":%s - [0:0]\n", ChainFilter)
	if len(r.filter.B) > 0 {
		// Connections redirected to a listener are not the filter's business: its NodePort rules match
		// any local address by port, and a listener's port may be one of them.
		fmt.Fprintf(&b, "-A %s -m conntrack --ctstate DNAT -j RETURN\n", ChainFilter)
	}
	b.Write(r.filter.B)
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

type renderer struct {
	cfg          Config
	snap         *proxy.Snapshot
	port         func(engine.Key) uint16
	local        []string       // matches traffic from a local pod; nil when it cannot be told apart
	nodePortDsts []netip.Prefix // nil: every local address (the jump's addrtype match)
	// noLoopbackNodePorts keeps NodePorts off 127.0.0.0/8 (iptables.localhostNodePorts false).
	noLoopbackNodePorts bool

	container, host, npContainer, npHost, filter xtables.Lines
}

func prefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

func (r *renderer) service(sp *proxy.ServicePort) {
	comment := []string{"-m", "comment", "--comment", strconv.Quote(sp.Name.String())}
	match := func(d []string, port int32) []string {
		return join(d, []string{"-p", strings.ToLower(string(sp.Protocol)), "--dport", strconv.Itoa(int(port))}, comment)
	}
	if sp.ClusterIP.IsValid() {
		p := policy(sp.InternalPolicyLocal)
		r.destination(sp, match([]string{"-d", prefix(sp.ClusterIP)}, sp.Port), p, p, false, nil)
	}
	if !sp.ExternallyAccessible() {
		return
	}
	// Under externalTrafficPolicy Local the node's own traffic (and local pods', below) goes to the
	// cluster selection, as upstream's rules send it.
	ext, host := policy(sp.ExternalPolicyLocal), PolicyCluster
	for _, ip := range sp.ExternalIPs {
		r.destination(sp, match([]string{"-d", prefix(ip)}, sp.Port), ext, host, false, nil)
	}
	var sources []string
	for _, pfx := range sp.LoadBalancerSourceRanges {
		sources = append(sources, pfx.Masked().String())
	}
	for _, ip := range sp.LoadBalancerIPs {
		r.destination(sp, match([]string{"-d", prefix(ip)}, sp.Port), ext, host, false, sources)
	}
	if sp.NodePort != 0 {
		if r.nodePortDsts == nil {
			r.destination(sp, match(nil, sp.NodePort), ext, host, true, nil)
		}
		for _, c := range r.nodePortDsts {
			r.destination(sp, match([]string{"-d", c.String()}, sp.NodePort), ext, host, true, nil)
		}
	}
}

// destination writes the rules of one destination of a Service port (args: its address, protocol and
// port match): traffic arriving from elsewhere goes to the listener of selection p, traffic from the node
// itself to that of hostPolicy; with sources, only traffic from them. Under externalTrafficPolicy Local
// (p local, hostPolicy cluster) local pods' traffic goes to the cluster selection too. What is not
// redirected is rejected when the port has no endpoints at all, dropped when it has none for p or when
// its source is not allowed.
func (r *renderer) destination(sp *proxy.ServicePort, args []string, p, hostPolicy string, nodePort bool, sources []string) {
	container, host := &r.container, &r.host
	if nodePort {
		container, host = &r.npContainer, &r.npHost
	}
	from := [][]string{nil}
	if len(sources) > 0 {
		from = nil
		for _, s := range sources {
			from = append(from, []string{"-s", s})
		}
	}
	if p != hostPolicy && r.local != nil && len(sources) == 0 {
		r.redirect(sp, hostPolicy, join(r.local, args), container)
	}
	for _, src := range from {
		r.redirect(sp, p, join(src, args), container)
	}
	hostArgs := args
	if nodePort && r.noLoopbackNodePorts {
		hostArgs = join([]string{"!", "-d", "127.0.0.0/8"}, args)
	}
	for _, src := range from {
		r.redirect(sp, hostPolicy, join(src, hostArgs), host)
	}

	filterArgs := args
	if nodePort {
		filterArgs = join([]string{"-m", "addrtype", "--dst-type", "LOCAL"}, args)
	}
	switch {
	case r.port(KeyOf(sp, p)) == 0 && !sp.HasAnyEndpoints:
		r.filter.Rule(ChainFilter).T(filterArgs...).T("-j", "REJECT").End()
	case r.port(KeyOf(sp, p)) == 0, len(sources) > 0:
		r.filter.Rule(ChainFilter).T(filterArgs...).T("-j", "DROP").End()
	}
}

func (r *renderer) redirect(sp *proxy.ServicePort, p string, args []string, buf *xtables.Lines) {
	port := r.port(KeyOf(sp, p))
	if port == 0 {
		return
	}
	chain := map[*xtables.Lines]string{&r.container: ChainPortalsContainer, &r.host: ChainPortalsHost,
		&r.npContainer: ChainNodePortContainer, &r.npHost: ChainNodePortHost}[buf]
	buf.Rule(chain).T(args...).T("-j", "REDIRECT", "--to-ports", strconv.Itoa(int(port))).End()
}

func join(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
