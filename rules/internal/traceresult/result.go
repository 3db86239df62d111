// Package traceresult is what the packet tracers (rules/iptables/iptrace, rules/nftables/nftrace) report:
// every way the first packet of a connection can go through a mode's rules.
package traceresult

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Outcome is where one branch of the walk ends.
type Outcome struct {
	// Verdict is ACCEPT, DROP or REJECT.
	Verdict string
	// Hook is the built-in (iptables: "table/chain") or base chain (nftables: "FAMILY kube-proxy CHAIN")
	// that gave the verdict; for ACCEPT the last one walked.
	Hook string
	// Dst is the destination after NAT; Endpoint is the DNAT target ("" without DNAT).
	Dst      netip.AddrPort
	Endpoint string
	// Masquerade is set when the packet was masqueraded in postrouting.
	Masquerade bool
	// Mark is the packet mark at the end of the walk.
	Mark uint32
	// Probability is the chance of this branch (the product of the random choices taken).
	Probability float64
	// Remembered lists where the packet's source was remembered for session affinity: the recent lists
	// (iptables) or affinity sets (nftables) it was added to.
	Remembered []string
	// Path lists the chains entered, in order.
	Path []string
	// Rules lists the rules that took an action on the packet (a jump, a mark, a verdict, NAT, a map
	// lookup that matched), in order, each as "CHAIN: rule" in the tracer's canonical form (iptables:
	// "table/CHAIN: rule options").
	Rules []string
}

// Result is every way a packet can go.
type Result struct {
	Outcomes []Outcome
}

// Endpoints returns the DNAT destinations of accepted outcomes, sorted, each once.
func (r *Result) Endpoints() []string {
	var out []string
	for _, o := range r.Outcomes {
		if o.Verdict == "ACCEPT" && o.Endpoint != "" {
			out = append(out, o.Endpoint)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Verdicts returns the verdicts of all outcomes, sorted, each once.
func (r *Result) Verdicts() []string {
	var out []string
	for _, o := range r.Outcomes {
		out = append(out, o.Verdict)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Masquerade reports whether all outcomes (true) or none (false) are masqueraded; mixed is reported by
// ok=false.
func (r *Result) Masquerade() (masq, ok bool) {
	if len(r.Outcomes) == 0 {
		return false, true
	}
	masq = r.Outcomes[0].Masquerade
	for _, o := range r.Outcomes[1:] {
		if o.Masquerade != masq {
			return false, false
		}
	}
	return masq, true
}

// String summarises the result, one outcome per line.
func (r *Result) String() string {
	var b strings.Builder
	for _, o := range r.Outcomes {
		fmt.Fprintf(&b, "%s at %s p=%.4f", o.Verdict, o.Hook, o.Probability)
		if o.Endpoint != "" {
			fmt.Fprintf(&b, " dnat=%s", o.Endpoint)
		}
		if o.Masquerade {
			b.WriteString(" masquerade")
		}
		if len(o.Remembered) > 0 {
			fmt.Fprintf(&b, " remembered=%s", strings.Join(o.Remembered, ","))
		}
		fmt.Fprintf(&b, " via %s\n", strings.Join(o.Path, " "))
	}
	return b.String()
}

// Stop is the rule that gave a packet its DROP or REJECT, as the mode that wrote the rule explains it
// (each mode's ExplainStop).
type Stop struct {
	// Table is the rule's iptables table ("" in nftables); Chain its chain.
	Table, Chain string
	// Rule is the rule as the tracer prints it, after "CHAIN: "; Comment is its comment ("" without one).
	Rule, Comment string
	// Verdict is DROP or REJECT.
	Verdict string
	// Dst, Protocol and Port are the packet's destination.
	Dst      netip.Addr
	Protocol string
	Port     uint16
}
