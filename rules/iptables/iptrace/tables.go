package iptrace

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// builtinChains lists each table's built-in chains in iptables-save's order.
var builtinChains = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":    {"PREROUTING", "OUTPUT"},
}

// standardTargets are the targets that are not chains.
var standardTargets = map[string]string{ // target -> the only table it is valid in ("" any)
	"ACCEPT": "", "DROP": "", "RETURN": "", "MARK": "", "REJECT": "filter",
	"DNAT": "nat", "MASQUERADE": "nat", "SNAT": "nat", "REDIRECT": "nat",
}

// Chain is one chain of a table.
type Chain struct {
	Name    string
	Builtin bool
	Policy  string // built-in chains: ACCEPT or DROP
	Rules   []*Rule
}

// Table is one iptables table.
type Table struct {
	Name   string
	Chains map[string]*Chain
}

func newTable(name string) *Table {
	t := &Table{Name: name, Chains: map[string]*Chain{}}
	for _, c := range builtinChains[name] {
		t.Chains[c] = &Chain{Name: c, Builtin: true, Policy: "ACCEPT"}
	}
	return t
}

// clone copies the table and its chains; rules are immutable and shared.
func (t *Table) clone() *Table {
	n := &Table{Name: t.Name, Chains: make(map[string]*Chain, len(t.Chains))}
	for k, c := range t.Chains {
		cc := *c
		cc.Rules = slices.Clone(c.Rules)
		n.Chains[k] = &cc
	}
	return n
}

// references counts the rules jumping to chain.
func (t *Table) references(chain string) int {
	n := 0
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			if r.Target == chain {
				n++
			}
		}
	}
	return n
}

// Tables is the iptables state of one IP family, as a fake kernel: payloads are applied with the semantics
// of iptables-restore (with or without --noflush) and direct commands with those of iptables, and the state
// prints back as iptables-save does. It also holds what rules and packets may meet besides iptables: the
// ipsets that "-m set" matches (SetIPSet) and the IPVS virtual servers (AddVirtualServer). It is safe for
// concurrent use.
type Tables struct {
	mu     sync.Mutex
	ipv6   bool
	tables map[string]*Table
	sets   map[string]*ipSet
	vss    map[vsKey]*VirtualServer
	// counters are the nfacct objects that exist (SetCounters); nil: not modelled.
	counters map[string]bool
}

// New returns an empty state for IPv4 (ipv6 false) or IPv6.
func New(ipv6 bool) *Tables {
	return &Tables{ipv6: ipv6, tables: map[string]*Table{}}
}

// Clone returns an independent copy of the state.
func (ts *Tables) Clone() *Tables {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	n := New(ts.ipv6)
	for k, t := range ts.tables {
		n.tables[k] = t.clone()
	}
	n.sets = maps.Clone(ts.sets) // sets and virtual servers are replaced whole, never changed in place
	n.vss = maps.Clone(ts.vss)
	n.counters = maps.Clone(ts.counters)
	return n
}

// Table returns a table, creating it with its built-in chains if needed (as the kernel loads a table on
// first use). It returns nil for an unknown table name. The table is the live state: do not use it while
// other goroutines change the state.
func (ts *Tables) Table(name string) *Table {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.table(name)
}

func (ts *Tables) table(name string) *Table {
	if t, ok := ts.tables[name]; ok {
		return t
	}
	if _, ok := builtinChains[name]; !ok {
		return nil
	}
	t := newTable(name)
	ts.tables[name] = t
	return t
}

// TableNames returns the names of the tables in use, sorted.
func (ts *Tables) TableNames() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Sorted(maps.Keys(ts.tables))
}

// Chains returns the chain names of a table, built-in ones first in iptables' order, then the others sorted.
func (ts *Tables) Chains(table string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.chains(table)
}

func (ts *Tables) chains(table string) []string {
	t := ts.tables[table]
	if t == nil {
		return nil
	}
	out := slices.Clone(builtinChains[table])
	var user []string
	for name, c := range t.Chains {
		if !c.Builtin {
			user = append(user, name)
		}
	}
	slices.Sort(user)
	return append(out, user...)
}

