package nftrace

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// validate checks what the kernel checks when a transaction commits: every chain, set, map and counter a
// rule or map element names exists; lookups use keys of the set's type; there are no loops; and NAT and
// reject statements are only reachable from base chains whose type and hook allow them.
func (t *Table) validate() error {
	for _, cn := range slices.Sorted(maps.Keys(t.Chains)) {
		for i, r := range t.Chains[cn].Rules {
			if err := t.checkRule(r); err != nil {
				return fmt.Errorf("chain %s rule %d (%s): %w", cn, i+1, r, err)
			}
		}
	}
	for _, sn := range slices.Sorted(maps.Keys(t.Sets)) {
		for _, e := range t.Sets[sn].elems {
			if c := e.verdict.chain; c != "" && t.Chains[c] == nil {
				return fmt.Errorf("map %s element %s: %s to missing chain %s", sn, e.keyString(), e.verdict.kind, c)
			}
		}
	}
	succ := make(map[string][]string, len(t.Chains))
	for n, c := range t.Chains {
		succ[n] = t.successors(c)
	}
	if err := t.checkLoops(succ); err != nil {
		return err
	}
	for _, cn := range slices.Sorted(maps.Keys(t.Chains)) {
		if b := t.Chains[cn]; b.Hook != "" {
			if err := t.checkHookContext(b, succ); err != nil {
				return err
			}
		}
	}
	t.indexHooks()
	return nil
}

// indexHooks records each hook's base chains in the order they run.
func (t *Table) indexHooks() {
	t.hooks = map[string][]*Chain{}
	for h := range hooks {
		t.hooks[h] = t.sortedBaseChains(h)
	}
}

func (t *Table) checkRule(r *Rule) error {
	for _, c := range r.chainRefs() {
		if t.Chains[c] == nil {
			return fmt.Errorf("jump or goto to missing chain %s", c)
		}
	}
	for _, c := range r.counterRefs() {
		if !t.Counters[c] {
			return fmt.Errorf("missing counter %s", c)
		}
	}
	check := func(name string, sels []selector, wantMap bool) error {
		s := t.Sets[name]
		switch {
		case s == nil:
			return fmt.Errorf("missing set or map %s", name)
		case s.Map != wantMap && wantMap:
			return fmt.Errorf("vmap on %s, which is a set", name)
		case s.Map != wantMap:
			return fmt.Errorf("lookup in %s, which is a map", name)
		case !slices.Equal(s.KeyType, selectorTypes(sels)):
			return fmt.Errorf("key %s (%s) does not match %s %s (%s)", joinSelectors(sels),
				strings.Join(selectorTypes(sels), " . "), s.kind(), name, strings.Join(s.KeyType, " . "))
		}
		return nil
	}
	for _, it := range r.items {
		var err error
		switch it := it.(type) {
		case *matchItem:
			if it.set != "" {
				err = check(it.set, it.sels, false)
			}
		case *vmapItem:
			if it.set != "" {
				err = check(it.set, it.sels, true)
			}
		case *updateItem:
			err = check(it.set, it.sels, false)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// successors lists the chains a chain can jump or go to, through rules and verdict maps.
func (t *Table) successors(c *Chain) []string {
	var out []string
	for _, r := range c.Rules {
		out = append(out, r.chainRefs()...)
		for _, it := range r.items {
			if v, ok := it.(*vmapItem); ok && v.set != "" {
				if s := t.Sets[v.set]; s != nil {
					for _, e := range s.elems {
						if e.verdict.chain != "" {
							out = append(out, e.verdict.chain)
						}
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// checkLoops fails if a chain can reach itself (the kernel's "Too many links").
func (t *Table) checkLoops(succ map[string][]string) error {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var visit func(name string) error
	visit = func(name string) error {
		switch color[name] {
		case grey:
			i := slices.Index(stack, name)
			return fmt.Errorf("chain loop %s -> %s (Too many links)", strings.Join(stack[i:], " -> "), name)
		case black:
			return nil
		}
		color[name] = grey
		stack = append(stack, name)
		for _, n := range succ[name] {
			if t.Chains[n] == nil {
				continue
			}
			if err := visit(n); err != nil {
				return err
			}
		}
		stack = stack[:len(stack)-1]
		color[name] = black
		return nil
	}
	for _, n := range slices.Sorted(maps.Keys(t.Chains)) {
		if err := visit(n); err != nil {
			return err
		}
	}
	return nil
}

// checkHookContext checks the statements of every chain reachable from base chain b are allowed there.
func (t *Table) checkHookContext(b *Chain, succ map[string][]string) error {
	seen := map[string]bool{b.Name: true}
	queue := []string{b.Name}
	for len(queue) > 0 {
		c := t.Chains[queue[0]]
		queue = queue[1:]
		for i, r := range c.Rules {
			for _, it := range r.items {
				var bad string
				switch it.(type) {
				case *dnatItem:
					if b.Type != "nat" || (b.Hook != "prerouting" && b.Hook != "output") {
						bad = "dnat needs a nat chain on the prerouting or output hook"
					}
				case *masqItem:
					if b.Type != "nat" || b.Hook != "postrouting" {
						bad = "masquerade needs a nat chain on the postrouting hook"
					}
				case *rejectItem:
					if b.Hook == "postrouting" {
						bad = "reject is not allowed on the postrouting hook"
					}
				}
				if bad != "" {
					return fmt.Errorf("chain %s rule %d (%s), reached from base chain %s (type %s hook %s): %s (Operation not supported)",
						c.Name, i+1, r, b.Name, b.Type, b.Hook, bad)
				}
			}
		}
		for _, n := range succ[c.Name] {
			if !seen[n] && t.Chains[n] != nil {
				seen[n] = true
				queue = append(queue, n)
			}
		}
	}
	return nil
}
