package nftables

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// kernel applies transactions to one family's kube-proxy table and reads the table back. The netlink
// writer implements it in production; tests use knftables' Fake through the same commands.
type kernel interface {
	// Run applies a transaction atomically: all of it or nothing.
	Run(ctx context.Context, t *tx) error
	// Read returns what the table holds; nil when the table does not exist.
	Read(ctx context.Context) (*kernelState, error)
	// RuleHandles returns the handles of the rules of each of chains, in the chain's order; a chain
	// that does not exist has none.
	RuleHandles(ctx context.Context, chains []string) (map[string][]uint64, error)
}

// kernelState is what the kernel's table holds: its chains (with the hook, type and priority of the base
// chains), its named sets and maps, and the elements of those that are not affinity sets.
type kernelState struct {
	chains map[string]bool
	bases  map[string]chainSpec
	sets   map[string]bool
	elems  map[elemRef]elemValue
}

func newKernelState() *kernelState {
	return &kernelState{chains: map[string]bool{}, bases: map[string]chainSpec{}, sets: map[string]bool{}, elems: map[elemRef]elemValue{}}
}

// diff compares the kernel's table with what the mirror says was written, and names the first
// difference ("" when there is none). Chains flushed and waiting to be deleted may be there or not. The
// rules inside chains are not compared: only kube-proxy may change its table (upstream's README for this
// mode says so), and what others do by accident (a flushed ruleset, a deleted table, chain or element) is
// seen.
func (m *mirror) diff(ks *kernelState) string {
	if ks == nil {
		return "the table is gone"
	}
	if m.base == nil {
		return "nothing was written yet"
	}
	chains := map[string]bool{}
	for _, c := range m.base.chains {
		chains[c.spec.name] = true
		if c.spec.hook == "" {
			continue
		}
		if b, ok := ks.bases[c.spec.name]; ok && (b.hook != c.spec.hook || b.typ != c.spec.typ || b.prio != c.spec.prio) {
			return fmt.Sprintf("base chain %s is now type %s hook %s priority %d", c.spec.name, b.typ, b.hook, b.prio)
		}
	}
	sets := map[string]bool{}
	for _, s := range m.base.sets {
		sets[s.name] = true
	}
	for name := range m.svcs {
		objs := m.written(name)
		for _, c := range objs.chains {
			chains[c.spec.name] = true
		}
		for _, s := range objs.sets {
			sets[s.name] = true
		}
	}
	for _, c := range slices.Sorted(maps.Keys(chains)) {
		if !ks.chains[c] {
			return fmt.Sprintf("chain %s is gone", c)
		}
	}
	for _, c := range slices.Sorted(maps.Keys(ks.chains)) {
		if _, stale := m.stale[c]; !chains[c] && !stale {
			return fmt.Sprintf("chain %s was added", c)
		}
	}
	for _, s := range slices.Sorted(maps.Keys(sets)) {
		if !ks.sets[s] {
			return fmt.Sprintf("set %s is gone", s)
		}
	}
	want := map[elemRef]elemValue{}
	for ref, e := range m.elems {
		if e.present {
			want[ref] = e.written
		}
	}
	if m.base.nodePortSet {
		for _, a := range m.base.nodePortIPs {
			want[elemRef{set: setNodePortIPs, key: elemKey{addr: a}}] = elemValue{}
		}
	}
	for _, ref := range slices.SortedFunc(maps.Keys(want), compareRef) {
		got, ok := ks.elems[ref]
		switch {
		case !ok:
			return fmt.Sprintf("an element of %s is gone", ref.set)
		case got != want[ref]:
			return fmt.Sprintf("an element of %s was changed", ref.set)
		}
	}
	for _, ref := range slices.SortedFunc(maps.Keys(ks.elems), compareRef) {
		if _, ok := want[ref]; !ok && sets[ref.set] {
			return fmt.Sprintf("an element was added to %s", ref.set)
		}
	}
	return ""
}
