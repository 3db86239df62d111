package nftrace

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// TableName is the name of the tables the tracer models (in families ip and ip6).
const TableName = "kube-proxy"

// Table is one `kube-proxy` table.
type Table struct {
	// Family is "ip" or "ip6".
	Family string
	// Comment and Flags are the table's.
	Comment string
	Flags   []string
	// Chains, Sets (sets and maps) and Counters by name.
	Chains   map[string]*Chain
	Sets     map[string]*Set
	Counters map[string]bool

	seq   int                 // creation counter, to order base chains of equal priority
	refs  map[string]int      // "chain X", "set X", "counter X": how many rules and map elements refer to it
	hooks map[string][]*Chain // base chains by hook, in order; set by validate
}

func newTable(family string) *Table {
	return &Table{Family: family, Chains: map[string]*Chain{}, Sets: map[string]*Set{}, Counters: map[string]bool{},
		refs: map[string]int{}}
}

// countRule adds d to the reference counts of what r refers to.
func (t *Table) countRule(r *Rule, d int) {
	for _, ref := range r.refs {
		t.refs[ref] += d
	}
}

// countElem adds d to the reference count of the chain a map element jumps to.
func (t *Table) countElem(e *elem, d int) {
	if e.verdict.chain != "" {
		t.refs["chain "+e.verdict.chain] += d
	}
}

// recount computes the reference counts from scratch.
func (t *Table) recount() {
	t.refs = map[string]int{}
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			t.countRule(r, 1)
		}
	}
	for _, s := range t.Sets {
		for _, e := range s.elems {
			t.countElem(e, 1)
		}
	}
}

