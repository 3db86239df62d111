package inspect

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/rules/internal/traceresult"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/iptables/iptrace"
	"kube-proxy/rules/nftables"
	"kube-proxy/rules/nftables/nftrace"
)

// Packet is what `kube-proxy trace` walks: the first packet of a connection.
type Packet struct {
	Src, Dst netip.Addr
	Protocol string // tcp, udp or sctp
	Port     uint16
	// In is the interface an arriving packet comes in on; Local a packet sent by the node itself.
	In    string
	Local bool
}

func (p Packet) String() string {
	from := "from " + p.Src.String()
	if p.Local {
		from += " (the node itself)"
	} else if p.In != "" {
		from += " in on " + p.In
	}
	return fmt.Sprintf("%s %s %s", p.Protocol, netip.AddrPortFrom(p.Dst, p.Port), from)
}

// Family is the packet's IP family.
func (p Packet) Family() v1.IPFamily {
	if p.Dst.Is6() {
		return v1.IPv6Protocol
	}
	return v1.IPv4Protocol
}

// Walk is the packet's way through one mode's rules.
type Walk struct {
	// Dataplane names what was walked: "iptables (nft backend) IPv4", "nftables IPv4".
	Dataplane string `json:"dataplane"`
	// Outcomes are every way the packet can go, each explained.
	Outcomes []Outcome `json:"outcomes"`
	// Warnings say what the walk could not see (rules it does not model, other programs' rules ahead of
	// ours).
	Warnings []string `json:"warnings,omitempty"`
	// Nearest lists the Service addresses and ports on the same IP or the same port, when the packet met
	// no Service rule.
	Nearest []string `json:"nearest,omitempty"`
}

// Outcome is one way the packet goes, with the reason in words.
type Outcome struct {
	Verdict     string  `json:"verdict"` // ACCEPT, DROP or REJECT
	Endpoint    string  `json:"endpoint,omitempty"`
	Probability float64 `json:"probability"`
	Masquerade  bool    `json:"masquerade"`
	// Proxy is set when the packet goes to the daemon's own proxy (mode userspace): Endpoint is then its
	// listener, and the daemon picks the endpoint.
	Proxy  bool     `json:"proxy,omitempty"`
	Reason string   `json:"reason"`
	Rules  []string `json:"rules"`
}

// Reaches reports whether every outcome delivers the packet to an endpoint.
func (w *Walk) Reaches() bool {
	if len(w.Outcomes) == 0 {
		return false
	}
	for _, o := range w.Outcomes {
		if o.Verdict != "ACCEPT" || o.Endpoint == "" {
			return false
		}
	}
	return true
}

// Trace walks pkt through every dataplane of its family the node holds. No walk at all means the node
// has no kube-proxy rules for the family.
func (l *Live) Trace(pkt Packet) ([]Walk, error) {
	var walks []Walk
	for _, x := range l.XTablesFor(pkt.Family()) {
		res, err := x.Tables.Trace(iptrace.Packet{Src: pkt.Src, Dst: pkt.Dst, Protocol: pkt.Protocol, DPort: pkt.Port,
			InIface: pkt.In, Local: pkt.Local, LocalAddrs: l.localAddrsFor(pkt.In), Recent: recentLists(pkt.Src)})
		if err != nil {
			return nil, fmt.Errorf("tracing through the %s %s iptables rules: %w", x.Backend, x.Family, err)
		}
		name := fmt.Sprintf("iptables (%s backend) %s", x.Backend, x.Family)
		mode := x.mode()
		if mode != config.ModeIPTables {
			name = fmt.Sprintf("%s: %s", mode, name)
		}
		w := explain(name, walked{mode: mode}, res, pkt)
		w.Warnings = x.warnings(pkt)
		if len(w.Outcomes) > 0 && w.Outcomes[0].Endpoint == "" && w.Outcomes[0].Verdict == "ACCEPT" {
			w.Nearest = nearestXT(x, pkt)
		}
		if x.ipvs() && x.VirtualServers == 0 {
			w.Warnings = append(w.Warnings, "mode ipvs rules, but no IPVS virtual server could be read (no IPVS in this kernel, or ipvsadm missing)")
		}
		walks = append(walks, w)
	}
	if slices.Contains(l.NFTFamilies, pkt.Family()) {
		res, err := l.NFT.Trace(nftrace.Packet{Src: pkt.Src, Dst: pkt.Dst, Protocol: pkt.Protocol, DPort: pkt.Port,
			InIface: pkt.In, Local: pkt.Local, LocalAddrs: l.localAddrsFor(pkt.In)})
		if err != nil {
			return nil, fmt.Errorf("tracing through the %s nftables table: %w", pkt.Family(), err)
		}
		w := explain("nftables "+string(pkt.Family()), walked{mode: config.ModeNFTables, nft: true}, res, pkt)
		if len(w.Outcomes) > 0 && w.Outcomes[0].Endpoint == "" && w.Outcomes[0].Verdict == "ACCEPT" {
			w.Nearest = nearestNFT(l, pkt)
		}
		walks = append(walks, w)
	}
	return walks, nil
}

