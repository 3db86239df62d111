package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// knftKernel applies transactions through knftables: to its Fake in unit tests, or to the nft command
// (the reference the netlink writer is checked against).
type knftKernel struct {
	nft knftables.Interface
	fam *family
}

var _ kernel = (*knftKernel)(nil)

// Run converts t to a knftables transaction and runs it.
func (k *knftKernel) Run(ctx context.Context, t *tx) error {
	return k.nft.Run(ctx, k.transaction(t))
}

// transaction converts t into a knftables transaction: the same commands.
func (k *knftKernel) transaction(t *tx) *knftables.Transaction {
	kt := k.nft.NewTransaction()
	for i := range t.ops {
		o := &t.ops[i]
		do := func(obj knftables.Object) {
			switch o.kind {
			case opAdd:
				kt.Add(obj)
			case opFlush:
				kt.Flush(obj)
			case opDelete:
				kt.Delete(obj)
			case opInsert:
				kt.Insert(obj)
			}
		}
		switch {
		case o.table:
			do(&knftables.Table{Comment: knftables.PtrTo(tableComment)})
		case o.chain != nil:
			do(knftChain(o.chain, o.kind))
		case o.rule != nil:
			var b strings.Builder
			for j, term := range o.rule.terms {
				if j > 0 {
					b.WriteByte(' ')
				}
				term.text(&b, t.fam)
			}
			r := &knftables.Rule{Chain: o.target, Rule: b.String()}
			if o.rule.comment != "" {
				r.Comment = knftables.PtrTo(o.rule.comment)
			}
			do(r)
		case o.handle != 0:
			do(&knftables.Rule{Chain: o.target, Handle: knftables.PtrTo(int(o.handle))})
		case o.set != nil:
			do(k.knftSet(o.set, o.kind))
		case o.counter != "":
			do(&knftables.Counter{Name: o.counter})
		default:
			layout := o.layout()
			isMap := k.isMap(o.target)
			for _, e := range o.elems {
				var b strings.Builder
				keyText(&b, layout, e.key)
				el := &knftables.Element{Key: strings.Split(b.String(), " . ")}
				if isMap {
					el.Map = o.target
				} else {
					el.Set = o.target
				}
				if o.kind == opAdd {
					if e.value.comment != "" {
						el.Comment = knftables.PtrTo(e.value.comment)
					}
					if e.value.verdict.kind != verdictNone {
						el.Value = []string{e.value.verdict.text()}
					}
				}
				do(el)
			}
		}
	}
	return kt
}

func (k *knftKernel) isMap(name string) bool {
	switch name {
	case mapServiceIPs, mapServiceNodePorts, mapNoEndpointServices, mapNoEndpointNodePorts, mapFirewallIPs, mapLocalhostNodePortReject:
		return true
	}
	return false
}

func knftChain(c *chainSpec, kind opKind) *knftables.Chain {
	kc := &knftables.Chain{Name: c.name}
	if kind == opAdd && c.hook != "" {
		kc.Type = knftables.PtrTo(knftables.BaseChainType(c.typ))
		kc.Hook = knftables.PtrTo(knftables.BaseChainHook(c.hook))
		kc.Priority = knftables.PtrTo(knftables.BaseChainPriority(strconv.Itoa(c.prio)))
	}
	if kind == opAdd && c.comment != "" {
		kc.Comment = knftables.PtrTo(c.comment)
	}
	return kc
}

func (k *knftKernel) knftSet(s *setSpec, kind opKind) knftables.Object {
	var typ strings.Builder
	for i, kt := range s.key {
		if i > 0 {
			typ.WriteString(" . ")
		}
		typ.WriteString(kt.text(k.fam))
	}
	var comment *string
	if kind == opAdd && s.comment != "" {
		comment = knftables.PtrTo(s.comment)
	}
	if s.isMap {
		m := &knftables.Map{Name: s.name, Comment: comment}
		if kind == opAdd {
			m.Type = typ.String() + " : verdict"
		}
		return m
	}
	set := &knftables.Set{Name: s.name, Comment: comment}
	if kind == opAdd {
		set.Type = typ.String()
		if s.dynamic {
			set.Flags = []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}
		}
		if s.timeout > 0 {
			set.Timeout = knftables.PtrTo(s.timeout)
		}
	}
	return set
}

