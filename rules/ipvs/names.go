package ipvs

import (
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/xtables"
)

// DummyLink is the dummy interface the Service addresses are bound to, so that the kernel treats them as
// local and IPVS (which hooks LOCAL_IN) sees the packets.
const DummyLink = "kube-ipvs0"

// Chains of IPVS mode, as upstream names them. KUBE-SERVICES, KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-FORWARD
// and KUBE-PROXY-FIREWALL share their names with iptables mode; the others are IPVS mode's own.
const (
	chainServices             = "KUBE-SERVICES"
	chainPostrouting          = "KUBE-POSTROUTING"
	chainNodePort             = "KUBE-NODE-PORT"
	chainLoadBalancer         = "KUBE-LOAD-BALANCER"
	chainMarkMasq             = "KUBE-MARK-MASQ"
	chainForward              = "KUBE-FORWARD"
	chainProxyFirewall        = "KUBE-PROXY-FIREWALL"
	chainSourceRangesFirewall = "KUBE-SOURCE-RANGES-FIREWALL"
	chainIPVSFilter           = "KUBE-IPVS-FILTER"
	chainIPVSOutFilter        = "KUBE-IPVS-OUT-FILTER"
)

// tableChain names a chain of one table.
type tableChain struct{ table, chain string }

// ownChains are the chains the ruleset declares (and so flushes and rewrites on every restore), in the
// order they are declared.
var ownChains = []tableChain{
	{"nat", chainServices},
	{"nat", chainPostrouting},
	{"nat", chainNodePort},
	{"nat", chainLoadBalancer},
	{"nat", chainMarkMasq},
	{"filter", chainForward},
	{"filter", chainNodePort},
	{"filter", chainProxyFirewall},
	{"filter", chainSourceRangesFirewall},
	{"filter", chainIPVSFilter},
	{"filter", chainIPVSOutFilter},
}

// jumpRules are mode ipvs' rules from built-in chains into its own, each "-m comment --comment Comment
// -j Target". They are ensured by prepending in this order, as upstream does, so the last one ends up
// first.
var jumpRules = []xtables.JumpRule{
	{Table: "nat", Chain: "OUTPUT", Target: chainServices, Comment: "kubernetes service portals"},
	{Table: "nat", Chain: "PREROUTING", Target: chainServices, Comment: "kubernetes service portals"},
	{Table: "nat", Chain: "POSTROUTING", Target: chainPostrouting, Comment: "kubernetes postrouting rules"},
	{Table: "filter", Chain: "FORWARD", Target: chainForward, Comment: "kubernetes forwarding rules"},
	{Table: "filter", Chain: "INPUT", Target: chainNodePort, Comment: "kubernetes health check rules"},
	{Table: "filter", Chain: "INPUT", Target: chainProxyFirewall, Comment: "kube-proxy firewall rules"},
	{Table: "filter", Chain: "FORWARD", Target: chainProxyFirewall, Comment: "kube-proxy firewall rules"},
	{Table: "filter", Chain: "INPUT", Target: chainIPVSFilter, Comment: "kubernetes ipvs access filter"},
	{Table: "filter", Chain: "OUTPUT", Target: chainIPVSOutFilter, Comment: "kubernetes ipvs access filter"},
}

// setID indexes setDefs.
type setID uint8

// The ipsets of IPVS mode. All but the last two are upstream's; setInternalNoLocal and setExternalNoLocal
// are ours (see the package documentation: they give Local traffic policies without local endpoints the
// DROP that iptables mode gives them).
const (
	setLoopBack setID = iota
	setClusterIP
	setExternalIP
	setExternalIPLocal
	setLoadBalancer
	setLoadBalancerFW
	setLoadBalancerLocal
	setLoadBalancerSourceIP
	setLoadBalancerSourceCIDR
	setNodePortTCP
	setNodePortLocalTCP
	setNodePortUDP
	setNodePortLocalUDP
	setNodePortSCTP
	setNodePortLocalSCTP
	setHealthCheckNodePort
	setIPVSIPs
	setInternalNoLocal
	setExternalNoLocal
	numSets
)

// Set types, as the kernel names them.
const (
	typeHashIP        = "hash:ip"
	typeHashIPPort    = "hash:ip,port"
	typeHashIPPortIP  = "hash:ip,port,ip"
	typeHashIPPortNet = "hash:ip,port,net"
	typeBitmapPort    = "bitmap:port"
)