// Rules returns a chain's rules in iptables-save form (without "-A chain"), or nil if it does not exist.
func (ts *Tables) Rules(table, chain string) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.tables[table]
	if t == nil || t.Chains[chain] == nil {
		return nil
	}
	out := []string{}
	for _, r := range t.Chains[chain].Rules {
		out = append(out, r.String())
	}
	return out
}

// Save prints one table as iptables-save does (without its "#" comment lines); "" if the table is unused.
func (ts *Tables) Save(table string) string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.save(table)
}

func (ts *Tables) save(table string) string {
	t := ts.tables[table]
	if t == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	names := ts.chains(table)
	for _, n := range names {
		c := t.Chains[n]
		if c.Builtin {
			fmt.Fprintf(&b, ":%s %s [0:0]\n", n, c.Policy)
		} else {
			fmt.Fprintf(&b, ":%s - [0:0]\n", n)
		}
	}
	for _, n := range names {
		for _, r := range t.Chains[n].Rules {
			s := r.String()
			b.WriteString("-A " + n)
			if s != "" {
				b.WriteString(" " + s)
			}
			b.WriteByte('\n')
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// SaveAll prints every table in use, in name order.
func (ts *Tables) SaveAll() string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var b strings.Builder
	for _, n := range slices.Sorted(maps.Keys(ts.tables)) {
		b.WriteString(ts.save(n))
	}
	return b.String()
}

// RestoreOptions are iptables-restore's flags.
type RestoreOptions struct {
	// NoFlush keeps what the payload does not mention (--noflush); without it each table in the payload is
	// replaced whole.
	NoFlush bool
	// Test parses and checks the payload without applying it (--test).
	Test bool
}

// RestoreError is a failed iptables-restore: the line and the reason, worded after iptables-nft.
type RestoreError struct {
	Line int
	Msg  string
}

func (e *RestoreError) Error() string {
	return fmt.Sprintf("iptables-restore: line %d failed: %s", e.Line, e.Msg)
}

// Restore applies an iptables-restore payload. Each table is applied at its COMMIT, atomically: an error
// leaves that table (and those after it) as they were, while tables committed earlier in the payload stay
// applied, as with the real command.
func (ts *Tables) Restore(payload []byte, opts RestoreOptions) error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(payload))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	var work *Table
	lineNo := 0
	fail := func(format string, a ...any) error {
		return &RestoreError{Line: lineNo, Msg: fmt.Sprintf(format, a...)}
	}
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		switch {
		case line[0] == '*':
			if work != nil {
				return fail("table %q not committed before %q", work.Name, line)
			}
			name := line[1:]
			if _, ok := builtinChains[name]; !ok {
				return fail("can't initialize iptables table %q: Table does not exist", name)
			}
			if opts.NoFlush && ts.tables[name] != nil {
				work = ts.tables[name].clone()
			} else {
				work = newTable(name)
				if opts.NoFlush {
					// The table was never used: it starts empty anyway.
				} else if old := ts.tables[name]; old != nil {
					// Without --noflush, built-in policies are kept unless the payload sets them.
					for _, c := range builtinChains[name] {
						work.Chains[c].Policy = old.Chains[c].Policy
					}
				}
			}
			continue
		case line == "COMMIT":
			if work == nil {
				return fail("COMMIT outside a table")
			}
			if !opts.Test {
				ts.tables[work.Name] = work
			}
			work = nil
			continue
		}
		if work == nil {
			return fail("no table specified")
		}
		if line[0] == ':' {
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				return fail("bad chain line %q", line)
			}
			name, policy := f[0], f[1]
			if c := work.Chains[name]; c != nil && c.Builtin {
				if policy != "-" {
					if policy != "ACCEPT" && policy != "DROP" {
						return fail("bad policy %q", policy)
					}
					c.Policy = policy
				}
				continue
			}
			if policy != "-" {
				return fail("can't set policy %q on user chain %q", policy, name)
			}
			if err := checkChainName(name); err != nil {
				return fail("%v", err)
			}
			if c := work.Chains[name]; c != nil {
				c.Rules = nil
			} else {
				work.Chains[name] = &Chain{Name: name}
			}
			continue
		}
		args, err := tokenize(line)
		if err != nil {
			return fail("%v", err)
		}
		if _, err := ts.command(work, args); err != nil {
			return fail("%v", err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading payload: %w", err)
	}
	if work != nil {
		lineNo++
		return fail("COMMIT expected at end of table %q", work.Name)
	}
	return nil
}

