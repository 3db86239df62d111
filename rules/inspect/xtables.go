package inspect

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/iptables/iptrace"
	"kube-proxy/rules/xtables"
)

// XTables is one iptables backend and family as the kernel holds it: kube-proxy's chains (the KUBE-*
// chains of the nat and filter tables and the jumps into them from the built-in chains) loaded into the
// tracer, and what was left out.
type XTables struct {
	Backend xtables.Backend
	Family  v1.IPFamily
	// Tables holds our chains and the jump rules into them.
	Tables *iptrace.Tables
	// Chains counts our chains per table; Rules our rules (jumps included); VirtualServers the IPVS
	// virtual servers of the family given to the tracer.
	Chains, Rules, VirtualServers int
	// Foreign lists the other rules of the built-in chains, with where they stand against our jump.
	Foreign []ForeignRule
	// Unreadable lists our rules the tracer does not model (left out of the walk).
	Unreadable []string
	// Save is the save tool's output per table, as read.
	Save map[string]string
}

// ForeignRule is a rule in a built-in chain that is not a jump into kube-proxy's chains.
type ForeignRule struct {
	Table, Chain string
	// Position is the rule's position in its chain, from 1.
	Position int
	// AheadOfUs is set when the rule comes before the chain's first jump into our chains.
	AheadOfUs bool
	Rule      string
}

// Empty reports whether the backend holds no kube-proxy chain.
func (x *XTables) Empty() bool { return x.Chains == 0 }

// tracedTables are the tables the tracer walks.
var tracedTables = []string{"nat", "filter"}

// ours reports whether a chain is kube-proxy's (ours or upstream's: they share the names).
func ours(chain string) bool { return strings.HasPrefix(chain, "KUBE-") }

var builtinChains = map[string]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}

// loadXTables builds an XTables from the save output of each table (table name → iptables-save text),
// with the node's ipsets and IPVS virtual servers of the family (mode ipvs' rules and lookups).
func loadXTables(backend xtables.Backend, family v1.IPFamily, saves map[string]string, sets []ipSet, vss []iptrace.VirtualServer) (*XTables, error) {
	ipv6 := family == v1.IPv6Protocol
	x := &XTables{Backend: backend, Family: family, Tables: iptrace.New(ipv6), Save: saves}
	for _, s := range sets {
		if s.family != family {
			continue
		}
		if err := x.Tables.SetIPSet(s.name, s.typ, s.members...); err != nil && ours(s.name) {
			x.Unreadable = append(x.Unreadable, "ipset "+err.Error())
		}
	}
	for _, vs := range vss {
		if vs.Addr.Is6() == ipv6 {
			if err := x.Tables.AddVirtualServer(vs); err != nil {
				x.Unreadable = append(x.Unreadable, "IPVS "+err.Error())
			} else {
				x.VirtualServers++
			}
		}
	}
	for _, table := range tracedTables {
		text, ok := saves[table]
		if !ok {
			continue
		}
		payload, err := x.filter(table, text, ipv6)
		if err != nil {
			return nil, err
		}
		if err := x.Tables.Restore(payload, iptrace.RestoreOptions{}); err != nil {
			return nil, fmt.Errorf("loading %s %s %s rules into the tracer: %w", backend, family, table, err)
		}
	}
	return x, nil
}

// filter keeps, of one table's save output, our chains with the rules the tracer reads and the jumps into
// them from built-in chains, as a restore payload; it records the rest.
func (x *XTables) filter(table, text string, ipv6 bool) ([]byte, error) {
	var head, body bytes.Buffer
	fmt.Fprintf(&head, "*%s\n", table)
	seenOurs := map[string]bool{} // built-in chains whose jump to us was seen
	position := map[string]int{}  // rules seen per chain
	var pending []ForeignRule     // foreign rules of built-in chains, AheadOfUs decided at the end
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	inTable := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "*"):
			inTable = line[1:] == table
			continue
		case !inTable, line == "", strings.HasPrefix(line, "#"), line == "COMMIT":
			continue
		case strings.HasPrefix(line, ":"):
			name, rest, _ := strings.Cut(line[1:], " ")
			policy, _, _ := strings.Cut(rest, " ")
			if builtinChains[name] {
				fmt.Fprintf(&head, ":%s %s [0:0]\n", name, policy)
			} else if ours(name) {
				fmt.Fprintf(&head, ":%s - [0:0]\n", name)
				x.Chains++
			}
			continue
		}
		words, err := splitWords(line)
		if err != nil || len(words) < 2 || words[0] != "-A" {
			return nil, fmt.Errorf("%s table: cannot read line %q", table, line)
		}
		chain := words[1]
		position[chain]++
		target := targetOf(words)
		switch {
		case ours(chain):
		case builtinChains[chain] && ours(target):
			seenOurs[chain] = true
		case builtinChains[chain]:
			pending = append(pending, ForeignRule{Table: table, Chain: chain, Position: position[chain], AheadOfUs: !seenOurs[chain], Rule: line})
			continue
		default:
			continue // another program's chain
		}
		if _, err := iptrace.ParseRule(words[2:], ipv6); err != nil {
			x.Unreadable = append(x.Unreadable, fmt.Sprintf("%s: %s (%v)", table, line, err))
			continue
		}
		body.WriteString(line)
		body.WriteByte('\n')
		x.Rules++
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, f := range pending {
		// A rule is ahead of us only in a chain that jumps to us at all.
		f.AheadOfUs = f.AheadOfUs && seenOurs[f.Chain]
		x.Foreign = append(x.Foreign, f)
	}
	head.Write(body.Bytes())
	head.WriteString("COMMIT\n")
	return head.Bytes(), nil
}

// targetOf returns the -j or -g target of a rule's words.
func targetOf(words []string) string {
	for i := 0; i+1 < len(words); i++ {
		if words[i] == "-j" || words[i] == "-g" || words[i] == "--jump" || words[i] == "--goto" {
			return words[i+1]
		}
	}
	return ""
}

// splitWords splits a save line into words (iptrace.Words).
func splitWords(line string) ([]string, error) { return iptrace.Words(line) }
