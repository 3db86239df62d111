package nftrace

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Rule is one parsed rule: matches and statements in order, and an optional comment. Rules are immutable
// once parsed and shared between copies of the state.
type Rule struct {
	items []item
	// Comment is the rule's comment ("" without one).
	Comment string

	refs []string // "chain X", "set X", "counter X": what the rule refers to
}

// String prints the rule in canonical form, the same for a rule as written in a transaction and as nft
// prints it back: `mark set mark or 0x4000` (nft: `meta mark set meta mark | 0x00004000`), a set of one
// element as a plain value, `meta l4proto tcp th dport 80` as `tcp dport 80`, `dnat ip to ADDR` as
// `dnat to ADDR`, `counter packets 0 bytes 0` as `counter`, anonymous set elements sorted.
func (r *Rule) String() string {
	parts := make([]string, 0, len(r.items)+1)
	for _, it := range r.items {
		parts = append(parts, it.String())
	}
	if r.Comment != "" {
		parts = append(parts, "comment "+quote(r.Comment))
	}
	return strings.Join(parts, " ")
}

// item is one match or statement of a rule.
type item interface{ String() string }

// selector is a packet field a rule reads.
type selector struct {
	name  string // canonical text: "ip daddr", "meta l4proto", "tcp dport", ...
	typ   string // data type of its value
	proto string // "tcp dport" and friends: the protocol the match depends on
}

func joinSelectors(sels []selector) string {
	names := make([]string, len(sels))
	for i, s := range sels {
		names[i] = s.name
	}
	return strings.Join(names, " . ")
}

func selectorTypes(sels []selector) []string {
	out := make([]string, len(sels))
	for i, s := range sels {
		out[i] = s.typ
	}
	return out
}

// elem is an element of a set or map, named or anonymous.
type elem struct {
	key     []string
	comment string
	// verdict maps
	verdict verdict
	// dnat maps: the target address and, with hasPort, port
	addr    netip.Addr
	port    uint16
	hasPort bool
}

func (e *elem) keyString() string { return strings.Join(e.key, " . ") }

// matchItem compares selectors with a value, an anonymous set, or a named set.
type matchItem struct {
	sels []selector
	mask string // mark only: "mark and MASK"
	neg  bool
	set  string     // @set lookup
	vals [][]string // literal values or anonymous set elements
}

func (m *matchItem) String() string {
	var b strings.Builder
	b.WriteString(joinSelectors(m.sels))
	if m.mask != "" {
		b.WriteString(" and " + m.mask)
	}
	if m.neg {
		b.WriteString(" !=")
	}
	b.WriteByte(' ')
	switch {
	case m.set != "":
		b.WriteString("@" + m.set)
	case len(m.sels) == 1 && (m.sels[0].typ == typeCtState || m.sels[0].typ == typeCtStat):
		var vs []string
		for _, v := range m.vals {
			vs = append(vs, v[0])
		}
		b.WriteString(strings.Join(vs, ","))
	case len(m.vals) == 1 && len(m.sels) == 1:
		b.WriteString(formatValue(m.sels[0].typ, m.vals[0][0]))
	default:
		b.WriteString(formatElems(selectorTypes(m.sels), m.vals, nil))
	}
	return b.String()
}