func checkChainName(name string) error {
	switch {
	case name == "" || len(name) > 28:
		return fmt.Errorf("invalid chain name %q", name)
	case strings.HasPrefix(name, "-") || strings.HasPrefix(name, "!"):
		return fmt.Errorf("invalid chain name %q", name)
	}
	if _, std := standardTargets[name]; std {
		return fmt.Errorf("invalid chain name %q", name)
	}
	return nil
}

// Run applies one iptables command to the state (the words after "iptables", e.g. "-t", "nat", "-I",
// "PREROUTING", "-j", "KUBE-SERVICES"), with the semantics of the iptables command: -N, -X, -F, -A, -I,
// -D, -C, -S, -P, and -L (which only tells whether a chain exists). "-w" with its argument, "-W", "-n",
// "-v" and "-x" are ignored. -S returns its listing; an error is what iptables would report (for -C: the
// rule does not exist).
func (ts *Tables) Run(args ...string) (string, error) {
	table := "filter"
	var rest []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "-t", "--table":
			if i+1 >= len(args) {
				return "", fmt.Errorf("option %q requires an argument", args[i])
			}
			table = args[i+1]
			i++
		case "-w", "--wait":
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
			}
		case "-W", "--wait-interval":
			i++
		case "-n", "--numeric", "-v", "--verbose", "-x", "--exact":
		default:
			rest = append(rest, args[i])
		}
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.table(table)
	if t == nil {
		return "", fmt.Errorf("can't initialize iptables table %q: Table does not exist", table)
	}
	return ts.command(t, rest)
}

// command applies one command to table t.
func (ts *Tables) command(t *Table, args []string) (string, error) {
	if len(args) == 0 {
		return "", fmt.Errorf("no command specified")
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "-N", "--new-chain":
		return "", newChain(t, args)
	case "-X", "--delete-chain":
		return "", deleteChain(t, cmd, args)
	case "-F", "--flush":
		return "", flushChain(t, cmd, args)
	case "-P", "--policy":
		return "", setPolicy(t, cmd, args)
	case "-S", "--list-rules":
		return ts.listRules(t, args)
	case "-L", "--list":
		return ts.list(t, args)
	case "-A", "--append", "-I", "--insert", "-D", "--delete", "-C", "--check":
		return "", ts.ruleCommand(t, cmd, args)
	}
	return "", fmt.Errorf("command %q not supported by iptrace", cmd)
}

// chainArg takes the chain that args starts with, for command cmd: the chain, its name and the words after
// it. When the chain does not exist it returns its name with the error.
func chainArg(t *Table, cmd string, args []string) (*Chain, string, []string, error) {
	if len(args) == 0 {
		return nil, "", args, fmt.Errorf("%s needs a chain", cmd)
	}
	name := args[0]
	c := t.Chains[name]
	if c == nil {
		return nil, name, args, fmt.Errorf("chain %q does not exist", name)
	}
	return c, name, args[1:], nil
}

// newChain is -N.
func newChain(t *Table, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("-N needs one chain name")
	}
	if err := checkChainName(args[0]); err != nil {
		return err
	}
	if t.Chains[args[0]] != nil {
		return fmt.Errorf("chain %q already exists", args[0])
	}
	t.Chains[args[0]] = &Chain{Name: args[0]}
	return nil
}

