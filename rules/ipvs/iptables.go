package ipvs

import (
	"bytes"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/xtables"
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
	w := &ruleWriter{cfg: cfg, in: in, mark: cfg.mark()}
	w.writeLoopbackReturn()
	w.writeSetRules()
	w.writeClusterIPMasquerade()
	w.writeExternalIPRules()
	w.writeChainDefaults()
	w.writeNoLocalDrops()
	w.writeNoNodeAccess()
	w.writeAccepts()
	w.writeIPVSFilter()
	w.writePostrouting()
	return w.payload()
}

// ruleWriter writes the rules of renderRules into the nat and filter tables. Its steps append to each
// table in the order of the payload.
type ruleWriter struct {
	cfg         *Config
	in          *ruleInputs
	mark        string
	nat, filter xtables.Lines
}

// name is the family's name of a set.
func (w *ruleWriter) name(id setID) string { return setName(id, w.cfg.Family) }

// comment is a set's comment, quoted.
func (w *ruleWriter) comment(id setID) string { return strconv.Quote(setDefs[id].comment) }

// setRule writes a rule to chain in b that matches set id with the direction flags dirs, behind the set's
// comment, followed by rest.
func (w *ruleWriter) setRule(b *xtables.Lines, chain string, id setID, dirs string, rest ...string) {
	var buf [24]string // on the stack: the rules are written, not kept
	args := append(buf[:0], "-m", "comment", "--comment", w.comment(id), "-m", "set", "--match-set", w.name(id), dirs)
	b.Add(chain, append(args, rest...)...)
}

// writeLoopbackReturn writes the rule that leaves traffic from a loopback address alone.
func (w *ruleWriter) writeLoopbackReturn() {
	loopback := "127.0.0.0/8"
	if w.cfg.Family == v1.IPv6Protocol {
		loopback = "::1/128"
	}
	w.nat.Add(chainServices, "-s", loopback, "-j", "RETURN")
}

// writeSetRules writes setRules, for the sets that have members.
func (w *ruleWriter) writeSetRules() {
	for _, r := range setRules {
		if !w.in.nonEmpty[r.set] {
			continue
		}
		b := &w.nat
		if r.table == "filter" {
			b = &w.filter
		}
		args := []string{}
		if r.protoArgs != "" {
			args = append(args, "-p", r.protoArgs)
		}
		args = append(args, "-m", "comment", "--comment", w.comment(r.set), "-m", "set", "--match-set", w.name(r.set), r.match, "-j", r.target)
		b.Add(r.chain, args...)
	}
}

// writeClusterIPMasquerade writes the rule that marks traffic to cluster IPs for masquerading: all of it
// with masqueradeAll, else what does not come from a local pod.
func (w *ruleWriter) writeClusterIPMasquerade() {
	if !w.in.nonEmpty[setClusterIP] {
		return
	}
	switch notLocal := w.cfg.notLocalArgs(w.in.node); {
	case w.cfg.MasqueradeAll:
		w.setRule(&w.nat, chainServices, setClusterIP, "dst,dst", "-j", chainMarkMasq)
	case notLocal != nil:
		// Traffic to a cluster IP from outside the pod network may be answered by a pod on another
		// node: masquerade it so the reply comes back here.
		w.setRule(&w.nat, chainServices, setClusterIP, "dst,dst", append(notLocal, "-j", chainMarkMasq)...)
	default:
		// Without a way to tell pod traffic, masquerade what the node sends from a service address
		// (kube-ipvs0 holds them all, so the kernel may pick one as the source).
		w.setRule(&w.nat, chainServices, setClusterIP, "src,dst", "-j", chainMarkMasq)
	}
}

// writeExternalIPRules writes the rules of external IPs: Cluster-policy traffic to them is masqueraded,
// and traffic from off the node or to the node's own addresses is accepted.
func (w *ruleWriter) writeExternalIPRules() {
	if w.in.nonEmpty[setExternalIP] {
		w.setRule(&w.nat, chainServices, setExternalIP, "dst,dst", "-j", chainMarkMasq)
		w.acceptExternal(setExternalIP)
	}
	if w.in.nonEmpty[setExternalIPLocal] {
		w.acceptExternal(setExternalIPLocal)
	}
}

// acceptExternal writes the accept rules of the external IPs in set id.
func (w *ruleWriter) acceptExternal(id setID) {
	// Traffic from off the node (neither bridged from a container nor sent locally) is accepted...
	w.setRule(&w.nat, chainServices, id, "dst,dst", "-m", "physdev", "!", "--physdev-is-in",
		"-m", "addrtype", "!", "--src-type", "LOCAL", "-j", "ACCEPT")
	// ...and so is traffic to an external IP that is one of the node's own addresses.
	w.setRule(&w.nat, chainServices, id, "dst,dst", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "ACCEPT")
}

// writeChainDefaults writes what becomes of traffic the set rules did not match: traffic to a local
// address goes on to the node ports, load-balancer traffic is masqueraded, and traffic outside the source
// ranges is dropped.
func (w *ruleWriter) writeChainDefaults() {
	w.nat.Add(chainServices, "-m", "addrtype", "--dst-type", "LOCAL", "-j", chainNodePort)
	w.nat.Add(chainLoadBalancer, "-j", chainMarkMasq)
	w.filter.Add(chainSourceRangesFirewall, "-j", "DROP")
}