// formatElems prints an anonymous set, or an anonymous map with value(i) for element i.
func formatElems(types []string, keys [][]string, value func(int) string) string {
	var parts []string
	for i, k := range keys {
		vs := make([]string, len(k))
		for j, v := range k {
			typ := ""
			if j < len(types) {
				typ = types[j]
			}
			vs[j] = formatValue(typ, v)
		}
		s := strings.Join(vs, " . ")
		if value != nil {
			s += " : " + value(i)
		}
		parts = append(parts, s)
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

type counterItem struct{ name string }

func (c *counterItem) String() string {
	if c.name != "" {
		return "counter name " + quote(c.name)
	}
	return "counter"
}

// markSetItem is `mark set mark OP VALUE` (op "or", "xor", "and") or `mark set VALUE` (op "").
type markSetItem struct {
	op  string
	val uint32
}

func (m *markSetItem) String() string {
	if m.op == "" {
		return "mark set " + formatMark(m.val)
	}
	return "mark set mark " + m.op + " " + formatMark(m.val)
}

func (m *markSetItem) apply(mark uint32) uint32 {
	switch m.op {
	case "or":
		return mark | m.val
	case "xor":
		return mark ^ m.val
	case "and":
		return mark & m.val
	}
	return m.val
}

// updateItem is `update @set { KEY }`: it adds the packet's key to a dynamic set.
type updateItem struct {
	set  string
	sels []selector
}

func (u *updateItem) String() string {
	return "update @" + u.set + " { " + joinSelectors(u.sels) + " }"
}

type verdictItem struct{ v verdict }

func (v *verdictItem) String() string { return v.v.String() }

type rejectItem struct{ with []string }

func (r *rejectItem) String() string {
	if len(r.with) == 0 {
		return "reject"
	}
	return "reject with " + strings.Join(r.with, " ")
}

type masqItem struct{ flags []string }

func (m *masqItem) String() string {
	if len(m.flags) == 0 {
		return "masquerade"
	}
	return "masquerade " + strings.Join(m.flags, ",")
}

// dnatItem is `dnat to TARGET` or `dnat FAMILY addr . port to numgen random mod N map { ... }`.
type dnatItem struct {
	family string // "ip" or "ip6"
	target elem   // without numgen
	numgen int    // > 0: the map is indexed by numgen random mod numgen
	elems  []elem // numgen map, keyed by index
}

func (d *dnatItem) String() string {
	if d.numgen == 0 {
		return "dnat to " + formatTarget(d.target)
	}
	kw := "dnat to"
	if d.hasPort() {
		kw = "dnat " + d.family + " addr . port to"
	}
	keys := make([][]string, len(d.elems))
	for i := range d.elems {
		keys[i] = d.elems[i].key
	}
	return fmt.Sprintf("%s numgen random mod %d map %s", kw, d.numgen, formatElems(nil, keys, func(i int) string {
		e := d.elems[i]
		if e.hasPort {
			return fmt.Sprintf("%s . %d", e.addr, e.port)
		}
		return e.addr.String()
	}))
}

// hasPort reports whether the dnat changes the port too.
func (d *dnatItem) hasPort() bool {
	if d.numgen == 0 {
		return d.target.hasPort
	}
	return len(d.elems) > 0 && d.elems[0].hasPort
}

func formatTarget(e elem) string {
	if e.hasPort {
		return netip.AddrPortFrom(e.addr, e.port).String()
	}
	return e.addr.String()
}

// vmapItem looks a key up in a verdict map (named or anonymous) and applies the verdict it finds.
type vmapItem struct {
	sels   []selector // the key; empty with numgen
	numgen int        // > 0: the key is numgen random mod numgen
	set    string     // named map
	elems  []elem     // anonymous map
}

func (v *vmapItem) String() string {
	key := joinSelectors(v.sels)
	types := selectorTypes(v.sels)
	if v.numgen > 0 {
		key = fmt.Sprintf("numgen random mod %d", v.numgen)
		types = nil
	}
	if v.set != "" {
		return key + " vmap @" + v.set
	}
	keys := make([][]string, len(v.elems))
	for i := range v.elems {
		keys[i] = v.elems[i].key
	}
	return key + " vmap " + formatElems(types, keys, func(i int) string { return v.elems[i].verdict.String() })
}

// terminal reports whether nothing but a comment may follow it in a rule.
func terminal(it item) bool {
	switch it.(type) {
	case *verdictItem, *rejectItem, *masqItem, *dnatItem, *vmapItem:
		return true
	}
	return false
}

// ruleParser parses one rule of a table of the given family ("ip" or "ip6").
type ruleParser struct {
	c      *cursor
	family string
}

// parseRule parses rule text (the tokens after `add rule FAMILY TABLE CHAIN`, or a line of nft's listing).
func parseRule(family string, toks []token) (*Rule, error) {
	p := &ruleParser{c: &cursor{toks: toks}, family: family}
	r := &Rule{}
	for !p.c.done() {
		if p.c.peekIs("comment") {
			p.c.next()
			s, err := p.c.str("a comment")
			if err != nil {
				return nil, err
			}
			if !p.c.done() {
				return nil, p.c.unexpected("expected the end of the rule after its comment")
			}
			r.Comment = s
			break
		}
		if n := len(r.items); n > 0 && terminal(r.items[n-1]) {
			return nil, p.c.unexpected("nothing may follow " + quote(r.items[n-1].String()))
		}
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		r.items = append(r.items, it)
	}
	if len(r.items) == 0 {
		return nil, fmt.Errorf("empty rule")
	}
	if err := checkProtoDep(r.items); err != nil {
		return nil, err
	}
	r.items = mergeProtoDeps(r.items)
	for _, c := range r.chainRefs() {
		r.refs = append(r.refs, "chain "+c)
	}
	for _, c := range r.setRefs() {
		r.refs = append(r.refs, "set "+c)
	}
	for _, c := range r.counterRefs() {
		r.refs = append(r.refs, "counter "+c)
	}
	return r, nil
}

// checkProtoDep refuses, as nft does, a dnat that sets a port without an earlier match on the transport
// protocol ("transport protocol mapping is only valid after transport protocol match").
func checkProtoDep(items []item) error {
	have := false
	for _, it := range items {
		switch it := it.(type) {
		case *matchItem:
			for _, s := range it.sels {
				if s.proto != "" || (s.name == "meta l4proto" && len(it.sels) == 1 && !it.neg && it.set == "") {
					have = true
				}
			}
		case *dnatItem:
			if it.hasPort() && !have {
				return fmt.Errorf("%s: transport protocol mapping is only valid after transport protocol match", it)
			}
		}
	}
	return nil
}

// mergeProtoDeps rewrites `meta l4proto P ... th dport X` (with only matches between) as `... P dport X`,
// which is how nft prints the same kernel expressions back.
func mergeProtoDeps(items []item) []item {
	for i, it := range items {
		m, ok := it.(*matchItem)
		if !ok || m.neg || m.set != "" || len(m.vals) != 1 || len(m.sels) != 1 || m.sels[0].name != "meta l4proto" {
			continue
		}
		proto := m.vals[0][0]
		if proto != "tcp" && proto != "udp" && proto != "sctp" {
			continue
		}
		for j := i + 1; j < len(items); j++ {
			n, ok := items[j].(*matchItem)
			if !ok {
				break
			}
			if len(n.sels) == 1 && n.sels[0].name == "th dport" {
				nn := *n
				nn.sels = []selector{{name: proto + " dport", typ: typePort, proto: proto}}
				out := slices.Clone(items)
				out[j] = &nn
				return slices.Delete(out, i, i+1)
			}
		}
	}
	return items
}

func (p *ruleParser) item() (item, error) {
	c := p.c
	t := c.peek()
	switch {
	case t.quoted:
		return nil, c.unexpected("expected a match or statement")
	case t.is("counter"):
		c.next()
		ci := &counterItem{}
		if c.accept("name") {
			s, err := c.str("a counter name")
			if err != nil {
				return nil, err
			}
			ci.name = s
		} else if c.accept("packets") {
			if _, err := c.word("a packet count"); err != nil {
				return nil, err
			}
			if err := c.expect("bytes"); err != nil {
				return nil, err
			}
			if _, err := c.word("a byte count"); err != nil {
				return nil, err
			}
		}
		return ci, nil
	case t.is("accept"), t.is("drop"), t.is("return"), t.is("jump"), t.is("goto"):
		v, err := parseVerdict(c)
		if err != nil {
			return nil, err
		}
		return &verdictItem{v}, nil
	case t.is("reject"):
		c.next()
		ri := &rejectItem{}
		if c.accept("with") {
			kind, err := c.word("icmp, icmpv6, icmpx or tcp")
			if err != nil {
				return nil, err
			}
			switch kind {
			case "tcp":
				if err := c.expect("reset"); err != nil {
					return nil, err
				}
				ri.with = []string{"tcp", "reset"}
			case "icmp", "icmpv6", "icmpx":
				c.accept("type")
				code, err := c.word("an ICMP code")
				if err != nil {
					return nil, err
				}
				ri.with = []string{kind, code}
			default:
				c.pos--
				return nil, c.unexpected("expected icmp, icmpv6, icmpx or tcp")
			}
		}
		return ri, nil
	case t.is("masquerade"):
		c.next()
		mi := &masqItem{}
		for {
			f := c.peek()
			if !f.is("random") && !f.is("fully-random") && !f.is("persistent") {
				break
			}
			c.next()
			mi.flags = append(mi.flags, f.text)
			if !c.accept(",") {
				break
			}
		}
		if c.peekIs("to") {
			return nil, c.unexpected("masquerade to a port is not supported")
		}
		return mi, nil
	case t.is("dnat"):
		return p.dnat()
	case t.is("update"), t.is("add"):
		return p.update()
	case t.is("numgen"):
		n, err := p.numgen()
		if err != nil {
			return nil, err
		}
		if err := c.expect("vmap"); err != nil {
			return nil, err
		}
		vi := &vmapItem{numgen: n}
		vi.elems, err = parseElems(c, []string{typePort}, elemVerdict, false)
		if err != nil {
			return nil, err
		}
		return vi, sortNumgen(vi.elems, n)
	}
	return p.match()
}

// numgen parses `numgen random mod N`.
func (p *ruleParser) numgen() (int, error) {
	c := p.c
	if err := c.expect("numgen"); err != nil {
		return 0, err
	}
	if err := c.expect("random"); err != nil {
		return 0, err
	}
	if err := c.expect("mod"); err != nil {
		return 0, err
	}
	w, err := c.word("a modulus")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(w)
	if err != nil || n < 1 || n > 1<<16 {
		return 0, fmt.Errorf("bad numgen modulus %q", w)
	}
	if c.peekIs("offset") {
		return 0, c.unexpected("numgen offset is not supported")
	}
	return n, nil
}

// sortNumgen orders a numgen map's elements by index and checks the indexes are below the modulus.
func sortNumgen(elems []elem, mod int) error {
	for _, e := range elems {
		if n, _ := strconv.Atoi(e.key[0]); n >= mod {
			return fmt.Errorf("numgen map index %d is not below the modulus %d", n, mod)
		}
	}
	slices.SortFunc(elems, func(a, b elem) int { return comparePart(typePort, a.key[0], b.key[0]) })
	return nil
}

// selector parses one selector if one is next.
func (p *ruleParser) selector() (selector, bool, error) {
	c := p.c
	t := c.peek()
	if t.quoted {
		return selector{}, false, nil
	}
	field := func(what string, allowed ...string) (string, error) {
		w, err := c.word(what)
		if err != nil {
			return "", err
		}
		if !slices.Contains(allowed, w) {
			c.pos--
			return "", c.unexpected("expected " + what)
		}
		return w, nil
	}
	switch t.text {
	case "ip", "ip6":
		c.next()
		if t.text != p.family {
			c.pos--
			return selector{}, false, c.unexpected(fmt.Sprintf("conflicting protocols: %s in an %s table", t.text, p.family))
		}
		f, err := field("saddr or daddr", "saddr", "daddr")
		if err != nil {
			return selector{}, false, err
		}
		typ := typeIPv4
		if t.text == "ip6" {
			typ = typeIPv6
		}
		return selector{name: t.text + " " + f, typ: typ}, true, nil
	case "meta":
		c.next()
		f, err := field("l4proto, mark, iifname or oifname", "l4proto", "mark", "iifname", "oifname")
		if err != nil {
			return selector{}, false, err
		}
		switch f {
		case "l4proto":
			return selector{name: "meta l4proto", typ: typeProto}, true, nil
		case "mark":
			return selector{name: "mark", typ: typeMark}, true, nil
		}
		return selector{name: f, typ: typeIfname}, true, nil
	case "mark":
		c.next()
		return selector{name: "mark", typ: typeMark}, true, nil
	case "iifname", "oifname":
		c.next()
		return selector{name: t.text, typ: typeIfname}, true, nil
	case "th":
		c.next()
		if _, err := field("dport", "dport"); err != nil {
			return selector{}, false, err
		}
		return selector{name: "th dport", typ: typePort}, true, nil
	case "tcp", "udp", "sctp":
		c.next()
		if _, err := field("dport", "dport"); err != nil {
			return selector{}, false, err
		}
		return selector{name: t.text + " dport", typ: typePort, proto: t.text}, true, nil
	case "ct":
		c.next()
		f, err := field("state or status", "state", "status")
		if err != nil {
			return selector{}, false, err
		}
		if f == "state" {
			return selector{name: "ct state", typ: typeCtState}, true, nil
		}
		return selector{name: "ct status", typ: typeCtStat}, true, nil
	case "fib":
		c.next()
		f, err := field("saddr or daddr", "saddr", "daddr")
		if err != nil {
			return selector{}, false, err
		}
		if err := c.expect("type"); err != nil {
			return selector{}, false, err
		}
		return selector{name: "fib " + f + " type", typ: typeFib}, true, nil
	}
	return selector{}, false, nil
}

// selectors parses `SEL [. SEL]...`.
func (p *ruleParser) selectors() ([]selector, error) {
	var sels []selector
	for {
		s, ok, err := p.selector()
		if err != nil {
			return nil, err
		}
		if !ok {
			if len(sels) == 0 {
				return nil, p.c.unexpected("expected a match or statement")
			}
			p.c.pos-- // back to the "."
			return nil, p.c.unexpected("expected a selector after it")
		}
		sels = append(sels, s)
		if !p.c.accept(".") {
			return sels, nil
		}
	}
}

// setRef parses `@name` or `@ name`.
func setRef(c *cursor) (string, bool, error) {
	t := c.peek()
	if t.quoted || !strings.HasPrefix(t.text, "@") {
		return "", false, nil
	}
	c.next()
	if name := t.text[1:]; name != "" {
		return name, true, nil
	}
	name, err := c.word("a set name")
	return name, true, err
}

func (p *ruleParser) match() (item, error) {
	c := p.c
	sels, err := p.selectors()
	if err != nil {
		return nil, err
	}
	m := &matchItem{sels: sels}
	if len(sels) == 1 && sels[0].typ == typeMark {
		if c.peekIs("set") {
			return p.markSet()
		}
		if c.accept("and") || c.accept("&") {
			w, err := c.word("a mask")
			if err != nil {
				return nil, err
			}
			if m.mask, err = canon(typeMark, w, false); err != nil {
				return nil, err
			}
		}
	}
	if c.peekIs("vmap") {
		c.next()
		if m.mask != "" {
			return nil, fmt.Errorf("vmap on a masked mark is not supported")
		}
		vi := &vmapItem{sels: sels}
		name, ok, err := setRef(c)
		if err != nil {
			return nil, err
		}
		if ok {
			vi.set = name
			return vi, nil
		}
		vi.elems, err = parseElems(c, selectorTypes(sels), elemVerdict, true)
		if err != nil {
			return nil, err
		}
		slices.SortFunc(vi.elems, func(a, b elem) int { return compareKeys(selectorTypes(sels), a.key, b.key) })
		return vi, nil
	}
	switch {
	case c.accept("!="), c.accept("ne"):
		m.neg = true
	case c.accept("=="), c.accept("eq"):
	}
	if name, ok, err := setRef(c); err != nil {
		return nil, err
	} else if ok {
		if m.mask != "" {
			return nil, fmt.Errorf("set lookup on a masked mark is not supported")
		}
		m.set = name
		return m, nil
	}
	types := selectorTypes(sels)
	if c.peekIs("{") {
		elems, err := parseElems(c, types, elemNone, true)
		if err != nil {
			return nil, err
		}
		for _, e := range elems {
			m.vals = append(m.vals, e.key)
		}
	} else {
		key, err := parseKey(c, types, true)
		if err != nil {
			return nil, err
		}
		m.vals = [][]string{key}
		// ct state established,related: a list of flags.
		if len(types) == 1 && (types[0] == typeCtState || types[0] == typeCtStat) {
			for c.accept(",") {
				k, err := parseKey(c, types, false)
				if err != nil {
					return nil, err
				}
				m.vals = append(m.vals, k)
			}
		}
	}
	slices.SortFunc(m.vals, func(a, b []string) int { return compareKeys(types, a, b) })
	m.vals = slices.CompactFunc(m.vals, slices.Equal)
	return m, nil
}

// markSet parses the rest of `mark set ...` after the selector.
func (p *ruleParser) markSet() (item, error) {
	c := p.c
	if err := c.expect("set"); err != nil {
		return nil, err
	}
	ms := &markSetItem{}
	if c.accept("meta") {
		if err := c.expect("mark"); err != nil {
			return nil, err
		}
		ms.op = "?"
	} else if c.accept("mark") {
		ms.op = "?"
	}
	if ms.op == "?" {
		op, err := c.word("or, xor or and")
		if err != nil {
			return nil, err
		}
		switch op {
		case "or", "|":
			ms.op = "or"
		case "xor", "^":
			ms.op = "xor"
		case "and", "&":
			ms.op = "and"
		default:
			c.pos--
			return nil, c.unexpected("expected or, xor or and")
		}
	}
	w, err := c.word("a mark value")
	if err != nil {
		return nil, err
	}
	v, err := strconv.ParseUint(w, 0, 32)
	if err != nil {
		return nil, fmt.Errorf("bad mark value %q", w)
	}
	ms.val = uint32(v)
	return ms, nil
}

// update parses `update @set { SELECTORS }` (or `add @set { ... }`).
func (p *ruleParser) update() (item, error) {
	c := p.c
	c.next()
	name, ok, err := setRef(c)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, c.unexpected("expected @set")
	}
	if err := c.expect("{"); err != nil {
		return nil, err
	}
	sels, err := p.selectors()
	if err != nil {
		return nil, err
	}
	if err := c.expect("}"); err != nil {
		return nil, err
	}
	return &updateItem{set: name, sels: sels}, nil
}

// dnat parses `dnat [FAMILY [addr . port]] to TARGET`.
func (p *ruleParser) dnat() (item, error) {
	c := p.c
	c.next()
	d := &dnatItem{family: p.family}
	addrPort := false
	if t := c.peek(); t.is("ip") || t.is("ip6") {
		if t.text != p.family {
			return nil, c.unexpected(fmt.Sprintf("conflicting protocols: %s in an %s table", t.text, p.family))
		}
		c.next()
		if c.accept("addr") {
			if err := c.expect("."); err != nil {
				return nil, err
			}
			if err := c.expect("port"); err != nil {
				return nil, err
			}
			addrPort = true
		}
	}
	if err := c.expect("to"); err != nil {
		return nil, err
	}
	if c.peekIs("numgen") {
		n, err := p.numgen()
		if err != nil {
			return nil, err
		}
		if err := c.expect("map"); err != nil {
			return nil, err
		}
		d.numgen = n
		if d.elems, err = parseElems(c, []string{typePort}, p.dnatValueKind(), false); err != nil {
			return nil, err
		}
		for _, e := range d.elems {
			if e.hasPort != d.elems[0].hasPort || (addrPort && !e.hasPort) {
				return nil, fmt.Errorf("dnat map values must all be ADDR . PORT or all ADDR")
			}
		}
		return d, sortNumgen(d.elems, n)
	}
	e, err := parseTarget(c, p.family, true)
	if err != nil {
		return nil, err
	}
	if addrPort && !e.hasPort {
		return nil, fmt.Errorf("dnat addr . port needs a port")
	}
	d.target = e
	return d, nil
}

func (p *ruleParser) dnatValueKind() elemKind {
	if p.family == "ip6" {
		return elemTarget6
	}
	return elemTarget4
}

// parseTarget parses a DNAT destination: ADDR, ADDR:PORT, [ADDR6]:PORT, or ADDR . PORT.
func parseTarget(c *cursor, family string, colonForm bool) (elem, error) {
	w, err := c.word("a destination address")
	if err != nil {
		return elem{}, err
	}
	var e elem
	if ap, err := netip.ParseAddrPort(w); err == nil && colonForm {
		e = elem{addr: ap.Addr(), port: ap.Port(), hasPort: true}
	} else if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(w, "["), "]")); err == nil {
		e = elem{addr: a}
	} else {
		c.pos--
		return elem{}, c.unexpected("expected a destination address")
	}
	if e.addr.Is6() != (family == "ip6") || e.addr.Is4In6() || e.addr.Zone() != "" {
		return elem{}, fmt.Errorf("destination %s is not an %s address", w, family)
	}
	if !e.hasPort && c.accept(".") {
		pw, err := c.word("a port")
		if err != nil {
			return elem{}, err
		}
		port, err := strconv.ParseUint(pw, 10, 16)
		if err != nil {
			return elem{}, fmt.Errorf("bad port %q", pw)
		}
		e.port, e.hasPort = uint16(port), true
	}
	return e, nil
}