// user names a rule or map element referring to ref ("chain X", "set X", "counter X").
func (t *Table) user(ref string) string {
	for _, n := range slices.Sorted(maps.Keys(t.Chains)) {
		for _, r := range t.Chains[n].Rules {
			if slices.Contains(r.refs, ref) {
				return "a rule of chain " + n
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(t.Sets)) {
		for _, e := range t.Sets[n].elems {
			if "chain "+e.verdict.chain == ref {
				return "an element of map " + n
			}
		}
	}
	return "?"
}

func (t *Table) clone() *Table {
	n := *t
	n.Flags = slices.Clone(t.Flags)
	n.Chains = make(map[string]*Chain, len(t.Chains))
	for k, c := range t.Chains {
		cc := *c
		cc.Rules = slices.Clone(c.Rules)
		n.Chains[k] = &cc
	}
	n.Sets = make(map[string]*Set, len(t.Sets))
	for k, s := range t.Sets {
		ss := *s
		ss.elems = maps.Clone(s.elems)
		n.Sets[k] = &ss
	}
	n.Counters = maps.Clone(t.Counters)
	n.refs = maps.Clone(t.refs)
	n.hooks = nil
	return &n
}

// id names the table as nft does: "ip kube-proxy".
func (t *Table) id() string { return t.Family + " " + TableName }

// Chain is one chain; a base chain when Hook is set.
type Chain struct {
	// Name and Comment are the chain's.
	Name    string
	Comment string
	// Type ("filter", "nat", "route"), Hook ("prerouting", "input", "forward", "output", "postrouting"),
	// Priority (a number: nft's names are converted, dstnat - 10 is -110) and Policy ("accept" or "drop")
	// are set for base chains only.
	Type     string
	Hook     string
	Priority int
	Policy   string
	// Rules are the chain's rules in order.
	Rules []*Rule

	seq int
}

func (c *Chain) sameBase(o *Chain) bool {
	return c.Type == o.Type && c.Hook == o.Hook && c.Priority == o.Priority
}

// Set is a named set or map.
type Set struct {
	// Name is the set's or map's.
	Name string
	// Map is set for maps; DataType is then the value's type (only "verdict" is supported).
	Map      bool
	DataType string
	// KeyType lists the key's types, e.g. ipv4_addr, inet_proto, inet_service.
	KeyType []string
	// Flags (dynamic, timeout, interval, constant), Timeout and Comment are as declared.
	Flags   []string
	Timeout time.Duration
	Comment string

	elems map[string]*elem // by key
}

func (s *Set) kind() string {
	if s.Map {
		return "map"
	}
	return "set"
}

func (s *Set) interval() bool { return slices.Contains(s.Flags, "interval") }

func (s *Set) sameType(o *Set) bool {
	return s.Map == o.Map && s.DataType == o.DataType && slices.Equal(s.KeyType, o.KeyType)
}

// sortedElems returns the elements ordered by key.
func (s *Set) sortedElems() []*elem {
	out := slices.Collect(maps.Values(s.elems))
	slices.SortFunc(out, func(a, b *elem) int { return compareKeys(s.KeyType, a.key, b.key) })
	return out
}

func (s *Set) formatElem(e *elem) string {
	k := make([]string, len(e.key))
	for i, v := range e.key {
		k[i] = formatValue(s.KeyType[i], v)
	}
	out := strings.Join(k, " . ")
	if e.comment != "" {
		out += " comment " + quote(e.comment)
	}
	if s.Map {
		out += " : " + e.verdict.String()
	}
	return out
}

// Tables is the nftables state the tracer walks: the `kube-proxy` tables of families ip and ip6, as a
// kernel would hold them after the loaded transactions, plus the names of other tables seen in `nft list`
// output. It is safe for concurrent use.
type Tables struct {
	mu      sync.Mutex
	tables  map[string]*Table // by family
	foreign []string
}

// New returns an empty state.
func New() *Tables {
	return &Tables{tables: map[string]*Table{}}
}

// Clone returns an independent copy of the state.
func (ts *Tables) Clone() *Tables {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.clone()
}

func (ts *Tables) clone() *Tables {
	n := &Tables{tables: make(map[string]*Table, len(ts.tables)), foreign: slices.Clone(ts.foreign)}
	for k, t := range ts.tables {
		n.tables[k] = t.clone()
	}
	return n
}

// Families returns the families ("ip", "ip6") that have a kube-proxy table, sorted.
func (ts *Tables) Families() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Sorted(maps.Keys(ts.tables))
}

// Foreign returns the other tables seen in the loaded text ("inet filter", "ip nat", "ip6 kube-proxy" is
// never among them), sorted; they are not parsed and not traced.
func (ts *Tables) Foreign() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Clone(ts.foreign)
}

// Table returns the kube-proxy table of a family, or nil. It is the live state: do not change it, and do
// not use it while another goroutine loads.
func (ts *Tables) Table(family string) *Table {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.tables[family]
}

// Chains returns the chain names of a family's table, sorted.
func (ts *Tables) Chains(family string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.tables[family]
	if t == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(t.Chains))
}

// BaseChains returns a hook's base chains ("prerouting", "input", "forward", "output", "postrouting") in
// the order the kernel runs them.
func (ts *Tables) BaseChains(family, hook string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.tables[family]
	if t == nil {
		return nil
	}
	var out []string
	for _, c := range t.baseChains(hook) {
		out = append(out, c.Name)
	}
	return out
}

func (t *Table) baseChains(hook string) []*Chain {
	if t.hooks != nil {
		return t.hooks[hook]
	}
	return t.sortedBaseChains(hook)
}

