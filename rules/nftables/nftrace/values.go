package nftrace

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// The data types of selectors and set keys. Values of every type are kept as canonical strings, so an
// element written "0x4000" and one printed "0x00004000" compare equal.
const (
	typeIPv4    = "ipv4_addr"
	typeIPv6    = "ipv6_addr"
	typeProto   = "inet_proto"
	typePort    = "inet_service"
	typeIfname  = "ifname"
	typeMark    = "mark"
	typeCtState = "ct_state"
	typeCtStat  = "ct_status"
	typeFib     = "fib_addrtype"
	typeVerdict = "verdict"
)

// setKeyTypes are the types a named set or map key may have.
var setKeyTypes = map[string]bool{typeIPv4: true, typeIPv6: true, typeProto: true, typePort: true}

var protoNumbers = map[string]int{"icmp": 1, "tcp": 6, "udp": 17, "icmpv6": 58, "sctp": 132}

// ctStateBits and ctStatusBits order flags as nft prints them.
var ctStateBits = map[string]int{"invalid": 1, "established": 2, "related": 4, "new": 8, "untracked": 64}

var ctStatusBits = map[string]int{
	"expected": 1, "seen-reply": 2, "assured": 4, "confirmed": 8, "snat": 16, "dnat": 32, "dying": 512,
}

var fibTypes = map[string]bool{"unspec": true, "unicast": true, "local": true, "broadcast": true, "anycast": true, "multicast": true}

// canon returns the canonical text of a value of type typ; interval allows prefixes and port ranges.
func canon(typ, s string, interval bool) (string, error) {
	switch typ {
	case typeIPv4, typeIPv6:
		v6 := typ == typeIPv6
		if strings.Contains(s, "/") {
			p, err := netip.ParsePrefix(s)
			if err != nil || p.Addr().Is6() != v6 || p.Addr().Is4In6() {
				return "", fmt.Errorf("bad %s prefix %q", typ, s)
			}
			if !interval {
				return "", fmt.Errorf("prefix %q needs an interval set", s)
			}
			p = p.Masked()
			if p.IsSingleIP() {
				return p.Addr().String(), nil
			}
			return p.String(), nil
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Is6() != v6 || a.Is4In6() || a.Zone() != "" {
			return "", fmt.Errorf("bad %s %q", typ, s)
		}
		return a.String(), nil
	case typeProto:
		if n, err := strconv.Atoi(s); err == nil {
			for name, num := range protoNumbers {
				if num == n {
					return name, nil
				}
			}
			return "", fmt.Errorf("unsupported protocol number %d", n)
		}
		if _, ok := protoNumbers[s]; !ok {
			return "", fmt.Errorf("unsupported protocol %q", s)
		}
		return s, nil
	case typePort:
		lo, hi, isRange := strings.Cut(s, "-")
		l, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return "", fmt.Errorf("bad port %q", s)
		}
		if !isRange {
			return strconv.FormatUint(l, 10), nil
		}
		h, err := strconv.ParseUint(hi, 10, 16)
		if err != nil || h < l || !interval {
			return "", fmt.Errorf("bad port range %q", s)
		}
		return fmt.Sprintf("%d-%d", l, h), nil
	case typeIfname:
		if s == "" || len(s) > 15 {
			return "", fmt.Errorf("bad interface name %q", s)
		}
		return s, nil
	case typeMark:
		n, err := strconv.ParseUint(s, 0, 32)
		if err != nil {
			return "", fmt.Errorf("bad mark %q", s)
		}
		return formatMark(uint32(n)), nil
	case typeCtState, typeCtStat:
		bits := ctStateBits
		if typ == typeCtStat {
			bits = ctStatusBits
		}
		if _, ok := bits[s]; !ok {
			return "", fmt.Errorf("unsupported %s %q", typ, s)
		}
		return s, nil
	case typeFib:
		if !fibTypes[s] {
			return "", fmt.Errorf("unsupported address type %q", s)
		}
		return s, nil
	}
	return "", fmt.Errorf("unsupported data type %s", typ)
}

