package ipvs

import (
	"bytes"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
)

// setRule is a rule that jumps when a set matches, written only while the set has members (as upstream).
type setRule struct {
	set       setID
	table     string
	chain     string
	target    string
	match     string // the set match's direction flags
	protoArgs string // "-p tcp" etc., or ""
}

// setRules are upstream's set-driven rules, in upstream's order. The Local sets come before their
// Cluster counterparts so that Local traffic returns before it is marked for masquerading.
var setRules = []setRule{
	{setLoopBack, "nat", chainPostrouting, "MASQUERADE", "dst,dst,src", ""},
	{setLoadBalancer, "nat", chainServices, chainLoadBalancer, "dst,dst", ""},
	{setLoadBalancerLocal, "nat", chainLoadBalancer, "RETURN", "dst,dst", ""},
	{setNodePortLocalTCP, "nat", chainNodePort, "RETURN", "dst", "tcp"},
	{setNodePortTCP, "nat", chainNodePort, chainMarkMasq, "dst", "tcp"},
	{setNodePortLocalUDP, "nat", chainNodePort, "RETURN", "dst", "udp"},
	{setNodePortUDP, "nat", chainNodePort, chainMarkMasq, "dst", "udp"},
	{setNodePortLocalSCTP, "nat", chainNodePort, "RETURN", "dst,dst", "sctp"},
	{setNodePortSCTP, "nat", chainNodePort, chainMarkMasq, "dst,dst", "sctp"},
	{setLoadBalancerFW, "filter", chainProxyFirewall, chainSourceRangesFirewall, "dst,dst", ""},
	{setLoadBalancerSourceCIDR, "filter", chainSourceRangesFirewall, "RETURN", "dst,dst,src", ""},
	{setLoadBalancerSourceIP, "filter", chainSourceRangesFirewall, "RETURN", "dst,dst,src", ""},
}

// ruleInputs is everything the iptables ruleset depends on besides the configuration.
type ruleInputs struct {
	nonEmpty     [numSets]bool
	noNodeAccess []entry // sorted
	node         *proxy.Node
}