func (t *Table) sortedBaseChains(hook string) []*Chain {
	var out []*Chain
	for _, c := range t.Chains {
		if c.Hook == hook {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *Chain) int {
		if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	return out
}

// Rules returns a chain's rules in canonical form (see Rule.String), or nil if the chain does not exist.
func (ts *Tables) Rules(family, chain string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.tables[family]
	if t == nil || t.Chains[chain] == nil {
		return nil
	}
	out := []string{}
	for _, r := range t.Chains[chain].Rules {
		out = append(out, r.String())
	}
	return out
}

// Sets returns the names of a family's sets and maps, sorted.
func (ts *Tables) Sets(family string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.tables[family]
	if t == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(t.Sets))
}

// Elements returns a set's or map's elements sorted by key, in canonical form: `172.30.0.41 . tcp . 80`
// for a set, `KEY [comment "..."] : goto CHAIN` for a map; nil if it does not exist.
func (ts *Tables) Elements(family, set string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.tables[family]
	if t == nil || t.Sets[set] == nil {
		return nil
	}
	s := t.Sets[set]
	out := []string{}
	for _, e := range s.sortedElems() {
		out = append(out, s.formatElem(e))
	}
	return out
}

// Dump prints the state as one knftables-style transaction that Load accepts: for each family, the
// table, its counters, sets and maps, chains (sorted by name), every chain's rules in order, and the
// elements sorted by key; everything in canonical form, so the same state prints the same whichever format
// it was loaded from. Set sizes, counter values and element expiry are not kept and not printed.
func (ts *Tables) Dump() string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var b strings.Builder
	for _, fam := range slices.Sorted(maps.Keys(ts.tables)) {
		t := ts.tables[fam]
		id := t.id()
		fmt.Fprintf(&b, "add table %s", id)
		if t.Comment != "" || len(t.Flags) > 0 {
			b.WriteString(" {")
			if t.Comment != "" {
				fmt.Fprintf(&b, " comment %s ;", quote(t.Comment))
			}
			if len(t.Flags) > 0 {
				fmt.Fprintf(&b, " flags %s ;", strings.Join(t.Flags, ","))
			}
			b.WriteString(" }")
		}
		b.WriteByte('\n')
		for _, n := range slices.Sorted(maps.Keys(t.Counters)) {
			fmt.Fprintf(&b, "add counter %s %s\n", id, n)
		}
		for _, n := range slices.Sorted(maps.Keys(t.Sets)) {
			s := t.Sets[n]
			typ := strings.Join(s.KeyType, " . ")
			if s.Map {
				typ += " : " + s.DataType
			}
			fmt.Fprintf(&b, "add %s %s %s { type %s ;", s.kind(), id, n, typ)
			if len(s.Flags) > 0 {
				fmt.Fprintf(&b, " flags %s ;", strings.Join(s.Flags, ","))
			}
			if s.Timeout > 0 {
				fmt.Fprintf(&b, " timeout %ds ;", int64(s.Timeout/time.Second))
			}
			if s.Comment != "" {
				fmt.Fprintf(&b, " comment %s ;", quote(s.Comment))
			}
			b.WriteString(" }\n")
		}
		chains := slices.Sorted(maps.Keys(t.Chains))
		for _, n := range chains {
			c := t.Chains[n]
			fmt.Fprintf(&b, "add chain %s %s", id, n)
			if c.Hook != "" || c.Comment != "" {
				b.WriteString(" {")
				if c.Hook != "" {
					fmt.Fprintf(&b, " type %s hook %s priority %d ;", c.Type, c.Hook, c.Priority)
					if c.Policy != "accept" {
						fmt.Fprintf(&b, " policy %s ;", c.Policy)
					}
				}
				if c.Comment != "" {
					fmt.Fprintf(&b, " comment %s ;", quote(c.Comment))
				}
				b.WriteString(" }")
			}
			b.WriteByte('\n')
		}
		for _, n := range chains {
			for _, r := range t.Chains[n].Rules {
				fmt.Fprintf(&b, "add rule %s %s %s\n", id, n, r)
			}
		}
		for _, n := range slices.Sorted(maps.Keys(t.Sets)) {
			s := t.Sets[n]
			for _, e := range s.sortedElems() {
				fmt.Fprintf(&b, "add element %s %s { %s }\n", id, n, s.formatElem(e))
			}
		}
	}
	return b.String()
}
