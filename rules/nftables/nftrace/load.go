package nftrace

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Load applies text to the state, atomically as `nft -f` does: on error nothing changes. The text is a
// knftables-style transaction (lines of `add|create|insert|flush|delete|destroy table|chain|rule|set|map|
// element|counter ...`, and `flush ruleset`), or the output of `nft list table|ruleset`, or a mix. A
// `table FAMILY kube-proxy { ... }` block, as nft lists it, is a snapshot: it replaces that table whole.
// Tables other than ip/ip6 kube-proxy are skipped and reported by Foreign. Errors name the line and the
// token that was not understood, or the reference the kernel would refuse (a missing chain, set or
// counter, a key of the wrong type, a loop, a NAT statement in a chain the hook does not allow).
func (ts *Tables) Load(text string) error {
	lines, err := lex(text)
	if err != nil {
		return err
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	work := ts.clone()
	ld := &loader{ts: work, lines: lines}
	if err := ld.run(); err != nil {
		return err
	}
	for _, fam := range []string{"ip", "ip6"} {
		if t := work.tables[fam]; t != nil {
			if err := t.validate(); err != nil {
				return fmt.Errorf("table %s: %w", t.id(), err)
			}
		}
	}
	ts.tables, ts.foreign = work.tables, work.foreign
	return nil
}

type loader struct {
	ts    *Tables
	lines []logicalLine
	pos   int
}

func (ld *loader) addForeign(family, name string) {
	id := family + " " + name
	if !slices.Contains(ld.ts.foreign, id) {
		ld.ts.foreign = append(ld.ts.foreign, id)
		slices.Sort(ld.ts.foreign)
	}
}

// lineError is an error located on a line of the loaded text.
type lineError struct {
	line int
	err  error
}

func (e *lineError) Error() string { return fmt.Sprintf("line %d: %v", e.line, e.err) }

func (e *lineError) Unwrap() error { return e.err }

// lineErr locates err on l, unless it is located already (on a line inside l's block).
func lineErr(l logicalLine, err error) error {
	var le *lineError
	if errors.As(err, &le) {
		return err
	}
	return &lineError{line: l.line, err: err}
}

func (ld *loader) run() error {
	for ld.pos < len(ld.lines) {
		l := ld.lines[ld.pos]
		ld.pos++
		c := &cursor{toks: l.toks}
		var err error
		switch t := c.peek(); {
		case t.is("table") && isBlockHeader(l.toks):
			err = ld.tableBlock(c)
		case t.is("add"), t.is("create"), t.is("insert"), t.is("replace"), t.is("delete"), t.is("destroy"),
			t.is("flush"), t.is("reset"):
			err = ld.command(c)
		default:
			err = c.unexpected("expected a command or a table block")
		}
		if err != nil {
			return lineErr(l, err)
		}
	}
	return nil
}

// ours reports whether family and name are a table the tracer models.
func ours(family, name string) bool {
	return (family == "ip" || family == "ip6") && name == TableName
}

// blockLines returns the lines of the block whose header was just read, up to its closing brace, with
// nested blocks' headers and closing braces included.
func (ld *loader) blockLines(header logicalLine) ([]logicalLine, error) {
	depth := 1
	start := ld.pos
	for ld.pos < len(ld.lines) {
		l := ld.lines[ld.pos]
		ld.pos++
		switch {
		case len(l.toks) == 1 && l.toks[0].is("}"):
			depth--
			if depth == 0 {
				return ld.lines[start : ld.pos-1], nil
			}
		case isBlockHeader(l.toks):
			depth++
		}
	}
	return nil, lineErr(header, fmt.Errorf("block not closed"))
}

// tableBlock reads `table FAMILY NAME { ... }` as nft lists it.
func (ld *loader) tableBlock(c *cursor) error {
	header := ld.lines[ld.pos-1]
	c.next()
	family, _ := c.word("a family")
	name, _ := c.word("a table name")
	body, err := ld.blockLines(header)
	if err != nil {
		return err
	}
	if !ours(family, name) {
		ld.addForeign(family, name)
		return nil
	}
	t := newTable(family)
	for i := 0; i < len(body); i++ {
		l := body[i]
		bc := &cursor{toks: l.toks}
		var err error
		switch w := bc.peek(); {
		case isBlockHeader(l.toks):
			sub := &loader{lines: body, pos: i + 1}
			var lines []logicalLine
			if lines, err = sub.blockLines(l); err != nil {
				return err
			}
			i = sub.pos - 1
			err = t.objectBlock(bc, lines)
		case w.is("comment"):
			bc.next()
			t.Comment, err = bc.str("a comment")
		case w.is("flags"):
			bc.next()
			t.Flags, err = wordList(bc)
		default:
			err = bc.unexpected("expected a chain, set, map, counter, comment or flags")
		}
		if err == nil && !bc.done() && !isBlockHeader(l.toks) {
			err = bc.unexpected("expected the end of the line")
		}
		if err != nil {
			return lineErr(l, err)
		}
	}
	t.recount()
	ld.ts.tables[family] = t
	return nil
}

// objectBlock reads a chain, set, map or counter block of nft's listing.
func (t *Table) objectBlock(hc *cursor, lines []logicalLine) error {
	kind := hc.next().text
	name, err := hc.word("a name")
	if err != nil {
		return err
	}
	if _, err := t.objectByName(kind, name); err == nil {
		return fmt.Errorf("%s %s listed twice", kind, name)
	}
	if err := checkName(kind, name); err != nil {
		return err
	}
	switch kind {
	case "chain":
		ch := &Chain{Name: name}
		for _, l := range lines {
			c := &cursor{toks: l.toks}
			switch {
			case len(l.toks) == 2 && c.peekIs("comment"):
				c.next()
				ch.Comment, _ = c.str("a comment")
			case c.peekIs("type") || c.peekIs("policy"):
				if err := parseChainSpec(c, ch); err != nil {
					return lineErr(l, err)
				}
			default:
				r, err := parseRule(t.Family, l.toks)
				if err != nil {
					return lineErr(l, fmt.Errorf("chain %s: %w", name, err))
				}
				ch.Rules = append(ch.Rules, r)
			}
		}
		t.addChain(ch)
		return nil
	case "set", "map":
		s := &Set{Name: name, Map: kind == "map", elems: map[string]*elem{}}
		var elemLines []logicalLine
		for _, l := range lines {
			if l.toks[0].is("elements") {
				elemLines = append(elemLines, l) // after the type is known
				continue
			}
			if err := parseSetSpec(&cursor{toks: l.toks}, s); err != nil {
				return lineErr(l, err)
			}
		}
		if err := s.checkSpec(); err != nil {
			return err
		}
		for _, l := range elemLines {
			c := &cursor{toks: l.toks}
			c.next()
			if err := c.expect("="); err != nil {
				return lineErr(l, err)
			}
			if err := s.addElems(c, "add", nil); err != nil {
				return lineErr(l, err)
			}
			if !c.done() {
				return lineErr(l, c.unexpected("expected the end of the line"))
			}
		}
		t.Sets[name] = s
		return nil
	case "counter":
		t.Counters[name] = true
		return nil
	}
	return fmt.Errorf("%s objects are not supported", kind)
}

func (t *Table) addChain(ch *Chain) {
	t.seq++
	ch.seq = t.seq
	if ch.Hook != "" && ch.Policy == "" {
		ch.Policy = "accept"
	}
	t.Chains[ch.Name] = ch
}

// objectByName finds a chain, set/map or counter.
func (t *Table) objectByName(kind, name string) (any, error) {
	switch kind {
	case "chain":
		if c := t.Chains[name]; c != nil {
			return c, nil
		}
	case "set", "map", "element":
		if s := t.Sets[name]; s != nil {
			return s, nil
		}
	case "counter":
		if t.Counters[name] {
			return true, nil
		}
	}
	return nil, fmt.Errorf("%s %s does not exist", kind, name)
}

// checkName refuses names nft's parser does not take as one identifier: a letter or "_" first, then
// letters, digits, "/", "\\", "_", "-" and "." (IPv6 addresses in upstream's names have their colons
// turned into dots for this reason).
func checkName(kind, name string) error {
	ok := len(name) > 0 && len(name) < 256
	for i, r := range name {
		switch {
		case r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'):
		case i > 0 && ((r >= '0' && r <= '9') || r == '/' || r == '\\' || r == '-' || r == '.'):
		default:
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("%s name %q is not an nft identifier", kind, name)
	}
	return nil
}

// wordList reads `a,b,c`.
func wordList(c *cursor) ([]string, error) {
	var out []string
	for {
		w, err := c.word("a word")
		if err != nil {
			return nil, err
		}
		out = append(out, w)
		if !c.accept(",") {
			return out, nil
		}
	}
}

var hooks = map[string]bool{"prerouting": true, "input": true, "forward": true, "output": true, "postrouting": true}

var namedPriorities = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

// parseChainSpec reads `type T hook H priority P ; policy X ; comment "..." ;` (any subset, in this order
// or as nft lists it), up to the end of the cursor or a closing brace.
func parseChainSpec(c *cursor, ch *Chain) error {
	for !c.done() && !c.peekIs("}") {
		if c.accept(";") {
			continue
		}
		switch w := c.next(); {
		case w.is("type"):
			typ, err := c.word("a chain type")
			if err != nil {
				return err
			}
			if typ != "filter" && typ != "nat" && typ != "route" {
				c.pos--
				return c.unexpected("expected filter, nat or route")
			}
			if err := c.expect("hook"); err != nil {
				return err
			}
			hook, err := c.word("a hook")
			if err != nil {
				return err
			}
			if !hooks[hook] {
				c.pos--
				return c.unexpected("expected prerouting, input, forward, output or postrouting")
			}
			if c.peekIs("device") {
				return c.unexpected("device chains are not supported")
			}
			if err := c.expect("priority"); err != nil {
				return err
			}
			prio, err := parsePriority(c)
			if err != nil {
				return err
			}
			ch.Type, ch.Hook, ch.Priority = typ, hook, prio
		case w.is("policy"):
			p, err := c.word("accept or drop")
			if err != nil {
				return err
			}
			if p != "accept" && p != "drop" {
				c.pos--
				return c.unexpected("expected accept or drop")
			}
			ch.Policy = p
		case w.is("comment"):
			s, err := c.str("a comment")
			if err != nil {
				return err
			}
			ch.Comment = s
		default:
			c.pos--
			return c.unexpected("expected type, policy or comment")
		}
	}
	if ch.Policy != "" && ch.Hook == "" {
		return fmt.Errorf("chain %s: a policy needs a base chain", ch.Name)
	}
	return nil
}

// parsePriority reads a number, a name (dstnat, srcnat, filter, ...), or a name plus or minus a number
// ("dstnat - 10", "dstnat-10").
func parsePriority(c *cursor) (int, error) {
	w, err := c.word("a priority")
	if err != nil {
		return 0, err
	}
	if n, err := strconv.Atoi(w); err == nil {
		return n, nil
	}
	name, off := w, ""
	if i := strings.IndexAny(w, "+-"); i > 0 {
		name, off = w[:i], w[i:]
	}
	base, ok := namedPriorities[name]
	if !ok {
		c.pos--
		return 0, c.unexpected("expected a priority")
	}
	if off == "" && (c.peekIs("+") || c.peekIs("-")) {
		off = c.next().text
		n, err := c.word("a number")
		if err != nil {
			return 0, err
		}
		off += n
	}
	if off != "" {
		n, err := strconv.Atoi(off)
		if err != nil {
			return 0, fmt.Errorf("bad priority %q", w+off)
		}
		base += n
	}
	return base, nil
}

// typeofTypes maps the selectors of `typeof` to data types.
var typeofTypes = map[string]string{
	"ip saddr": typeIPv4, "ip daddr": typeIPv4, "ip6 saddr": typeIPv6, "ip6 daddr": typeIPv6,
	"meta l4proto": typeProto, "th dport": typePort, "tcp dport": typePort, "udp dport": typePort,
	"sctp dport": typePort,
}

// parseSetSpec reads a set's or map's properties: `type K [. K]... [: verdict]`, `typeof ...`, `flags`,
// `timeout`, `gc-interval`, `size`, `policy`, `auto-merge`, `comment`, separated by ";" or lines. Sizes,
// policies and gc intervals are not kept.
func parseSetSpec(c *cursor, s *Set) error {
	for !c.done() && !c.peekIs("}") {
		if c.accept(";") {
			continue
		}
		switch w := c.next(); {
		case w.is("type"), w.is("typeof"):
			s.KeyType, s.DataType = nil, ""
			for {
				var typ string
				if w.is("type") {
					t, err := c.word("a data type")
					if err != nil {
						return err
					}
					typ = t
				} else {
					a, err := c.word("a selector")
					if err != nil {
						return err
					}
					b, err := c.word("a selector")
					if err != nil {
						return err
					}
					if typ = typeofTypes[a+" "+b]; typ == "" {
						return fmt.Errorf("typeof %s %s is not supported", a, b)
					}
				}
				if !setKeyTypes[typ] {
					c.pos--
					return c.unexpected("expected a supported key type (ipv4_addr, ipv6_addr, inet_proto, inet_service)")
				}
				s.KeyType = append(s.KeyType, typ)
				if !c.accept(".") {
					break
				}
			}
			if c.accept(":") {
				d, err := c.word("a data type")
				if err != nil {
					return err
				}
				if d != typeVerdict {
					c.pos--
					return c.unexpected("expected verdict (only verdict maps are supported)")
				}
				s.DataType = d
			}
		case w.is("flags"):
			fl, err := wordList(c)
			if err != nil {
				return err
			}
			for _, f := range fl {
				if f != "dynamic" && f != "timeout" && f != "interval" && f != "constant" {
					return fmt.Errorf("set flag %q is not supported", f)
				}
			}
			s.Flags = fl
		case w.is("timeout"), w.is("gc-interval"):
			v, err := c.word("a duration")
			if err != nil {
				return err
			}
			d, err := parseDuration(v)
			if err != nil {
				return err
			}
			if w.is("timeout") {
				s.Timeout = d
			}
		case w.is("size"), w.is("policy"):
			if _, err := c.word("a value"); err != nil {
				return err
			}
		case w.is("auto-merge"):
		case w.is("comment"):
			v, err := c.str("a comment")
			if err != nil {
				return err
			}
			s.Comment = v
		default:
			c.pos--
			return c.unexpected("expected type, flags, timeout, size, policy or comment")
		}
	}
	return nil
}

// checkSpec checks the spec of a set or map is complete.
func (s *Set) checkSpec() error {
	if len(s.KeyType) == 0 {
		return fmt.Errorf("%s %s has no type", s.kind(), s.Name)
	}
	if s.Map != (s.DataType != "") {
		if s.Map {
			return fmt.Errorf("map %s needs a data type (KEY : verdict)", s.Name)
		}
		return fmt.Errorf("set %s cannot have a data type", s.Name)
	}
	return nil
}

// parseDuration reads nft's durations: "10800s", "3h", "2h59m59s992ms", "1d".
func parseDuration(s string) (time.Duration, error) {
	var days time.Duration
	rest := s
	if i := strings.Index(s, "d"); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil {
			return 0, fmt.Errorf("bad duration %q", s)
		}
		days, rest = time.Duration(n)*24*time.Hour, s[i+1:]
	}
	if rest == "" {
		return days, nil
	}
	d, err := time.ParseDuration(rest)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q", s)
	}
	return days + d, nil
}

