package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// termKind is one kind of match or statement of our rules. Every shape kube-proxy writes is one of these;
// each is written as nft text (text) and as netlink expressions (exprs, Linux only) from the same value.
type termKind uint8

const (
	// Matches.
	tCTStateNew   termKind = iota + 1 // ct state new
	tCTStatusDNAT                     // ct status dnat
	tMarkNonZero                      // mark and MARK != 0
	tAddr                             // ip saddr|daddr [!=] ADDR or PREFIX
	tAddrSet                          // ip saddr|daddr [!=] { PREFIX, ... } (one element is written as tAddr)
	tAddrInSet                        // ip saddr|daddr @SET
	tHairpin                          // ip saddr . ip daddr . meta l4proto . th dport @SET
	tFibLocal                         // fib saddr|daddr type local
	tIifname                          // iifname [!=] "NAME" (a prefix: "NAME*")
	tL4Proto                          // meta l4proto PROTO

	// Statements.
	tVmapAddrProtoPort // ip daddr . meta l4proto . th dport vmap @MAP
	tVmapProtoPort     // meta l4proto . th dport vmap @MAP
	tVerdict           // jump|goto CHAIN, drop, accept, return
	tReject            // reject
	tMarkOr            // mark set mark or MARK
	tMarkXor           // mark set mark xor MARK
	tMasquerade        // masquerade fully-random
	tDNAT              // dnat to ADDR:PORT
	tDNATMap           // dnat ip addr . port to numgen random mod N map { 0 : ADDR . PORT, ... }
	tNumgenVmap        // numgen random mod N vmap { 0 : goto CHAIN, ... }
	tUpdateSaddr       // update @SET { ip saddr }
	tCounter           // counter name "NAME"
)

// term is one match or statement.
type term struct {
	kind    termKind
	neg     bool
	saddr   bool           // the source address (tAddr, tAddrSet, tAddrInSet, tFibLocal); else the destination
	prefix  netip.Prefix   // tAddr (a full-length prefix is written as an address)
	prefixs []netip.Prefix // tAddrSet
	name    string         // set, map, chain, interface or counter
	ifPref  bool           // tIifname: name is a prefix
	mark    uint32
	proto   uint8
	verdict verdictKind
	eps     []netip.AddrPort // tDNAT (one), tDNATMap
	chains  []string         // tNumgenVmap
}

func (t term) equal(o term) bool {
	return t.kind == o.kind && t.neg == o.neg && t.saddr == o.saddr && t.prefix == o.prefix &&
		slices.Equal(t.prefixs, o.prefixs) && t.name == o.name && t.ifPref == o.ifPref && t.mark == o.mark &&
		t.proto == o.proto && t.verdict == o.verdict && slices.Equal(t.eps, o.eps) && slices.Equal(t.chains, o.chains)
}

// Constructors, named after what they write.

func ctStateNew() term            { return term{kind: tCTStateNew} }
func ctStatusDNAT() term          { return term{kind: tCTStatusDNAT} }
func markNonZero(m uint32) term   { return term{kind: tMarkNonZero, mark: m} }
func markOr(m uint32) term        { return term{kind: tMarkOr, mark: m} }
func markXor(m uint32) term       { return term{kind: tMarkXor, mark: m} }
func masquerade() term            { return term{kind: tMasquerade} }
func reject() term                { return term{kind: tReject} }
func jump(chain string) term      { return term{kind: tVerdict, verdict: verdictJump, name: chain} }
func goTo(chain string) term      { return term{kind: tVerdict, verdict: verdictGoto, name: chain} }
func drop() term                  { return term{kind: tVerdict, verdict: verdictDrop} }
func l4proto(p uint8) term        { return term{kind: tL4Proto, proto: p} }
func counter(name string) term    { return term{kind: tCounter, name: name} }
func updateSaddr(set string) term { return term{kind: tUpdateSaddr, name: set} }
func fibLocal(saddr bool) term    { return term{kind: tFibLocal, saddr: saddr} }
func hairpin(set string) term     { return term{kind: tHairpin, name: set} }

func addrIs(saddr, neg bool, p netip.Prefix) term {
	return term{kind: tAddr, saddr: saddr, neg: neg, prefix: p}
}

// addrsIn matches an address against a list of prefixes; one prefix is a plain comparison, as nft
// compiles it.
func addrsIn(saddr, neg bool, ps []netip.Prefix) term {
	if len(ps) == 1 {
		return addrIs(saddr, neg, ps[0])
	}
	return term{kind: tAddrSet, saddr: saddr, neg: neg, prefixs: ps}
}