// formatMark prints a mark as kube-proxy writes it: 0, or hexadecimal.
func formatMark(m uint32) string {
	if m == 0 {
		return "0"
	}
	return fmt.Sprintf("0x%x", m)
}

// partMatch reports whether the packet's value pkt matches the canonical value v.
func partMatch(typ, v, pkt string) bool {
	switch typ {
	case typeIPv4, typeIPv6:
		if strings.Contains(v, "/") {
			p, err1 := netip.ParsePrefix(v)
			a, err2 := netip.ParseAddr(pkt)
			return err1 == nil && err2 == nil && p.Contains(a)
		}
	case typePort:
		if lo, hi, ok := strings.Cut(v, "-"); ok {
			l, _ := strconv.Atoi(lo)
			h, _ := strconv.Atoi(hi)
			n, err := strconv.Atoi(pkt)
			return err == nil && n >= l && n <= h
		}
	case typeIfname:
		if p, ok := strings.CutSuffix(v, "*"); ok {
			return strings.HasPrefix(pkt, p)
		}
	case typeCtState, typeCtStat:
		return slices.Contains(strings.Split(pkt, ","), v)
	}
	return v == pkt
}

// comparePart orders canonical values of one type as nft prints them: addresses and numbers by value.
func comparePart(typ, a, b string) int {
	switch typ {
	case typeIPv4, typeIPv6:
		pa, pb := toPrefix(a), toPrefix(b)
		if c := pa.Addr().Compare(pb.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(pa.Bits(), pb.Bits())
	case typePort, typeMark, "":
		na, ea := strconv.ParseUint(strings.SplitN(a, "-", 2)[0], 0, 64)
		nb, eb := strconv.ParseUint(strings.SplitN(b, "-", 2)[0], 0, 64)
		if ea == nil && eb == nil && na != nb {
			return cmp.Compare(na, nb)
		}
	case typeProto:
		return cmp.Compare(protoNumbers[a], protoNumbers[b])
	case typeCtState:
		return cmp.Compare(ctStateBits[a], ctStateBits[b])
	case typeCtStat:
		return cmp.Compare(ctStatusBits[a], ctStatusBits[b])
	}
	return strings.Compare(a, b)
}

func toPrefix(s string) netip.Prefix {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p
	}
	a, _ := netip.ParseAddr(s)
	return netip.PrefixFrom(a, a.BitLen())
}

// compareKeys orders element keys part by part.
func compareKeys(types []string, a, b []string) int {
	for i := range min(len(a), len(b)) {
		typ := ""
		if i < len(types) {
			typ = types[i]
		}
		if c := comparePart(typ, a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// formatValue prints a canonical value as nft syntax (interface names are quoted).
func formatValue(typ, v string) string {
	if typ == typeIfname {
		return quote(v)
	}
	return v
}

// verdict is a jump, goto or a terminal verdict, in a rule or as a verdict map's value.
type verdict struct {
	kind  string // "accept", "drop", "return", "continue", "jump", "goto"
	chain string // jump and goto
}

func (v verdict) String() string {
	if v.chain != "" {
		return v.kind + " " + v.chain
	}
	return v.kind
}

// parseVerdict reads a verdict map value: accept, drop, return, continue, jump CHAIN or goto CHAIN.
func parseVerdict(c *cursor) (verdict, error) {
	t := c.peek()
	switch {
	case t.is("accept"), t.is("drop"), t.is("return"), t.is("continue"):
		c.next()
		return verdict{kind: t.text}, nil
	case t.is("jump"), t.is("goto"):
		c.next()
		name, err := c.word("a chain name")
		if err != nil {
			return verdict{}, err
		}
		return verdict{kind: t.text, chain: name}, nil
	}
	return verdict{}, c.unexpected("expected a verdict (accept, drop, return, jump CHAIN, goto CHAIN)")
}