// addElems reads `{ ELEMENT, ... }` and applies verb (add, create, delete, destroy) to each element,
// telling count (if set) about each element added (+1) or removed (-1).
func (s *Set) addElems(c *cursor, verb string, count func(*elem, int)) error {
	kind := elemNone
	if s.Map && (verb == "add" || verb == "create") {
		kind = elemVerdict
	}
	elems, err := parseElems(c, s.KeyType, kind, s.interval())
	if err != nil {
		return fmt.Errorf("%s %s: %w", s.kind(), s.Name, err)
	}
	for _, e := range elems {
		k := e.keyString()
		old := s.elems[k]
		switch verb {
		case "add", "create":
			if old != nil && (verb == "create" || old.verdict != e.verdict) {
				return fmt.Errorf("%s %s: element %s exists (File exists)", s.kind(), s.Name, k)
			}
			if old != nil {
				continue
			}
			e := e
			s.elems[k] = &e
			if count != nil {
				count(&e, 1)
			}
		case "delete", "destroy":
			if old == nil {
				if verb == "delete" {
					return fmt.Errorf("%s %s: element %s does not exist (No such file or directory)", s.kind(), s.Name, k)
				}
				continue
			}
			delete(s.elems, k)
			if count != nil {
				count(old, -1)
			}
		}
	}
	return nil
}