func addrInSet(saddr bool, set string) term { return term{kind: tAddrInSet, saddr: saddr, name: set} }

func iifname(neg bool, name string, prefix bool) term {
	return term{kind: tIifname, neg: neg, name: name, ifPref: prefix}
}

func vmapAddrProtoPort(m string) term { return term{kind: tVmapAddrProtoPort, name: m} }
func vmapProtoPort(m string) term     { return term{kind: tVmapProtoPort, name: m} }

func dnatTo(ep netip.AddrPort) term { return term{kind: tDNAT, eps: []netip.AddrPort{ep}} }

func dnatMap(eps []netip.AddrPort) term { return term{kind: tDNATMap, eps: eps} }

func numgenVmap(chains []string) term { return term{kind: tNumgenVmap, chains: chains} }

// prefixText writes a prefix as nft does: a full-length prefix as its address.
func prefixText(p netip.Prefix) string {
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr().String()
	}
	return p.String()
}

func markText(m uint32) string { return fmt.Sprintf("%#08x", m) }

func dir(saddr bool) string {
	if saddr {
		return "saddr"
	}
	return "daddr"
}

func (t term) text(b *strings.Builder, f *family) {
	not := ""
	if t.neg {
		not = "!= "
	}
	switch t.kind {
	case tCTStateNew:
		b.WriteString("ct state new")
	case tCTStatusDNAT:
		b.WriteString("ct status dnat")
	case tMarkNonZero:
		b.WriteString("mark and " + markText(t.mark) + " != 0")
	case tAddr:
		b.WriteString(f.name + " " + dir(t.saddr) + " " + not + prefixText(t.prefix))
	case tAddrSet:
		b.WriteString(f.name + " " + dir(t.saddr) + " " + not + "{ ")
		for i, p := range t.prefixs {
			if i > 0 {
				b.WriteString(" , ")
			}
			b.WriteString(prefixText(p))
		}
		b.WriteString(" }")
	case tAddrInSet:
		b.WriteString(f.name + " " + dir(t.saddr) + " @" + t.name)
	case tHairpin:
		b.WriteString(f.name + " saddr . " + f.name + " daddr . meta l4proto . th dport @" + t.name)
	case tFibLocal:
		b.WriteString("fib " + dir(t.saddr) + " type local")
	case tIifname:
		name := t.name
		if t.ifPref {
			name += "*"
		}
		b.WriteString("iifname " + not + quote(name))
	case tL4Proto:
		b.WriteString("meta l4proto " + protoName(t.proto))
	case tVmapAddrProtoPort:
		b.WriteString(f.name + " daddr . meta l4proto . th dport vmap @" + t.name)
	case tVmapProtoPort:
		b.WriteString("meta l4proto . th dport vmap @" + t.name)
	case tVerdict:
		b.WriteString(verdict{kind: t.verdict, chain: t.name}.text())
	case tReject:
		b.WriteString("reject")
	case tMarkOr:
		b.WriteString("mark set mark or " + markText(t.mark))
	case tMarkXor:
		b.WriteString("mark set mark xor " + markText(t.mark))
	case tMasquerade:
		b.WriteString("masquerade fully-random")
	case tDNAT:
		b.WriteString("dnat to " + t.eps[0].String())
	case tDNATMap:
		b.WriteString("dnat " + f.name + " addr . port to numgen random mod " + strconv.Itoa(len(t.eps)) + " map { ")
		for i, ep := range t.eps {
			if i > 0 {
				b.WriteString(" , ")
			}
			b.WriteString(strconv.Itoa(i) + " : " + ep.Addr().String() + " . " + strconv.Itoa(int(ep.Port())))
		}
		b.WriteString(" }")
	case tNumgenVmap:
		b.WriteString("numgen random mod " + strconv.Itoa(len(t.chains)) + " vmap { ")
		for i, c := range t.chains {
			if i > 0 {
				b.WriteString(" , ")
			}
			b.WriteString(strconv.Itoa(i) + " : goto " + c)
		}
		b.WriteString(" }")
	case tUpdateSaddr:
		b.WriteString("update @" + t.name + " { " + f.name + " saddr }")
	case tCounter:
		b.WriteString("counter name " + quote(t.name))
	default:
		b.WriteString("?")
	}
}

// anonSets counts the anonymous sets a term creates in the kernel.
func (t term) anonSets() int {
	switch t.kind {
	case tAddrSet, tDNATMap, tNumgenVmap:
		return 1
	}
	return 0
}

func itoa(i int) string { return strconv.Itoa(i) }