// writeNoLocalDrops writes the drops of Local traffic policies without local endpoints (ours; upstream
// has no equivalent): iptables mode drops such traffic. Cluster IPs drop for everyone; external addresses
// only for traffic that comes from neither the node nor (when it can be told) a local pod, which still
// reaches the Service.
func (w *ruleWriter) writeNoLocalDrops() {
	if w.in.nonEmpty[setInternalNoLocal] {
		w.setRule(&w.filter, chainProxyFirewall, setInternalNoLocal, "dst,dst", "-j", "DROP")
	}
	if w.in.nonEmpty[setExternalNoLocal] {
		w.setRule(&w.filter, chainProxyFirewall, setExternalNoLocal, "dst,dst",
			append(w.cfg.notLocalArgs(w.in.node), "-m", "addrtype", "!", "--src-type", "LOCAL", "-j", "DROP")...)
	}
}

// writeNoNodeAccess writes the drops that keep the node from load balancers whose source ranges exclude
// it.
func (w *ruleWriter) writeNoNodeAccess() {
	for _, e := range w.in.noNodeAccess {
		ip := e.ip.String()
		w.filter.Add(chainIPVSOutFilter, "-s", ip, "-m", "ipvs", "--vaddr", ip, "--vproto", e.proto.String(),
			"--vport", strconv.Itoa(int(e.port)), "-j", "DROP")
	}
}

// writeAccepts writes the accept rules of what IPVS serves, in case other rules would block it: traffic to
// cluster and load-balancer IPs, marked and established forwarded traffic, and health-check node ports.
func (w *ruleWriter) writeAccepts() {
	if w.in.nonEmpty[setClusterIP] {
		w.nat.Add(chainServices, "-m", "set", "--match-set", w.name(setClusterIP), "dst,dst", "-j", "ACCEPT")
	}
	if w.in.nonEmpty[setLoadBalancer] {
		w.nat.Add(chainServices, "-m", "set", "--match-set", w.name(setLoadBalancer), "dst,dst", "-j", "ACCEPT")
	}
	w.filter.Add(chainForward, "-m", "comment", "--comment", `"kubernetes forwarding rules"`,
		"-m", "mark", "--mark", w.mark+"/"+w.mark, "-j", "ACCEPT")
	w.filter.Add(chainForward, "-m", "comment", "--comment", `"kubernetes forwarding conntrack rule"`,
		"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	w.setRule(&w.filter, chainNodePort, setHealthCheckNodePort, "dst", "-j", "ACCEPT")
}

// writeIPVSFilter writes the rules by which service addresses answer only on their service ports: new
// connections to anything else on them are rejected (they are local addresses, so host services would
// otherwise be reachable through them).
func (w *ruleWriter) writeIPVSFilter() {
	for _, id := range []setID{setLoadBalancer, setClusterIP, setExternalIP, setExternalIPLocal} {
		w.filter.Add(chainIPVSFilter, "-m", "set", "--match-set", w.name(id), "dst,dst", "-j", "RETURN")
	}
	w.filter.Add(chainIPVSFilter, "-m", "set", "--match-set", w.name(setHealthCheckNodePort), "dst", "-j", "RETURN")
	w.filter.Add(chainIPVSFilter, "-m", "conntrack", "--ctstate", "NEW",
		"-m", "set", "--match-set", w.name(setIPVSIPs), "dst", "-j", "REJECT")
}

// writePostrouting writes the masquerading of marked traffic and the rule that marks it.
func (w *ruleWriter) writePostrouting() {
	mark := w.mark
	w.nat.Add(chainPostrouting, "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	w.nat.Add(chainPostrouting, "-j", "MARK", "--xor-mark", mark)
	w.nat.Add(chainPostrouting, "-m", "comment", "--comment", `"kubernetes service traffic requiring SNAT"`,
		"-j", "MASQUERADE", "--random-fully")
	w.nat.Add(chainMarkMasq, "-j", "MARK", "--or-mark", mark)
}

// payload assembles the tables: each declares its chains, holds its rules and commits.
func (w *ruleWriter) payload() []byte {
	var out bytes.Buffer
	for _, table := range []string{"nat", "filter"} {
		out.WriteString("*" + table + "\n")
		for _, c := range ownChains {
			if c.table == table {
				out.WriteString(":" + c.chain + " - [0:0]\n")
			}
		}
		if table == "nat" {
			out.Write(w.nat.B)
		} else {
			out.Write(w.filter.B)
		}
		out.WriteString("COMMIT\n")
	}
	return out.Bytes()
}

// withJumps returns payload with the jump rules inserted at the top of their built-in chains, each table's
// in order before its COMMIT (so the last one ends up first, as when they are prepended one by one).
func withJumps(payload []byte, js []xtables.JumpRule) []byte {
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
				if j.Table == table {
					out.WriteString("-I " + j.Chain + " 1 -m comment --comment " + strconv.Quote(j.Comment) + " -j " + j.Target + "\n")
				}
			}
		}
		out.WriteString(line)
	}
	return out.Bytes()
}

// hasJump reports whether iptables-save output holds a jump rule.
func hasJump(save string, j xtables.JumpRule) bool {
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "-A "+j.Chain+" ") && strings.HasSuffix(l, "-j "+j.Target) && strings.Contains(l, j.Comment) {
			return true
		}
	}
	return false
}
