package inspect

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/iptables"
	"kube-proxy/rules/iptables/iptrace"
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/nftables"
	"kube-proxy/rules/nftables/nftrace"
)

// Drift is one difference between what the daemon would write and what the kernel holds.
type Drift struct {
	// Kind is "missing" (the daemon would write it, the kernel lacks it), "stale" (the kernel holds it,
	// the daemon would remove it) or "foreign" (another program's rule ahead of kube-proxy's in a hook:
	// not drift the daemon repairs, but it can take packets first).
	Kind string `json:"kind"`
	// Dataplane is "iptables (nft backend) IPv4", "nftables IPv6", ...
	Dataplane string `json:"dataplane"`
	// Service is the Service port the object belongs to, when its comments or name say ("" for shared
	// objects).
	Service string `json:"service,omitempty"`
	// Object is "chain nat/KUBE-SVC-...", "rule nat/KUBE-SERVICES", "element service-ips", ...
	Object string `json:"object"`
	// Detail is the rule or element itself.
	Detail string `json:"detail,omitempty"`
}

func (d Drift) String() string {
	s := fmt.Sprintf("%-7s %s", d.Kind, d.Object)
	if d.Service != "" {
		s += " [" + d.Service + "]"
	}
	if d.Detail != "" {
		s += ": " + d.Detail
	}
	return s
}

// kubeletChains are KUBE-* chains kubelet (not kube-proxy) may own; diff leaves them out.
var kubeletChains = map[string]bool{"KUBE-KUBELET-CANARY": true, "KUBE-FIREWALL": true, "KUBE-MARK-DROP": true}

// DiffIPTables compares mode iptables' rendered rules of one family with a backend's live rules.
func DiffIPTables(want *iptrace.Tables, live *XTables) []Drift {
	name := fmt.Sprintf("iptables (%s backend) %s", live.Backend, live.Family)
	var out []Drift
	for _, table := range tracedTables {
		wantChains := want.Chains(table)
		liveChains := live.Tables.Chains(table)
		for _, c := range wantChains {
			if builtinChains[c] {
				out = append(out, diffRules(name, table, c, jumpsOnly(want.Rules(table, c)), jumpsOnly(live.Tables.Rules(table, c)))...)
				continue
			}
			if !slices.Contains(liveChains, c) {
				out = append(out, Drift{Kind: "missing", Dataplane: name, Service: chainService(want.Rules(table, c)),
					Object: "chain " + table + "/" + c, Detail: fmt.Sprintf("%d rules", len(want.Rules(table, c)))})
				continue
			}
			out = append(out, diffRules(name, table, c, want.Rules(table, c), live.Tables.Rules(table, c))...)
		}
		for _, c := range liveChains {
			if builtinChains[c] || kubeletChains[c] || slices.Contains(wantChains, c) {
				continue
			}
			rules := live.Tables.Rules(table, c)
			out = append(out, Drift{Kind: "stale", Dataplane: name, Service: chainService(rules),
				Object: "chain " + table + "/" + c, Detail: fmt.Sprintf("%d rules", len(rules))})
		}
	}
	for _, f := range live.Foreign {
		if f.AheadOfUs {
			out = append(out, Drift{Kind: "foreign", Dataplane: name, Object: fmt.Sprintf("rule %s/%s #%d", f.Table, f.Chain, f.Position), Detail: f.Rule})
		}
	}
	return out
}

// jumpsOnly keeps the rules of a built-in chain that jump into kube-proxy's chains.
func jumpsOnly(rules []string) []string {
	var out []string
	for _, r := range rules {
		words, err := splitWords(r)
		if err == nil && ours(targetOf(words)) && !kubeletChains[targetOf(words)] {
			out = append(out, r)
		}
	}
	return out
}

// diffRules compares a chain's rules: as a multiset when only membership differs, and as an ordered list
// otherwise (order matters: the first match wins).
func diffRules(dataplane, table, chain string, want, have []string) []Drift {
	if slices.Equal(want, have) {
		return nil
	}
	svc := chainService(want)
	if svc == "" {
		svc = chainService(have)
	}
	obj := "rule " + table + "/" + chain
	var out []Drift
	missing, stale := multisetDiff(want, have)
	for _, r := range missing {
		out = append(out, Drift{Kind: "missing", Dataplane: dataplane, Service: svc, Object: obj, Detail: r})
	}
	for _, r := range stale {
		out = append(out, Drift{Kind: "stale", Dataplane: dataplane, Service: svc, Object: obj, Detail: r})
	}
	if len(out) == 0 { // same rules, another order
		out = append(out, Drift{Kind: "stale", Dataplane: dataplane, Service: svc, Object: "order of " + table + "/" + chain,
			Detail: "the same rules in another order: " + strings.Join(have, " | ")})
	}
	return out
}