// RuleHandles lists the rules of each chain.
func (k *knftKernel) RuleHandles(ctx context.Context, chains []string) (map[string][]uint64, error) {
	out := map[string][]uint64{}
	for _, c := range chains {
		rules, err := k.nft.ListRules(ctx, c)
		if err != nil {
			if knftables.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("listing the rules of %s: %w", c, err)
		}
		for _, r := range rules {
			if r.Handle != nil {
				out[c] = append(out[c], uint64(*r.Handle))
			}
		}
	}
	return out, nil
}

// Read lists the table's chains, sets and maps, and the elements of the shared ones.
func (k *knftKernel) Read(ctx context.Context) (*kernelState, error) {
	all, err := k.nft.ListAll(ctx)
	if err != nil {
		if knftables.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	if len(all["table"]) == 0 && len(all["chain"]) == 0 && len(all["set"]) == 0 && len(all["map"]) == 0 {
		// knftables' Fake lists an empty result for a missing table.
		if _, err := k.nft.List(ctx, "chains"); err != nil && knftables.IsNotFound(err) {
			return nil, nil
		}
	}
	ks := newKernelState()
	for _, c := range all["chain"] {
		ks.chains[c] = true
	}
	for _, typ := range []string{"set", "map"} {
		for _, name := range all[typ] {
			ks.sets[name] = true
			if isAffinitySet(name) {
				continue
			}
			elems, err := k.nft.ListElements(ctx, typ, name)
			if err != nil {
				return nil, fmt.Errorf("listing the elements of %s: %w", name, err)
			}
			for _, e := range elems {
				ref, v, err := parseElement(name, e.Key, e.Value)
				if err != nil {
					return nil, err
				}
				if e.Comment != nil {
					v.comment = *e.Comment
				}
				ks.elems[ref] = v
			}
		}
	}
	return ks, nil
}

// parseElement reads back an element of one of our sets or maps as knftables lists it.
func parseElement(set string, key, value []string) (elemRef, elemValue, error) {
	ref := elemRef{set: set}
	layout := layoutOf(set)
	if len(key) != len(layout) {
		return ref, elemValue{}, fmt.Errorf("element %v of %s: want %d fields", key, set, len(layout))
	}
	addrs := 0
	for i, t := range layout {
		f := strings.TrimSpace(key[i])
		switch t {
		case keyAddr:
			a, err := netip.ParseAddr(f)
			if err != nil {
				return ref, elemValue{}, fmt.Errorf("element %v of %s: %w", key, set, err)
			}
			if addrs == 0 {
				ref.key.addr = a
			} else {
				ref.key.addr2 = a
			}
			addrs++
		case keyProto:
			p, ok := protoByName(f)
			if !ok {
				return ref, elemValue{}, fmt.Errorf("element %v of %s: protocol %q", key, set, f)
			}
			ref.key.proto = p
		case keyPort:
			n, err := strconv.ParseUint(f, 10, 16)
			if err != nil {
				return ref, elemValue{}, fmt.Errorf("element %v of %s: port %q", key, set, f)
			}
			ref.key.port = uint16(n)
		}
	}
	var v elemValue
	if len(value) > 0 {
		fields := strings.Fields(strings.Join(value, " "))
		switch {
		case len(fields) == 1 && fields[0] == "drop":
			v.verdict = verdict{kind: verdictDrop}
		case len(fields) == 1 && fields[0] == "accept":
			v.verdict = verdict{kind: verdictAccept}
		case len(fields) == 2 && fields[0] == "goto":
			v.verdict = verdict{kind: verdictGoto, chain: fields[1]}
		case len(fields) == 2 && fields[0] == "jump":
			v.verdict = verdict{kind: verdictJump, chain: fields[1]}
		default:
			return ref, v, fmt.Errorf("element %v of %s: value %q", key, set, value)
		}
	}
	return ref, v, nil
}

func protoByName(s string) (uint8, bool) {
	switch s {
	case "tcp":
		return 6, true
	case "udp":
		return 17, true
	case "sctp":
		return 132, true
	}
	n, err := strconv.ParseUint(s, 10, 8)
	return uint8(n), err == nil
}