// deleteChain is -X: without a chain it deletes every empty, unreferenced user chain.
func deleteChain(t *Table, cmd string, args []string) error {
	if len(args) == 0 {
		for name, c := range t.Chains {
			if !c.Builtin && t.references(name) == 0 && len(c.Rules) == 0 {
				delete(t.Chains, name)
			}
		}
		return nil
	}
	c, name, _, err := chainArg(t, cmd, args)
	if err != nil {
		return fmt.Errorf("deleting chain %q: No chain/target/match by that name", name)
	}
	switch {
	case c.Builtin:
		return fmt.Errorf("deleting chain %q: built-in chains cannot be deleted", name)
	case len(c.Rules) > 0 || t.references(name) > 0:
		return fmt.Errorf("CHAIN_DEL failed (Device or resource busy): chain %s", name)
	}
	delete(t.Chains, name)
	return nil
}

// flushChain is -F: without a chain it flushes them all.
func flushChain(t *Table, cmd string, args []string) error {
	if len(args) == 0 {
		for _, c := range t.Chains {
			c.Rules = nil
		}
		return nil
	}
	c, _, _, err := chainArg(t, cmd, args)
	if err != nil {
		return err
	}
	c.Rules = nil
	return nil
}

// setPolicy is -P.
func setPolicy(t *Table, cmd string, args []string) error {
	c, name, args, err := chainArg(t, cmd, args)
	if err != nil {
		return err
	}
	if !c.Builtin || len(args) != 1 || (args[0] != "ACCEPT" && args[0] != "DROP") {
		return fmt.Errorf("bad policy for chain %q", name)
	}
	c.Policy = args[0]
	return nil
}

// listed returns the chains a listing names: the one in args, or every chain of t. A chain that does not
// exist is an error, its text ending in missing (as each listing's tool words it).
func (ts *Tables) listed(t *Table, args []string, missing string) ([]string, error) {
	if len(args) == 0 {
		return ts.chains(t.Name), nil
	}
	if t.Chains[args[0]] == nil {
		return nil, fmt.Errorf("chain %q does not exist%s", args[0], missing)
	}
	return []string{args[0]}, nil
}

// listRules is -S: the chains' definitions, then their rules.
func (ts *Tables) listRules(t *Table, args []string) (string, error) {
	names, err := ts.listed(t, args, "")
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, n := range names {
		if c := t.Chains[n]; c.Builtin {
			fmt.Fprintf(&b, "-P %s %s\n", n, c.Policy)
		} else {
			fmt.Fprintf(&b, "-N %s\n", n)
		}
	}
	for _, n := range names {
		for _, r := range t.Chains[n].Rules {
			b.WriteString(strings.TrimRight("-A "+n+" "+r.String(), " ") + "\n")
		}
	}
	return b.String(), nil
}

// list is -L. Only whether the chain exists is modelled; the listing has one header line per chain.
func (ts *Tables) list(t *Table, args []string) (string, error) {
	names, err := ts.listed(t, args, ": No chain/target/match by that name")
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, n := range names {
		if c := t.Chains[n]; c.Builtin {
			fmt.Fprintf(&b, "Chain %s (policy %s)\n", n, c.Policy)
		} else {
			fmt.Fprintf(&b, "Chain %s (%d references)\n", n, t.references(n))
		}
	}
	return b.String(), nil
}