// warnings names what may change the packet's way that the walk does not see.
func (x *XTables) warnings(pkt Packet) []string {
	var out []string
	hooks := map[string]bool{"nat/PREROUTING": !pkt.Local, "nat/OUTPUT": pkt.Local, "filter/FORWARD": !pkt.Local,
		"filter/INPUT": !pkt.Local, "filter/OUTPUT": pkt.Local}
	for _, f := range x.Foreign {
		if f.AheadOfUs && hooks[f.Table+"/"+f.Chain] {
			out = append(out, fmt.Sprintf("not walked, ahead of kube-proxy's jump in %s/%s (rule %d): %s", f.Table, f.Chain, f.Position, f.Rule))
		}
	}
	for _, u := range x.Unreadable {
		out = append(out, "not walked (the tracer does not model it): "+u)
	}
	return out
}

// explain turns a tracer result into outcomes with reasons, most likely first.
func explain(name string, wk walked, res *traceresult.Result, pkt Packet) Walk {
	w := Walk{Dataplane: name}
	for _, o := range res.Outcomes {
		out := Outcome{Verdict: o.Verdict, Endpoint: o.Endpoint, Probability: o.Probability,
			Masquerade: o.Masquerade, Reason: reason(wk, o, pkt), Rules: o.Rules}
		out.Proxy = redirected(wk.mode, o)
		if out.Proxy && !listening(pkt.Protocol, o.Dst.Port()) {
			out.Endpoint = ""
			out.Reason = fmt.Sprintf("REDIRECTed to port %d on the node (mode userspace), but nothing listens there: the daemon is not running or has not opened this Service's listener", o.Dst.Port())
		}
		w.Outcomes = append(w.Outcomes, out)
	}
	slices.SortStableFunc(w.Outcomes, func(a, b Outcome) int {
		if a.Probability != b.Probability {
			if a.Probability > b.Probability {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Endpoint, b.Endpoint)
	})
	return w
}

var commentRE = regexp.MustCompile(`(?:--comment|comment) "((?:[^"\\]|\\.)*)"|--comment (\S+)`)

// comment returns a rule's comment, "" without one.
func comment(rule string) string {
	m := commentRE.FindStringSubmatch(rule)
	if m == nil {
		return ""
	}
	if m[1] != "" {
		return strings.ReplaceAll(m[1], `\"`, `"`)
	}
	return m[2]
}

// catchAllStop is the reason of a stop no mode explains.
const catchAllStop = "dropped by a kube-proxy rule"

// walked is what a walk went through: the mode whose rules they are, and the form in which its tracer
// lists a rule ("table/CHAIN: rule" for iptables, "chain: rule" for nftables).
type walked struct {
	mode config.ProxyMode
	nft  bool
}

// stop returns the rule (as the tracer lists it) that gave pkt verdict, as the modes explain it.
func (w walked) stop(rule, verdict string, pkt Packet) traceresult.Stop {
	where, text, _ := strings.Cut(rule, ": ")
	s := traceresult.Stop{Chain: where, Rule: text, Comment: comment(text), Verdict: verdict,
		Dst: pkt.Dst, Protocol: pkt.Protocol, Port: pkt.Port}
	if !w.nft {
		s.Table, s.Chain, _ = strings.Cut(where, "/")
	}
	return s
}

// reason says in words why an outcome is what it is.
func reason(w walked, o traceresult.Outcome, pkt Packet) string {
	if redirected(w.mode, o) {
		return fmt.Sprintf("REDIRECTed to the daemon's own proxy at %s (mode userspace): it connects to an endpoint it picks round-robin, trying the next when one fails", o.Endpoint)
	}
	if o.Verdict == "ACCEPT" {
		return acceptReason(w, o)
	}
	if vs := ipvsServer(o.Path); vs != "" && o.Verdict == "REJECT" {
		return fmt.Sprintf("IPVS virtual server %s has no real server taking new connections: the Service has no ready endpoints", vs)
	}
	last := ""
	if len(o.Rules) > 0 {
		last = o.Rules[len(o.Rules)-1]
	}
	s := w.stop(last, o.Verdict, pkt)
	why := explainStopByMode(w.mode, s)
	if why == "" {
		why = catchAllStop
	}
	if s.Comment != "" {
		why += fmt.Sprintf(" (rule comment: %q)", s.Comment)
	}
	return why
}

// acceptReason explains an accepted packet: DNATed to an endpoint, or left untouched.
func acceptReason(w walked, o traceresult.Outcome) string {
	svc := serviceOf(w.mode, o.Rules)
	if o.Endpoint == "" {
		if svc != "" {
			return fmt.Sprintf("entered the rules of %s but no rule DNATed it: its chain is empty or incomplete (see `kube-proxy diff`); the packet goes on untouched", svc)
		}
		return "no kube-proxy rule matched: the packet goes on untouched (to the node or onward as routed)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "DNAT to endpoint %s", o.Endpoint)
	if svc != "" {
		fmt.Fprintf(&b, " of %s", svc)
	}
	if vs := ipvsServer(o.Path); vs != "" {
		fmt.Fprintf(&b, " by IPVS virtual server %s", vs)
	}
	if o.Masquerade {
		b.WriteString(", source masqueraded to the node's address")
	} else {
		b.WriteString(", source address kept")
	}
	if sticky(w.mode, o.Rules) {
		b.WriteString(", where session affinity binds this client (it was sent there before)")
	} else if len(o.Remembered) > 0 {
		b.WriteString(", client remembered for session affinity")
	}
	return b.String()
}

// sticky reports whether the walk followed a client's session affinity: a recent list (iptables) or an
// affinity set (nftables) that already held the source.
func sticky(mode config.ProxyMode, rules []string) bool {
	return slices.ContainsFunc(rules, func(r string) bool { return affinityHitByMode(mode, r) })
}

// redirected reports whether an outcome ends in a REDIRECT to the node itself.
func redirected(mode config.ProxyMode, o traceresult.Outcome) bool {
	if o.Verdict != "ACCEPT" || o.Endpoint == "" {
		return false
	}
	return slices.ContainsFunc(o.Rules, func(r string) bool { return redirectsByMode(mode, r) })
}

// listening reports whether a socket listens on port (TCP) or is bound to it (UDP), in either family, as
// /proc/net/{tcp,udp}{,6} say.
var listening = func(proto string, port uint16) bool {
	files := map[string][]string{"tcp": {"/proc/net/tcp", "/proc/net/tcp6"}, "udp": {"/proc/net/udp", "/proc/net/udp6"}}[proto]
	want := fmt.Sprintf(":%04X ", port)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) > 3 && strings.HasSuffix(fields[1]+" ", want) && (proto == "udp" || fields[3] == "0A") {
				return true
			}
		}
	}
	return false
}

