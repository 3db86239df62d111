package inspect

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/internal/traceresult"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/iptables/iptrace"
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/nftables"
	"kube-proxy/rules/userspace"
	"kube-proxy/rules/xtables"
)

// modeInspector is what inspect knows of one mode: how to render what it writes, how to compare that
// with the live node, what it needs from the kernel and tools, and (from the mode's package) what its own
// rules mean to trace.
type modeInspector struct {
	// render adds to d what the mode writes for one family's snapshot into an empty node whose addresses
	// are addrs and whose nfacct counters are counters.
	render func(d *Desired, cfg *config.KubeProxyConfiguration, snap *proxy.Snapshot, addrs []netip.Addr, counters iptables.NFAcct) error
	// diff adds to rep the drift between want and the live node; an error ends diff with exit 1.
	diff func(ctx context.Context, env *Env, want *Desired, live *Live, rep *DiffReport) error
	// prereqs checks what the mode needs from the kernel and tools (doctor).
	prereqs func(cfg *config.KubeProxyConfiguration) []Finding
	// explainStop says why the rule that stopped a packet (verdict DROP or REJECT) did, when the mode
	// wrote that rule; "" otherwise (trace).
	explainStop func(s traceresult.Stop) string
	// serviceOf names the Service port a rule the tracer walked ("table/chain: rule" or "chain: rule")
	// belongs to, when the mode writes that into the rule's comment or chain name; "" otherwise.
	serviceOf func(rule string) string
	// affinityHit reports whether a walked rule found the client in the mode's session affinity state.
	affinityHit func(rule string) bool
	// redirects reports whether a walked rule redirects the packet to a proxy on the node itself.
	redirects func(rule string) bool
}

// inspectors is every mode inspect knows, keyed as rules' registry of the modes it builds. It lives here
// rather than in package rules because it is written against inspect's own models (Desired, Live,
// Finding): rules cannot import inspect, and inspect needs nothing else of rules. Nothing else in this
// package switches on a mode.
var inspectors = map[config.ProxyMode]modeInspector{
	config.ModeIPTables: {render: renderIPTablesMode, diff: diffXTablesModes, prereqs: xtablesPrereqs,
		explainStop: iptables.ExplainStop, serviceOf: serviceOfIPTables, affinityHit: iptables.AffinityHit},
	config.ModeIPVS: {render: renderIPVSMode, diff: diffXTablesModes, prereqs: ipvsPrereqs, explainStop: ipvs.ExplainStop},
	config.ModeNFTables: {render: renderNFTablesMode, diff: diffNFTablesMode, prereqs: nftablesPrereqs,
		explainStop: nftables.ExplainStop, serviceOf: serviceOfNFTables, affinityHit: nftables.AffinityHit},
	config.ModeUserspace: {render: renderUserspaceMode, prereqs: xtablesPrereqs, explainStop: userspace.ExplainStop,
		redirects: userspace.RedirectsToProxy},
}

// prereqsFor returns the prerequisite checks doctor runs for a configured mode. An empty mode (the
// default, iptables) and a mode this kube-proxy does not run get mode iptables' checks.
func prereqsFor(mode config.ProxyMode) func(cfg *config.KubeProxyConfiguration) []Finding {
	if ins, ok := inspectors[mode]; ok {
		return ins.prereqs
	}
	return inspectors[config.ModeIPTables].prereqs
}

// modeOrder is the order in which askModes asks the modes after the walk's own: their names'.
var modeOrder = slices.Sorted(maps.Keys(inspectors))

// askModes asks the inspector of first, then every other mode's in the order of their names, until one
// answers (not the zero value), and returns that answer. A walk's rules are first's, the mode whose rules
// it walked; the others answer for rules they left beside them (their names do not overlap).
func askModes[T comparable](first config.ProxyMode, ask func(modeInspector) T) T {
	var none T
	if ins, ok := inspectors[first]; ok {
		if answer := ask(ins); answer != none {
			return answer
		}
	}
	for _, m := range modeOrder {
		if m == first {
			continue
		}
		if answer := ask(inspectors[m]); answer != none {
			return answer
		}
	}
	return none
}

// explainStopByMode asks the modes why the rule of s stopped a packet.
func explainStopByMode(first config.ProxyMode, s traceresult.Stop) string {
	return askModes(first, func(ins modeInspector) string {
		if ins.explainStop == nil {
			return ""
		}
		return ins.explainStop(s)
	})
}

// serviceOfByMode asks the modes which Service port rule belongs to: mode iptables reads comments, mode
// nftables chain names.
func serviceOfByMode(first config.ProxyMode, rule string) string {
	return askModes(first, func(ins modeInspector) string {
		if ins.serviceOf == nil {
			return ""
		}
		return ins.serviceOf(rule)
	})
}

// affinityHitByMode reports whether some mode sees, in rule, a client found in its session affinity state.
func affinityHitByMode(first config.ProxyMode, rule string) bool {
	return askModes(first, func(ins modeInspector) bool { return ins.affinityHit != nil && ins.affinityHit(rule) })
}

// redirectsByMode reports whether some mode sees, in rule, a redirect to a proxy on the node itself.
func redirectsByMode(first config.ProxyMode, rule string) bool {
	return askModes(first, func(ins modeInspector) bool { return ins.redirects != nil && ins.redirects(rule) })
}

