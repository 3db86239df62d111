package nftables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// family holds what differs between the ip and the ip6 table.
type family struct {
	v1       v1.IPFamily
	name     string // "ip" or "ip6": the table family and the address match keyword
	addrType string // "ipv4_addr" or "ipv6_addr"
	loopback netip.Prefix
}

var (
	familyIPv4 = &family{v1: v1.IPv4Protocol, name: "ip", addrType: "ipv4_addr", loopback: netip.MustParsePrefix("127.0.0.0/8")}
	familyIPv6 = &family{v1: v1.IPv6Protocol, name: "ip6", addrType: "ipv6_addr", loopback: netip.MustParsePrefix("::1/128")}
)

func familyOf(f v1.IPFamily) *family {
	if f == v1.IPv6Protocol {
		return familyIPv6
	}
	return familyIPv4
}

// The objects of the table. Each has a key that names it in the table (kind and name); the writer turns
// them into nft commands (text, for knftables and for reading) and into netlink messages.

// chainSpec is a chain: a base chain when hook is set.
type chainSpec struct {
	name    string
	typ     string // "filter" or "nat", base chains only
	hook    string // "prerouting", "input", "forward", "output", "postrouting"; "" for a regular chain
	prio    int
	comment string
}

// ruleSpec is one rule of a chain: matches and statements in order, and an optional comment.
type ruleSpec struct {
	terms   []term
	comment string
}

// keyType is one field of a set's key (or of a map's value).
type keyType uint8

const (
	keyAddr  keyType = iota + 1 // the family's address
	keyProto                    // inet_proto
	keyPort                     // inet_service
)

func (k keyType) text(f *family) string {
	switch k {
	case keyAddr:
		return f.addrType
	case keyProto:
		return "inet_proto"
	case keyPort:
		return "inet_service"
	}
	return "?"
}

// The key layouts of our sets and maps.
var (
	layoutAddr          = []keyType{keyAddr}
	layoutAddrProtoPort = []keyType{keyAddr, keyProto, keyPort}
	layoutProtoPort     = []keyType{keyProto, keyPort}
	layoutHairpin       = []keyType{keyAddr, keyAddr, keyProto, keyPort}
)

// setSpec is a named set, or a map of verdicts when isMap is set.
type setSpec struct {
	name    string
	key     []keyType
	isMap   bool // values are verdicts
	dynamic bool // flags dynamic,timeout: filled by the rules (affinity sets)
	timeout time.Duration
	comment string
}

func (s *setSpec) equal(o *setSpec) bool {
	return s.name == o.name && slices.Equal(s.key, o.key) && s.isMap == o.isMap && s.dynamic == o.dynamic &&
		s.timeout == o.timeout && s.comment == o.comment
}

// elemKey is one element's key; the set's layout says which fields it uses: addr (and addr2 for the
// hairpin set), proto and port.
type elemKey struct {
	addr, addr2 netip.Addr
	proto       uint8
	port        uint16
}

// verdictKind is the verdict of a map element or a rule.
type verdictKind uint8

const (
	verdictNone verdictKind = iota
	verdictAccept
	verdictDrop
	verdictJump
	verdictGoto
	verdictReturn
)

// verdict is a verdict with its chain for jump and goto.
type verdict struct {
	kind  verdictKind
	chain string
}

func (v verdict) text() string {
	switch v.kind {
	case verdictAccept:
		return "accept"
	case verdictDrop:
		return "drop"
	case verdictJump:
		return "jump " + v.chain
	case verdictGoto:
		return "goto " + v.chain
	case verdictReturn:
		return "return"
	}
	return ""
}

// elemValue is what a map element holds, and its comment.
type elemValue struct {
	verdict verdict
	comment string
}

// protoNumbers are the IP protocol numbers of the Service protocols.
var protoNumbers = map[v1.Protocol]uint8{v1.ProtocolTCP: 6, v1.ProtocolUDP: 17, v1.ProtocolSCTP: 132}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// keyText writes an element key in nft syntax for a layout.
func keyText(b *strings.Builder, layout []keyType, k elemKey) {
	addrs := 0
	for i, t := range layout {
		if i > 0 {
			b.WriteString(" . ")
		}
		switch t {
		case keyAddr:
			a := k.addr
			if addrs > 0 {
				a = k.addr2
			}
			addrs++
			b.WriteString(a.String())
		case keyProto:
			b.WriteString(protoName(k.proto))
		case keyPort:
			b.WriteString(strconv.Itoa(int(k.port)))
		}
	}
}

// opKind is what a transaction does with an object.
type opKind uint8

const (
	opAdd opKind = iota + 1
	opFlush
	opDelete
	opInsert // a rule, at the head of its chain
)

func (k opKind) String() string {
	return [...]string{"", "add", "flush", "delete", "insert"}[k]
}