// renderRules writes the iptables-restore payload (nat and filter tables) of IPVS mode. Every chain it
// declares is flushed and rewritten when the payload is restored with --noflush.
func renderRules(cfg *Config, in *ruleInputs) []byte {
	var nat, filter rulesBuf
	name := func(id setID) string { return setName(id, cfg.Family) }
	comment := func(id setID) string { return strconv.Quote(setDefs[id].comment) }
	mark := cfg.mark()

	loopback := "127.0.0.0/8"
	if cfg.Family == v1.IPv6Protocol {
		loopback = "::1/128"
	}
	nat.rule(chainServices, "-s", loopback, "-j", "RETURN")

	for _, r := range setRules {
		if !in.nonEmpty[r.set] {
			continue
		}
		b := &nat
		if r.table == "filter" {
			b = &filter
		}
		args := []string{}
		if r.protoArgs != "" {
			args = append(args, "-p", r.protoArgs)
		}
		args = append(args, "-m", "comment", "--comment", comment(r.set), "-m", "set", "--match-set", name(r.set), r.match, "-j", r.target)
		b.rule(r.chain, args...)
	}

	if in.nonEmpty[setClusterIP] {
		args := []string{"-m", "comment", "--comment", comment(setClusterIP), "-m", "set", "--match-set", name(setClusterIP)}
		switch notLocal := cfg.notLocalArgs(in.node); {
		case cfg.MasqueradeAll:
			nat.rule(chainServices, append(args, "dst,dst", "-j", chainMarkMasq)...)
		case notLocal != nil:
			// Traffic to a cluster IP from outside the pod network may be answered by a pod on another
			// node: masquerade it so the reply comes back here.
			nat.rule(chainServices, append(append(args, "dst,dst"), append(notLocal, "-j", chainMarkMasq)...)...)
		default:
			// Without a way to tell pod traffic, masquerade what the node sends from a service address
			// (kube-ipvs0 holds them all, so the kernel may pick one as the source).
			nat.rule(chainServices, append(args, "src,dst", "-j", chainMarkMasq)...)
		}
	}

	externalAccept := func(args []string) {
		// Traffic from off the node (neither bridged from a container nor sent locally) is accepted...
		nat.rule(chainServices, append(append([]string{}, args...), "-m", "physdev", "!", "--physdev-is-in",
			"-m", "addrtype", "!", "--src-type", "LOCAL", "-j", "ACCEPT")...)
		// ...and so is traffic to an external IP that is one of the node's own addresses.
		nat.rule(chainServices, append(append([]string{}, args...), "-m", "addrtype", "--dst-type", "LOCAL", "-j", "ACCEPT")...)
	}
	if in.nonEmpty[setExternalIP] {
		args := []string{"-m", "comment", "--comment", comment(setExternalIP), "-m", "set", "--match-set", name(setExternalIP), "dst,dst"}
		nat.rule(chainServices, append(append([]string{}, args...), "-j", chainMarkMasq)...)
		externalAccept(args)
	}
	if in.nonEmpty[setExternalIPLocal] {
		externalAccept([]string{"-m", "comment", "--comment", comment(setExternalIPLocal), "-m", "set", "--match-set", name(setExternalIPLocal), "dst,dst"})
	}

	nat.rule(chainServices, "-m", "addrtype", "--dst-type", "LOCAL", "-j", chainNodePort)
	nat.rule(chainLoadBalancer, "-j", chainMarkMasq)
	filter.rule(chainSourceRangesFirewall, "-j", "DROP")

	// Local traffic policies without local endpoints (ours; upstream has no equivalent): iptables mode
	// drops such traffic. Cluster IPs drop for everyone; external addresses only for traffic that comes
	// from neither the node nor (when it can be told) a local pod, which still reaches the Service.
	if in.nonEmpty[setInternalNoLocal] {
		filter.rule(chainProxyFirewall, "-m", "comment", "--comment", comment(setInternalNoLocal),
			"-m", "set", "--match-set", name(setInternalNoLocal), "dst,dst", "-j", "DROP")
	}
	if in.nonEmpty[setExternalNoLocal] {
		args := []string{"-m", "comment", "--comment", comment(setExternalNoLocal),
			"-m", "set", "--match-set", name(setExternalNoLocal), "dst,dst"}
		args = append(args, cfg.notLocalArgs(in.node)...)
		filter.rule(chainProxyFirewall, append(args, "-m", "addrtype", "!", "--src-type", "LOCAL", "-j", "DROP")...)
	}

	// The node must not reach load balancers whose source ranges exclude it.
	for _, e := range in.noNodeAccess {
		ip := e.ip.String()
		filter.rule(chainIPVSOutFilter, "-s", ip, "-m", "ipvs", "--vaddr", ip, "--vproto", e.proto.String(),
			"--vport", strconv.Itoa(int(e.port)), "-j", "DROP")
	}

	// Accept what IPVS serves, in case other rules would block it.
	if in.nonEmpty[setClusterIP] {
		nat.rule(chainServices, "-m", "set", "--match-set", name(setClusterIP), "dst,dst", "-j", "ACCEPT")
	}
	if in.nonEmpty[setLoadBalancer] {
		nat.rule(chainServices, "-m", "set", "--match-set", name(setLoadBalancer), "dst,dst", "-j", "ACCEPT")
	}

	filter.rule(chainForward, "-m", "comment", "--comment", `"kubernetes forwarding rules"`,
		"-m", "mark", "--mark", mark+"/"+mark, "-j", "ACCEPT")
	filter.rule(chainForward, "-m", "comment", "--comment", `"kubernetes forwarding conntrack rule"`,
		"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	filter.rule(chainNodePort, "-m", "comment", "--comment", comment(setHealthCheckNodePort),
		"-m", "set", "--match-set", name(setHealthCheckNodePort), "dst", "-j", "ACCEPT")

	// Service addresses answer only on their service ports: reject new connections to anything else on
	// them (they are local addresses, so host services would otherwise be reachable through them).
	for _, id := range []setID{setLoadBalancer, setClusterIP, setExternalIP, setExternalIPLocal} {
		filter.rule(chainIPVSFilter, "-m", "set", "--match-set", name(id), "dst,dst", "-j", "RETURN")
	}
	filter.rule(chainIPVSFilter, "-m", "set", "--match-set", name(setHealthCheckNodePort), "dst", "-j", "RETURN")
	filter.rule(chainIPVSFilter, "-m", "conntrack", "--ctstate", "NEW",
		"-m", "set", "--match-set", name(setIPVSIPs), "dst", "-j", "REJECT")

	nat.rule(chainPostrouting, "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	nat.rule(chainPostrouting, "-j", "MARK", "--xor-mark", mark)
	nat.rule(chainPostrouting, "-m", "comment", "--comment", `"kubernetes service traffic requiring SNAT"`,
		"-j", "MASQUERADE", "--random-fully")
	nat.rule(chainMarkMasq, "-j", "MARK", "--or-mark", mark)

	var out bytes.Buffer
	for _, table := range []string{"nat", "filter"} {
		out.WriteString("*" + table + "\n")
		for _, c := range ownChains {
			if c.table == table {
				out.WriteString(":" + c.chain + " - [0:0]\n")
			}
		}
		if table == "nat" {
			out.Write(nat.b.Bytes())
		} else {
			out.Write(filter.b.Bytes())
		}
		out.WriteString("COMMIT\n")
	}
	return out.Bytes()
}

// withJumps returns payload with the jump rules inserted at the top of their built-in chains, each table's
// in order before its COMMIT (so the last one ends up first, as when they are prepended one by one).
func withJumps(payload []byte, js []jumpRule) []byte {
	if len(js) == 0 {
		return payload
	}
	var out bytes.Buffer
	table := ""
	for _, line := range strings.SplitAfter(string(payload), "\n") {
		if strings.HasPrefix(line, "*") {
			table = strings.TrimSpace(line[1:])
		}
		if strings.TrimSpace(line) == "COMMIT" {
			for _, j := range js {
				if j.table == table {
					out.WriteString("-I " + j.chain + " 1 -m comment --comment " + strconv.Quote(j.comment) + " -j " + j.target + "\n")
				}
			}
		}
		out.WriteString(line)
	}
	return out.Bytes()
}

// hasJump reports whether iptables-save output holds a jump rule.
func hasJump(save string, j jumpRule) bool {
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "-A "+j.chain+" ") && strings.HasSuffix(l, "-j "+j.target) && strings.Contains(l, j.comment) {
			return true
		}
	}
	return false
}

type rulesBuf struct{ b bytes.Buffer }

func (r *rulesBuf) rule(chain string, args ...string) {
	r.b.WriteString("-A " + chain + " " + strings.Join(args, " ") + "\n")
}