func serviceOfIPTables(rule string) string { return iptables.ServiceOfComment(comment(rule)) }

func serviceOfNFTables(rule string) string {
	chain, _, _ := strings.Cut(rule, ":")
	return nftables.ServiceOfName(chain)
}

func renderIPTablesMode(d *Desired, cfg *config.KubeProxyConfiguration, snap *proxy.Snapshot, _ []netip.Addr, counters iptables.NFAcct) error {
	ts, err := renderIPTables(cfg, snap, counters)
	if err != nil {
		return err
	}
	d.XT[snap.Family] = ts
	return nil
}

func renderNFTablesMode(d *Desired, cfg *config.KubeProxyConfiguration, snap *proxy.Snapshot, addrs []netip.Addr, _ iptables.NFAcct) error {
	ncfg, err := nftables.ConfigFrom(cfg, snap.Family)
	if err != nil {
		return err
	}
	text, err := nftables.Desired(ncfg, snap, addrs)
	if err != nil {
		return err
	}
	if err := d.NFT.Load(text); err != nil {
		return fmt.Errorf("loading the rendered %s table: %w", snap.Family, err)
	}
	d.NFTText[snap.Family] = text
	return nil
}

func renderIPVSMode(d *Desired, cfg *config.KubeProxyConfiguration, snap *proxy.Snapshot, addrs []netip.Addr, _ iptables.NFAcct) error {
	icfg, err := ipvs.ConfigFrom(cfg, snap.Family)
	if err != nil {
		return err
	}
	want := ipvs.RenderDesired(icfg, snap, addrs)
	ts := iptrace.New(snap.Family == v1.IPv6Protocol)
	for _, set := range want.Sets {
		if err := ts.SetIPSet(set.Name, set.Type, set.Members...); err != nil {
			return err
		}
	}
	if err := ts.Restore(want.Rules, iptrace.RestoreOptions{NoFlush: true}); err != nil {
		return fmt.Errorf("loading the rendered %s rules: %w", snap.Family, err)
	}
	if err := ts.Restore(want.Jumps, iptrace.RestoreOptions{NoFlush: true}); err != nil {
		return fmt.Errorf("loading the rendered %s jumps: %w", snap.Family, err)
	}
	d.XT[snap.Family], d.IPVS[snap.Family] = ts, want
	return nil
}

func renderUserspaceMode(*Desired, *config.KubeProxyConfiguration, *proxy.Snapshot, []netip.Addr, iptables.NFAcct) error {
	return fmt.Errorf("diff cannot render mode userspace: its rules name the listener ports the running daemon chose; `kube-proxy trace` checks them")
}

// diffXTablesModes compares modes iptables' and ipvs' rules (and ipvs' virtual servers) in the backend
// the daemon would use; kube-proxy chains in the other backend are stale.
func diffXTablesModes(ctx context.Context, env *Env, want *Desired, live *Live, rep *DiffReport) error {
	backend, why, err := xtables.Detect(ctx)
	if err != nil {
		return err
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("compared with the %s backend (%s)", backend, why))
	for _, f := range want.Families() {
		var x *XTables
		for _, c := range live.XTables {
			if c.Backend == backend && c.Family == f {
				x = c
			}
		}
		if x == nil {
			if f != env.primaryFamily() {
				rep.Notes = append(rep.Notes, fmt.Sprintf("%s: no %s tables to compare (single-stack node?)", f, backend))
				continue
			}
			x = &XTables{Backend: backend, Family: f, Tables: iptrace.New(f == v1.IPv6Protocol)}
		}
		rep.Drift = append(rep.Drift, DiffIPTables(want.XT[f], x)...)
		if d := want.IPVS[f]; d != nil {
			rep.Drift = append(rep.Drift, DiffIPVS(d, live, f)...)
		}
		for _, u := range x.Unreadable {
			rep.Notes = append(rep.Notes, "not compared (the tracer does not model it): "+u)
		}
	}
	for _, x := range live.XTables {
		if x.Backend != backend && !x.Empty() {
			rep.Drift = append(rep.Drift, Drift{Kind: "stale", Dataplane: fmt.Sprintf("iptables (%s backend) %s", x.Backend, x.Family),
				Object: fmt.Sprintf("%d chains in the other backend", x.Chains), Detail: "kube-proxy chains in a backend the daemon does not use"})
		}
	}
	return nil
}

// diffNFTablesMode compares mode nftables' tables; any kube-proxy iptables chain beside them is stale.
func diffNFTablesMode(_ context.Context, env *Env, want *Desired, live *Live, rep *DiffReport) error {
	for _, f := range want.Families() {
		if err := nftables.FamilyUsable(f); err != nil && f != env.primaryFamily() {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: not compared (%v)", f, err))
			continue
		}
		rep.Drift = append(rep.Drift, DiffNFTables(want.NFT, live.NFT, f)...)
	}
	for _, x := range live.XTables {
		if !x.Empty() {
			rep.Drift = append(rep.Drift, Drift{Kind: "stale", Dataplane: fmt.Sprintf("iptables (%s backend) %s", x.Backend, x.Family),
				Object: fmt.Sprintf("%d iptables chains", x.Chains), Detail: "mode iptables' or ipvs' chains beside mode nftables"})
		}
	}
	return nil
}