// multisetDiff returns the items of want missing from have and the items of have not in want, counting
// repeats.
func multisetDiff(want, have []string) (missing, extra []string) {
	count := map[string]int{}
	for _, h := range have {
		count[h]++
	}
	for _, w := range want {
		if count[w] > 0 {
			count[w]--
			continue
		}
		missing = append(missing, w)
	}
	left := map[string]int{}
	for _, w := range want {
		left[w]++
	}
	for _, h := range have {
		if left[h] > 0 {
			left[h]--
			continue
		}
		extra = append(extra, h)
	}
	return missing, extra
}

// chainService names the Service port a chain's rules belong to, from their comments.
func chainService(rules []string) string {
	for _, r := range rules {
		if svc := iptables.ServiceOfComment(comment(r)); svc != "" {
			return svc
		}
	}
	return ""
}

// DiffNFTables compares mode nftables' rendered table of one family with the kernel's.
func DiffNFTables(want, live *nftrace.Tables, family v1.IPFamily) []Drift {
	fam := "ip"
	if family == v1.IPv6Protocol {
		fam = "ip6"
	}
	name := "nftables " + string(family)
	var out []Drift
	if live.Table(fam) == nil {
		return []Drift{{Kind: "missing", Dataplane: name, Object: "table " + fam + " kube-proxy"}}
	}
	wantChains, liveChains := want.Chains(fam), live.Chains(fam)
	// Sets that only rules pending deletion still name are not stale yet either.
	pendingSets := map[string]bool{}
	for _, c := range wantChains {
		svc := nftables.ServiceOfName(c)
		if !slices.Contains(liveChains, c) {
			out = append(out, Drift{Kind: "missing", Dataplane: name, Service: svc, Object: "chain " + c,
				Detail: fmt.Sprintf("%d rules", len(want.Rules(fam, c)))})
			continue
		}
		wantRules, liveRules := want.Rules(fam, c), live.Rules(fam, c)
		if old, ok := supersededRules(c, wantRules, liveRules); ok {
			for _, r := range old {
				for _, f := range strings.Fields(r) {
					if strings.HasPrefix(f, "@") {
						pendingSets[strings.TrimPrefix(f, "@")] = true
					}
				}
			}
			continue
		}
		for _, d := range diffRules(name, fam, c, wantRules, liveRules) {
			d.Object, d.Service = strings.Replace(d.Object, fam+"/", "", 1), svc
			out = append(out, d)
		}
	}
	for _, c := range liveChains {
		if !slices.Contains(wantChains, c) {
			out = append(out, Drift{Kind: "stale", Dataplane: name, Service: nftables.ServiceOfName(c), Object: "chain " + c,
				Detail: fmt.Sprintf("%d rules", len(live.Rules(fam, c)))})
		}
	}
	wantSets, liveSets := named(want.Sets(fam)), named(live.Sets(fam))
	for _, s := range wantSets {
		if !slices.Contains(liveSets, s) {
			out = append(out, Drift{Kind: "missing", Dataplane: name, Service: nftables.ServiceOfName(s), Object: "set " + s})
			continue
		}
		missing, stale := multisetDiff(want.Elements(fam, s), live.Elements(fam, s))
		for _, e := range missing {
			out = append(out, Drift{Kind: "missing", Dataplane: name, Service: elementService(e), Object: "element " + s, Detail: e})
		}
		for _, e := range stale {
			out = append(out, Drift{Kind: "stale", Dataplane: name, Service: elementService(e), Object: "element " + s, Detail: e})
		}
	}
	for _, s := range liveSets {
		if !slices.Contains(wantSets, s) && !pendingSets[s] {
			out = append(out, Drift{Kind: "stale", Dataplane: name, Service: nftables.ServiceOfName(s), Object: "set " + s})
		}
	}
	return out
}

// supersededRules recognises a per-Service chain in the middle of a change: the daemon inserts a chain's
// new rules ahead of its old ones and deletes the old ones a second later (rules/nftables: deleting a
// rule that binds a map at once could make a packet in flight miss its DNAT). When live is the wanted
// rules followed by others, and the last wanted rule ends every packet's way through the chain (a DNAT or
// a numgen verdict map behind nothing but the protocol match), the others are unreachable: they are
// returned, and the chain is not drift.
func supersededRules(chain string, want, live []string) ([]string, bool) {
	if !strings.HasPrefix(chain, "service-") && !strings.HasPrefix(chain, "local-") {
		return nil, false
	}
	if len(want) == 0 || len(live) <= len(want) || !slices.Equal(live[:len(want)], want) {
		return nil, false
	}
	last := strings.Fields(want[len(want)-1])
	if len(last) >= 3 && last[0] == "meta" && last[1] == "l4proto" {
		last = last[3:]
	}
	if len(last) == 0 || (last[0] != "dnat" && last[0] != "numgen") {
		return nil, false
	}
	return live[len(want):], true
}