// ruleCommand is -A, -I, -D and -C: a chain, for -I and -D an optional position, then a rule (for -D a
// position alone deletes the rule there).
func (ts *Tables) ruleCommand(t *Table, cmd string, args []string) error {
	c, name, args, err := chainArg(t, cmd, args)
	if err != nil {
		return fmt.Errorf("%s: No chain/target/match by that name", err)
	}
	pos := -1
	if (cmd == "-I" || cmd == "--insert" || cmd == "-D" || cmd == "--delete") && len(args) > 0 {
		if n, err := strconv.Atoi(args[0]); err == nil {
			pos = n
			args = args[1:]
		}
	}
	if (cmd == "-D" || cmd == "--delete") && pos >= 0 {
		if len(args) > 0 || pos < 1 || pos > len(c.Rules) {
			return fmt.Errorf("index of deletion too big")
		}
		c.Rules = slices.Delete(c.Rules, pos-1, pos)
		return nil
	}
	r, err := ts.parseRuleFor(t, c, args)
	if err != nil {
		return err
	}
	spec := r.String()
	find := func() int {
		return slices.IndexFunc(c.Rules, func(x *Rule) bool { return x.String() == spec })
	}
	switch cmd {
	case "-A", "--append":
		c.Rules = append(c.Rules, r)
	case "-I", "--insert":
		if pos < 0 {
			pos = 1
		}
		if pos < 1 || pos > len(c.Rules)+1 {
			return fmt.Errorf("index of insertion too big")
		}
		c.Rules = slices.Insert(c.Rules, pos-1, r)
	case "-D", "--delete":
		i := find()
		if i < 0 {
			return fmt.Errorf("bad rule (does a matching rule exist in chain %s?)", name)
		}
		c.Rules = slices.Delete(c.Rules, i, i+1)
	case "-C", "--check":
		if find() < 0 {
			return fmt.Errorf("bad rule (does a matching rule exist in chain %s?)", name)
		}
	}
	return nil
}

// parseRuleFor parses a rule for chain c of table t and checks what it refers to: ipsets, nfacct objects
// and its target.
func (ts *Tables) parseRuleFor(t *Table, c *Chain, args []string) (*Rule, error) {
	r, err := ParseRule(args, ts.ipv6)
	if err != nil {
		return nil, err
	}
	if err := ts.checkSets(r); err != nil {
		return nil, err
	}
	if err := ts.checkCounters(r); err != nil {
		return nil, err
	}
	if err := ts.checkTarget(t, c, r); err != nil {
		return nil, err
	}
	return r, nil
}

// SetCounters tells the state which nfacct objects exist, replacing what it was told before. Once it has
// been called, a rule whose nfacct match names another object is refused, as the kernel refuses it;
// before, any name is taken (rules read back from a kernel name only objects that exist).
func (ts *Tables) SetCounters(names ...string) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.counters = map[string]bool{}
	for _, n := range names {
		ts.counters[n] = true
	}
}

// checkCounters refuses a rule naming an nfacct object that does not exist, when they are modelled.
func (ts *Tables) checkCounters(r *Rule) error {
	if ts.counters == nil {
		return nil
	}
	for _, m := range r.Matches {
		if m.Module == "nfacct" && !ts.counters[m.NFAcctName] {
			return fmt.Errorf("nfacct object %s: No such file or directory", m.NFAcctName)
		}
	}
	return nil
}

func (ts *Tables) checkTarget(t *Table, c *Chain, r *Rule) error {
	if r.Target == "" {
		return nil
	}
	if only, std := standardTargets[r.Target]; std {
		if only != "" && only != t.Name {
			if r.Target == "REJECT" {
				return fmt.Errorf("the %q table is not intended for filtering, the use of REJECT is therefore inhibited", t.Name)
			}
			return fmt.Errorf("target %s is only valid in the %s table", r.Target, only)
		}
		if r.Target == "DROP" && t.Name == "nat" {
			return fmt.Errorf("the \"nat\" table is not intended for filtering, the use of DROP is therefore inhibited")
		}
		if (r.Target == "RETURN" || r.Target == "ACCEPT" || r.Target == "DROP") && r.Goto {
			return fmt.Errorf("cannot goto %s", r.Target)
		}
		return nil
	}
	if t.Chains[r.Target] == nil || t.Chains[r.Target].Builtin {
		return fmt.Errorf("chain '%s' does not exist", r.Target)
	}
	if r.Target == c.Name {
		return fmt.Errorf("chain %s jumps to itself", c.Name)
	}
	return nil
}