// command applies one transaction line.
func (ld *loader) command(c *cursor) error {
	verb := c.next().text
	obj, err := c.word("an object (table, chain, rule, set, map, element, counter)")
	if err != nil {
		return err
	}
	if obj == "ruleset" && verb == "flush" {
		ld.ts.tables = map[string]*Table{}
		return nil
	}
	switch obj {
	case "table", "chain", "rule", "set", "map", "element", "counter":
	default:
		c.pos--
		return c.unexpected("expected table, chain, rule, set, map, element or counter")
	}
	family, err := c.word("a family")
	if err != nil {
		return err
	}
	name, err := c.word("a table name")
	if err != nil {
		return err
	}
	if !ours(family, name) {
		ld.addForeign(family, name)
		return nil
	}
	switch verb {
	case "reset", "replace":
		return fmt.Errorf("%s %s is not supported", verb, obj)
	case "insert":
		if obj != "rule" {
			return fmt.Errorf("insert %s is not supported", obj)
		}
	}
	t := ld.ts.tables[family]
	if obj == "table" {
		return ld.tableCommand(c, verb, family)
	}
	if t == nil {
		if verb == "destroy" {
			return nil
		}
		return fmt.Errorf("table %s %s does not exist (No such file or directory)", family, name)
	}
	var objName string
	if objName, err = c.word("a name"); err != nil {
		return err
	}
	if objName == "handle" {
		c.pos--
		return c.unexpected("rule and object handles are not supported")
	}
	switch obj {
	case "chain":
		err = t.chainCommand(c, verb, objName)
	case "rule":
		err = t.ruleCommand(c, verb, objName)
	case "set", "map":
		err = t.setCommand(c, verb, obj, objName)
	case "element":
		s := t.Sets[objName]
		if s == nil {
			return fmt.Errorf("set %s does not exist (No such file or directory)", objName)
		}
		if verb == "flush" {
			return fmt.Errorf("flush element is not a command")
		}
		err = s.addElems(c, verb, t.countElem)
	case "counter":
		err = t.counterCommand(c, verb, objName)
	}
	if err == nil && !c.done() {
		err = c.unexpected("expected the end of the command")
	}
	return err
}