// op is one command of a transaction. Exactly one of its object fields is set; for rules, target names
// the chain appended (opAdd) or prepended (opInsert) to, and a rule deleted is named by target and handle;
// for elements, target names the set or map and elems holds one or more elements.
type op struct {
	kind    opKind
	table   bool // the table itself
	chain   *chainSpec
	rule    *ruleSpec
	set     *setSpec
	counter string
	// handle is the kernel's handle of a rule deleted (opDelete).
	handle uint64
	// target is the chain of a rule, or the set of elements.
	target string
	elems  []element
}

// element is a key with its value (maps only).
type element struct {
	key   elemKey
	value elemValue
}

// tx is a transaction: commands applied atomically, in order.
type tx struct {
	fam *family
	ops []op
	// sets remembers the layout of every set named in the transaction, for elements.
	layouts map[string]*setSpec
}

func newTx(f *family) *tx { return &tx{fam: f} }

func (t *tx) add(o op) { t.ops = append(t.ops, o) }

// empty reports whether the transaction does nothing.
func (t *tx) empty() bool { return len(t.ops) == 0 }

// String returns the transaction as nft commands, one per line (what `nft -f` would take).
func (t *tx) String() string {
	var b strings.Builder
	for i := range t.ops {
		t.ops[i].text(&b, t.fam)
	}
	return b.String()
}

func quote(s string) string { return strconv.Quote(s) }

// text writes the op as one or more nft commands.
func (o *op) text(b *strings.Builder, f *family) {
	prefix := o.kind.String() + " "
	switch {
	case o.table:
		b.WriteString(prefix + "table " + f.name + " " + TableName)
		if o.kind == opAdd {
			b.WriteString(" { comment " + quote(tableComment) + " ; }")
		}
	case o.chain != nil:
		c := o.chain
		b.WriteString(prefix + "chain " + f.name + " " + TableName + " " + c.name)
		if o.kind == opAdd && (c.hook != "" || c.comment != "") {
			b.WriteString(" {")
			if c.hook != "" {
				b.WriteString(" type " + c.typ + " hook " + c.hook + " priority " + strconv.Itoa(c.prio) + " ;")
			}
			if c.comment != "" {
				b.WriteString(" comment " + quote(c.comment) + " ;")
			}
			b.WriteString(" }")
		}
	case o.rule != nil:
		b.WriteString(prefix + "rule " + f.name + " " + TableName + " " + o.target + " ")
		o.rule.text(b, f)
	case o.handle != 0:
		b.WriteString(prefix + "rule " + f.name + " " + TableName + " " + o.target + " handle " + strconv.FormatUint(o.handle, 10))
	case o.set != nil:
		s := o.set
		kind := "set"
		if s.isMap {
			kind = "map"
		}
		b.WriteString(prefix + kind + " " + f.name + " " + TableName + " " + s.name)
		if o.kind == opAdd {
			b.WriteString(" { type ")
			for i, k := range s.key {
				if i > 0 {
					b.WriteString(" . ")
				}
				b.WriteString(k.text(f))
			}
			if s.isMap {
				b.WriteString(" : verdict")
			}
			b.WriteString(" ;")
			if s.dynamic {
				b.WriteString(" flags dynamic,timeout ;")
			}
			if s.timeout > 0 {
				b.WriteString(" timeout " + strconv.FormatInt(int64(s.timeout/time.Second), 10) + "s ;")
			}
			if s.comment != "" {
				b.WriteString(" comment " + quote(s.comment) + " ;")
			}
			b.WriteString(" }")
		}
	case o.counter != "":
		b.WriteString(prefix + "counter " + f.name + " " + TableName + " " + o.counter)
	default: // elements
		for i, e := range o.elems {
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(prefix + "element " + f.name + " " + TableName + " " + o.target + " { ")
			keyText(b, o.layout(), e.key)
			if o.kind == opAdd {
				if e.value.comment != "" {
					b.WriteString(" comment " + quote(e.value.comment))
				}
				if e.value.verdict.kind != verdictNone {
					b.WriteString(" : " + e.value.verdict.text())
				}
			}
			b.WriteString(" }")
		}
	}
	b.WriteByte('\n')
}

// layout returns the key layout of an element op's set.
func (o *op) layout() []keyType { return layoutOf(o.target) }

// layoutOf returns the key layout of one of our sets or maps by name.
func layoutOf(set string) []keyType {
	switch set {
	case setHairpinConnections:
		return layoutHairpin
	case mapServiceIPs, mapNoEndpointServices, mapFirewallIPs:
		return layoutAddrProtoPort
	case mapServiceNodePorts, mapNoEndpointNodePorts, mapLocalhostNodePortReject:
		return layoutProtoPort
	}
	return layoutAddr
}

// text writes the rule's body in nft syntax.
func (r *ruleSpec) text(b *strings.Builder, f *family) {
	for i, t := range r.terms {
		if i > 0 {
			b.WriteByte(' ')
		}
		t.text(b, f)
	}
	if r.comment != "" {
		b.WriteString(" comment " + quote(r.comment))
	}
}

// equal reports whether two rules are the same.
func (r *ruleSpec) equal(o *ruleSpec) bool {
	return r.comment == o.comment && slices.EqualFunc(r.terms, o.terms, term.equal)
}

const tableComment = "rules for kube-proxy"