// named drops anonymous sets (their contents are part of the rules that use them; their names are the
// writer's).
func named(sets []string) []string {
	var out []string
	for _, s := range sets {
		if !strings.HasPrefix(s, "__") {
			out = append(out, s)
		}
	}
	return out
}

// elementService names the Service port an element points to (its goto target or its comment).
func elementService(e string) string {
	if i := strings.LastIndex(e, "goto "); i >= 0 {
		if s := nftables.ServiceOfName(strings.Fields(e[i+5:])[0]); s != "" {
			return s
		}
	}
	if c := comment(e); c != "" {
		return c
	}
	return ""
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// DiffIPVS compares mode ipvs' rendered ipsets, virtual servers and kube-ipvs0 addresses of one family with
// the kernel's (its iptables rules go through DiffIPTables). Real servers of weight 0 are being drained
// (terminating endpoints keep their connections): they are not drift.
func DiffIPVS(want *ipvs.Desired, live *Live, family v1.IPFamily) []Drift {
	name := "ipvs " + string(family)
	var out []Drift
	liveSets := map[string]ipSet{}
	for _, s := range live.IPSets {
		if s.family == family {
			liveSets[s.name] = s
		}
	}
	wanted := map[string]bool{}
	for _, s := range want.Sets {
		wanted[s.Name] = true
		have, ok := liveSets[s.Name]
		if !ok {
			out = append(out, Drift{Kind: "missing", Dataplane: name, Object: "ipset " + s.Name, Detail: fmt.Sprintf("%d members", len(s.Members))})
			continue
		}
		missing, stale := multisetDiff(s.Members, have.members)
		for _, m := range missing {
			out = append(out, Drift{Kind: "missing", Dataplane: name, Object: "ipset " + s.Name, Detail: m})
		}
		for _, m := range stale {
			out = append(out, Drift{Kind: "stale", Dataplane: name, Object: "ipset " + s.Name, Detail: m})
		}
	}
	for n := range liveSets {
		if ours(n) && !wanted[n] {
			out = append(out, Drift{Kind: "stale", Dataplane: name, Object: "ipset " + n})
		}
	}
	haveVS := map[string]ipvsService{}
	for _, s := range live.IPVS {
		if (family == v1.IPv6Protocol) == s.Addr.Is6() {
			haveVS[s.Key] = s
		}
	}
	wantVS := map[string]bool{}
	for _, w := range want.VirtualServers {
		wantVS[w.Key] = true
		have, ok := haveVS[w.Key]
		if !ok {
			out = append(out, Drift{Kind: "missing", Dataplane: name, Object: "virtual server " + w.Key, Detail: strings.Join(w.Reals, " ")})
			continue
		}
		if have.Scheduler != w.Scheduler || have.Timeout != w.Timeout {
			out = append(out, Drift{Kind: "stale", Dataplane: name, Object: "virtual server " + w.Key,
				Detail: fmt.Sprintf("scheduler %s persistence %ds, want %s %ds", have.Scheduler, have.Timeout, w.Scheduler, w.Timeout)})
		}
		var reals []string
		for _, r := range have.Reals {
			if r.Weight > 0 {
				reals = append(reals, r.Addr.String())
			}
		}
		missing, stale := multisetDiff(w.Reals, reals)
		for _, r := range missing {
			out = append(out, Drift{Kind: "missing", Dataplane: name, Object: "real server of " + w.Key, Detail: r})
		}
		for _, r := range stale {
			out = append(out, Drift{Kind: "stale", Dataplane: name, Object: "real server of " + w.Key, Detail: r})
		}
	}
	for k := range haveVS {
		if !wantVS[k] {
			out = append(out, Drift{Kind: "stale", Dataplane: name, Object: "virtual server " + k})
		}
	}
	var binds, bound []string
	for _, a := range want.Binds {
		binds = append(binds, a.String())
	}
	for _, a := range live.IfAddrs[ipvs.DummyLink] {
		if (family == v1.IPv6Protocol) == a.Is6() && !a.IsLinkLocalUnicast() {
			bound = append(bound, a.String())
		}
	}
	missing, stale := multisetDiff(binds, bound)
	for _, a := range missing {
		out = append(out, Drift{Kind: "missing", Dataplane: name, Object: "address on " + ipvs.DummyLink, Detail: a})
	}
	for _, a := range stale {
		out = append(out, Drift{Kind: "stale", Dataplane: name, Object: "address on " + ipvs.DummyLink, Detail: a})
	}
	return out
}