func (ld *loader) tableCommand(c *cursor, verb, family string) error {
	t := ld.ts.tables[family]
	switch verb {
	case "add", "create":
		if t != nil && verb == "create" {
			return fmt.Errorf("table %s %s exists (File exists)", family, TableName)
		}
		if t == nil {
			t = newTable(family)
			ld.ts.tables[family] = t
		}
		if c.accept("{") {
			for !c.accept("}") {
				switch {
				case c.accept(";"):
				case c.accept("comment"):
					s, err := c.str("a comment")
					if err != nil {
						return err
					}
					t.Comment = s
				case c.accept("flags"):
					fl, err := wordList(c)
					if err != nil {
						return err
					}
					t.Flags = fl
				default:
					return c.unexpected("expected comment or flags")
				}
			}
		}
	case "delete", "destroy":
		if t == nil && verb == "delete" {
			return fmt.Errorf("table %s %s does not exist (No such file or directory)", family, TableName)
		}
		delete(ld.ts.tables, family)
	case "flush":
		if t == nil {
			return fmt.Errorf("table %s %s does not exist (No such file or directory)", family, TableName)
		}
		// As the kernel does: every chain loses its rules; sets keep their elements.
		for _, ch := range t.Chains {
			ch.Rules = nil
		}
		t.recount()
	}
	if !c.done() {
		return c.unexpected("expected the end of the command")
	}
	return nil
}

