package xtables

import (
	"bytes"
	"fmt"
	"slices"

	"kube-proxy/proxy"
)

// JumpRule is a rule in a built-in chain that sends traffic into one of our chains. The modes writing
// iptables rules ensure each with `iptables -C` and, when missing, `iptables -I` (prepend), after creating
// Target if needed, as upstream does. The rule is Args, then `-m comment --comment Comment` when Comment
// is not empty, then `-j Target`.
type JumpRule struct {
	Table   string
	Chain   string // the built-in chain holding the rule
	Target  string // our chain
	Args    []string
	Comment string
}

// RuleSpec returns the rule's arguments as given to iptables after the chain name.
func (j JumpRule) RuleSpec() []string {
	spec := slices.Clone(j.Args)
	if j.Comment != "" {
		spec = append(spec, "-m", "comment", "--comment", j.Comment)
	}
	return append(spec, "-j", j.Target)
}

// LocalArgs renders a local-traffic match as iptables arguments matching traffic from a local pod, and
// their negation; nil when local traffic cannot be told apart.
func LocalArgs(m proxy.LocalMatch) (ifLocal, ifNotLocal []string) {
	switch {
	case m.CIDR.IsValid():
		s := m.CIDR.String()
		return []string{"-s", s}, []string{"!", "-s", s}
	case m.Interface != "":
		name := m.Interface
		if m.Prefix {
			name += "+"
		}
		return []string{"-i", name}, []string{"!", "-i", name}
	}
	return nil, nil
}

// DeleteChainsPayload returns the iptables-restore payload that empties chains of table and deletes them,
// in one transaction (a chain still jumped to from a chain not in the list makes it fail whole).
func DeleteChainsPayload(table string, chains []string) []byte {
	return chainsPayload(table, chains, true)
}

// FlushChainsPayload returns the iptables-restore payload that empties chains of table, which drops the
// jumps between them; chains still jumped to from elsewhere are emptied too.
func FlushChainsPayload(table string, chains []string) []byte {
	return chainsPayload(table, chains, false)
}

func chainsPayload(table string, chains []string, del bool) []byte {
	var p bytes.Buffer
	fmt.Fprintf(&p, "*%s\n", table)
	for _, c := range chains {
		fmt.Fprintf(&p, ":%s - [0:0]\n", c)
	}
	if del {
		for _, c := range chains {
			fmt.Fprintf(&p, "-X %s\n", c)
		}
	}
	p.WriteString("COMMIT\n")
	return p.Bytes()
}