// setDef describes one ipset: its IPv4 name (IPv6 sets are renamed by setName), type and the comment the
// iptables rules matching it carry.
type setDef struct {
	name, typ, comment string
}

var setDefs = [numSets]setDef{
	setLoopBack:               {"KUBE-LOOP-BACK", typeHashIPPortIP, "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"},
	setClusterIP:              {"KUBE-CLUSTER-IP", typeHashIPPort, "Kubernetes service cluster ip + port for masquerade purpose"},
	setExternalIP:             {"KUBE-EXTERNAL-IP", typeHashIPPort, "Kubernetes service external ip + port for masquerade and filter purpose"},
	setExternalIPLocal:        {"KUBE-EXTERNAL-IP-LOCAL", typeHashIPPort, "Kubernetes service external ip + port with externalTrafficPolicy=local"},
	setLoadBalancer:           {"KUBE-LOAD-BALANCER", typeHashIPPort, "Kubernetes service lb portal"},
	setLoadBalancerFW:         {"KUBE-LOAD-BALANCER-FW", typeHashIPPort, "Kubernetes service load balancer ip + port for load balancer with sourceRange"},
	setLoadBalancerLocal:      {"KUBE-LOAD-BALANCER-LOCAL", typeHashIPPort, "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"},
	setLoadBalancerSourceIP:   {"KUBE-LOAD-BALANCER-SOURCE-IP", typeHashIPPortIP, "Kubernetes service load balancer ip + port + source IP for packet filter purpose"},
	setLoadBalancerSourceCIDR: {"KUBE-LOAD-BALANCER-SOURCE-CIDR", typeHashIPPortNet, "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"},
	setNodePortTCP:            {"KUBE-NODE-PORT-TCP", typeBitmapPort, "Kubernetes nodeport TCP port for masquerade purpose"},
	setNodePortLocalTCP:       {"KUBE-NODE-PORT-LOCAL-TCP", typeBitmapPort, "Kubernetes nodeport TCP port with externalTrafficPolicy=local"},
	setNodePortUDP:            {"KUBE-NODE-PORT-UDP", typeBitmapPort, "Kubernetes nodeport UDP port for masquerade purpose"},
	setNodePortLocalUDP:       {"KUBE-NODE-PORT-LOCAL-UDP", typeBitmapPort, "Kubernetes nodeport UDP port with externalTrafficPolicy=local"},
	setNodePortSCTP:           {"KUBE-NODE-PORT-SCTP-HASH", typeHashIPPort, "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"},
	setNodePortLocalSCTP:      {"KUBE-NODE-PORT-LOCAL-SCTP-HASH", typeHashIPPort, "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"},
	setHealthCheckNodePort:    {"KUBE-HEALTH-CHECK-NODE-PORT", typeBitmapPort, "Kubernetes health check node port"},
	setIPVSIPs:                {"KUBE-IPVS-IPS", typeHashIP, "Addresses on the ipvs interface"},
	setInternalNoLocal:        {"KUBE-INTERNAL-NO-LOCAL", typeHashIPPort, "Kubernetes service ip + port with internalTrafficPolicy=local and no local endpoints"},
	setExternalNoLocal:        {"KUBE-EXTERNAL-NO-LOCAL", typeHashIPPort, "Kubernetes service external ip + port with externalTrafficPolicy=local and no local endpoints"},
}

// maxSetName is the kernel's limit on ipset names (IPSET_MAXNAMELEN - 1).
const maxSetName = 31

// setName returns the kernel name of a set for a family: IPv6 sets replace the "KUBE-" prefix with
// "KUBE-6-" (cut to 31 characters), as upstream does so both families' sets can coexist.
func setName(id setID, family v1.IPFamily) string {
	return familySetName(setDefs[id].name, family)
}

func familySetName(name string, family v1.IPFamily) string {
	if family != v1.IPv6Protocol {
		return name
	}
	name = "KUBE-6-" + strings.TrimPrefix(name, "KUBE-")
	if len(name) > maxSetName {
		name = name[:maxSetName]
	}
	return name
}

// allSetNames returns the names of every set of both families (for cleanup), upstream's and ours.
func allSetNames() []string {
	var out []string
	for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for id := setID(0); id < numSets; id++ {
			out = append(out, setName(id, f))
		}
	}
	return out
}