func (t *Table) chainCommand(c *cursor, verb, name string) error {
	ch := t.Chains[name]
	switch verb {
	case "add", "create":
		if err := checkName("chain", name); err != nil {
			return err
		}
		spec := &Chain{Name: name}
		if c.accept("{") {
			if err := parseChainSpec(c, spec); err != nil {
				return err
			}
			if err := c.expect("}"); err != nil {
				return err
			}
		}
		if ch == nil {
			t.addChain(spec)
			return nil
		}
		if verb == "create" {
			return fmt.Errorf("chain %s exists (File exists)", name)
		}
		if spec.Hook != "" && !ch.sameBase(spec) {
			return fmt.Errorf("chain %s exists with another type, hook or priority (Operation not supported)", name)
		}
		if spec.Comment != "" {
			ch.Comment = spec.Comment
		}
		if spec.Policy != "" {
			ch.Policy = spec.Policy
		}
	case "flush":
		if ch == nil {
			return fmt.Errorf("chain %s does not exist (No such file or directory)", name)
		}
		for _, r := range ch.Rules {
			t.countRule(r, -1)
		}
		ch.Rules = nil
	case "delete", "destroy":
		if ch == nil {
			if verb == "delete" {
				return fmt.Errorf("chain %s does not exist (No such file or directory)", name)
			}
			return nil
		}
		if t.refs["chain "+name] > 0 {
			return fmt.Errorf("chain %s is in use by %s (Device or resource busy)", name, t.user("chain "+name))
		}
		for _, r := range ch.Rules {
			t.countRule(r, -1)
		}
		delete(t.Chains, name)
	}
	return nil
}