// elemKind says what follows an element's key.
type elemKind int

const (
	elemNone    elemKind = iota // a set element
	elemVerdict                 // ": VERDICT"
	elemTarget4                 // ": ADDR [. PORT]" (IPv4 dnat map)
	elemTarget6                 // the same for IPv6
)

// parseKey parses one element key: values of types, joined by ".".
func parseKey(c *cursor, types []string, interval bool) ([]string, error) {
	key := make([]string, len(types))
	for i, typ := range types {
		if i > 0 {
			if err := c.expect("."); err != nil {
				return nil, err
			}
		}
		t := c.peek()
		if c.done() || (!t.quoted && isPunct(t.text)) || (t.quoted && typ != typeIfname) {
			return nil, c.unexpected("expected a value of type " + typ)
		}
		c.next()
		v, err := canon(typ, t.text, interval)
		if err != nil {
			return nil, err
		}
		key[i] = v
	}
	return key, nil
}

// parseElems parses `{ ELEMENT [, ELEMENT]... }`. Elements may carry `comment "..."`, and, as nft lists
// dynamic sets, `timeout T`, `expires T` and `counter packets N bytes M`, which are ignored.
func parseElems(c *cursor, types []string, kind elemKind, interval bool) ([]elem, error) {
	if err := c.expect("{"); err != nil {
		return nil, err
	}
	var out []elem
	for !c.accept("}") {
		if len(out) > 0 {
			if err := c.expect(","); err != nil {
				return nil, err
			}
			if c.accept("}") { // a trailing comma
				break
			}
		}
		key, err := parseKey(c, types, interval)
		if err != nil {
			return nil, err
		}
		e := elem{key: key}
	mods:
		for {
			switch {
			case c.accept("comment"):
				if e.comment, err = c.str("a comment"); err != nil {
					return nil, err
				}
			case c.accept("timeout"), c.accept("expires"):
				if _, err := c.word("a duration"); err != nil {
					return nil, err
				}
			case c.accept("counter"):
				if c.accept("packets") {
					c.next()
					if err := c.expect("bytes"); err != nil {
						return nil, err
					}
					c.next()
				}
			default:
				break mods
			}
		}
		switch kind {
		case elemVerdict:
			if err := c.expect(":"); err != nil {
				return nil, err
			}
			if e.verdict, err = parseVerdict(c); err != nil {
				return nil, err
			}
		case elemTarget4, elemTarget6:
			if err := c.expect(":"); err != nil {
				return nil, err
			}
			family := "ip"
			if kind == elemTarget6 {
				family = "ip6"
			}
			t, err := parseTarget(c, family, false)
			if err != nil {
				return nil, err
			}
			e.addr, e.port, e.hasPort = t.addr, t.port, t.hasPort
		}
		out = append(out, e)
	}
	return out, nil
}

// references lists what a rule refers to.
func (r *Rule) chainRefs() []string {
	var out []string
	for _, it := range r.items {
		switch it := it.(type) {
		case *verdictItem:
			if it.v.chain != "" {
				out = append(out, it.v.chain)
			}
		case *vmapItem:
			for _, e := range it.elems {
				if e.verdict.chain != "" {
					out = append(out, e.verdict.chain)
				}
			}
		}
	}
	return out
}

// setRefs lists the named sets and maps a rule refers to.
func (r *Rule) setRefs() []string {
	var out []string
	for _, it := range r.items {
		switch it := it.(type) {
		case *matchItem:
			if it.set != "" {
				out = append(out, it.set)
			}
		case *vmapItem:
			if it.set != "" {
				out = append(out, it.set)
			}
		case *updateItem:
			out = append(out, it.set)
		}
	}
	return out
}

func (r *Rule) counterRefs() []string {
	var out []string
	for _, it := range r.items {
		if ci, ok := it.(*counterItem); ok && ci.name != "" {
			out = append(out, ci.name)
		}
	}
	return out
}