// ipvsServer returns the IPVS virtual server a walk went through ("" for none).
func ipvsServer(path []string) string {
	for _, p := range path {
		if vs, ok := strings.CutPrefix(p, "ipvs/"); ok {
			return vs
		}
	}
	return ""
}

// serviceOf names the Service whose rules the packet went through, asking the modes that name it in
// their rules (comments, chain names), last rule first.
func serviceOf(mode config.ProxyMode, rules []string) string {
	for i := len(rules) - 1; i >= 0; i-- {
		if svc := serviceOfByMode(mode, rules[i]); svc != "" {
			return svc
		}
	}
	return ""
}

// nearestXT lists the Service rules of the nat table on the packet's address or port.
func nearestXT(x *XTables, pkt Packet) []string {
	var out []string
	for _, chain := range x.Tables.Chains("nat") {
		for _, r := range x.Tables.Rules("nat", chain) {
			c := comment(r)
			if c == "" || !iptables.DestinationComment(c) {
				continue
			}
			words, err := splitWords(r)
			if err != nil {
				continue
			}
			dst, port, proto := "", "", ""
			for i := 0; i+1 < len(words); i++ {
				switch words[i] {
				case "-d":
					dst = strings.TrimSuffix(strings.TrimSuffix(words[i+1], "/32"), "/128")
				case "--dport":
					port = words[i+1]
				case "-p":
					proto = words[i+1]
				}
			}
			if dst == pkt.Dst.String() || port == strconv.Itoa(int(pkt.Port)) {
				s := fmt.Sprintf("%s %s:%s (%s)", proto, dst, port, c)
				if !slices.Contains(out, s) {
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// nearestNFT lists the service-ips map's elements on the packet's address or port.
func nearestNFT(l *Live, pkt Packet) []string {
	var out []string
	for _, e := range nftables.ServiceElements(l.NFT, pkt.Family()) {
		if e.Addr == pkt.Dst || e.Port == pkt.Port {
			s := fmt.Sprintf("%s %s:%d (%s)", e.Protocol, e.Addr, e.Port, e.Chain)
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}