func (t *Table) ruleCommand(c *cursor, verb, chain string) error {
	ch := t.Chains[chain]
	if ch == nil {
		return fmt.Errorf("chain %s does not exist (No such file or directory)", chain)
	}
	if verb != "add" && verb != "insert" {
		return fmt.Errorf("%s rule is not supported (rules have no handles here)", verb)
	}
	if c.peekIs("index") || c.peekIs("handle") || c.peekIs("position") {
		return c.unexpected("rule positions are not supported")
	}
	r, err := parseRule(t.Family, c.toks[c.pos:])
	if err != nil {
		return fmt.Errorf("chain %s: %w", chain, err)
	}
	c.pos = len(c.toks)
	if verb == "insert" {
		ch.Rules = slices.Insert(ch.Rules, 0, r)
	} else {
		ch.Rules = append(ch.Rules, r)
	}
	t.countRule(r, 1)
	return nil
}

func (t *Table) setCommand(c *cursor, verb, kind, name string) error {
	s := t.Sets[name]
	if s != nil && s.kind() != kind {
		return fmt.Errorf("%s is a %s, not a %s", name, s.kind(), kind)
	}
	switch verb {
	case "add", "create":
		if err := checkName(kind, name); err != nil {
			return err
		}
		spec := &Set{Name: name, Map: kind == "map", elems: map[string]*elem{}}
		if err := c.expect("{"); err != nil {
			return err
		}
		if err := parseSetSpec(c, spec); err != nil {
			return err
		}
		if err := c.expect("}"); err != nil {
			return err
		}
		if err := spec.checkSpec(); err != nil {
			return err
		}
		if s == nil {
			t.Sets[name] = spec
			return nil
		}
		if verb == "create" {
			return fmt.Errorf("%s %s exists (File exists)", kind, name)
		}
		if !s.sameType(spec) || !slices.Equal(s.Flags, spec.Flags) {
			return fmt.Errorf("%s %s exists with another type or flags (File exists)", kind, name)
		}
	case "flush":
		if s == nil {
			return fmt.Errorf("%s %s does not exist (No such file or directory)", kind, name)
		}
		for _, e := range s.elems {
			t.countElem(e, -1)
		}
		s.elems = map[string]*elem{}
	case "delete", "destroy":
		if s == nil {
			if verb == "delete" {
				return fmt.Errorf("%s %s does not exist (No such file or directory)", kind, name)
			}
			return nil
		}
		if t.refs["set "+name] > 0 {
			return fmt.Errorf("%s %s is in use by %s (Device or resource busy)", kind, name, t.user("set "+name))
		}
		for _, e := range s.elems {
			t.countElem(e, -1)
		}
		delete(t.Sets, name)
	}
	return nil
}

func (t *Table) counterCommand(c *cursor, verb, name string) error {
	switch verb {
	case "add", "create":
		if err := checkName("counter", name); err != nil {
			return err
		}
		if t.Counters[name] && verb == "create" {
			return fmt.Errorf("counter %s exists (File exists)", name)
		}
		if c.accept("{") {
			for !c.done() && !c.peekIs("}") {
				c.next()
			}
			if err := c.expect("}"); err != nil {
				return err
			}
		}
		t.Counters[name] = true
	case "delete", "destroy":
		if !t.Counters[name] {
			if verb == "delete" {
				return fmt.Errorf("counter %s does not exist (No such file or directory)", name)
			}
			return nil
		}
		if t.refs["counter "+name] > 0 {
			return fmt.Errorf("counter %s is in use by %s (Device or resource busy)", name, t.user("counter "+name))
		}
		delete(t.Counters, name)
	case "flush":
		return fmt.Errorf("flush counter is not a command")
	}
	return nil
}
