package nftrace

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"kube-proxy/rules/internal/traceresult"
)

// Packet is the first packet of a connection, as the tracer walks it.
type Packet struct {
	Src, Dst netip.Addr
	Protocol string // "tcp", "udp" or "sctp"
	DPort    uint16
	// InIface is the interface an arriving packet came in on ("" for local ones); OutIface the one it
	// leaves by, if a rule needs it.
	InIface, OutIface string
	// Local is set for packets originated on the node (they take the output path instead of prerouting).
	Local bool
	// LocalAddrs are the node's addresses: `fib daddr type local` matches them and loopback, and an arriving
	// packet whose destination (after DNAT) is one of them takes the input path instead of forward.
	LocalAddrs []netip.Addr
	// Affinity lists the dynamic sets (affinity-...) that already hold Src: a client with session affinity.
	Affinity []string
}

func (p *Packet) isLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(p.LocalAddrs, a)
}

// Outcome is where one branch of the walk ends (see traceresult.Outcome).
type Outcome = traceresult.Outcome

// Result is every way a packet can go.
type Result = traceresult.Result

type walkVerdict int

const (
	vReturn walkVerdict = iota // fell off the chain or return
	vAccept
	vDrop
	vReject
)

func (v walkVerdict) String() string {
	return [...]string{"RETURN", "ACCEPT", "DROP", "REJECT"}[v]
}

// state is one branch of the walk.
type state struct {
	dst      netip.Addr
	dport    uint16
	endpoint string
	masq     bool
	mark     uint32
	prob     float64
	added    []string
	path     []string
	rules    []string
	hook     string
}

type branch struct {
	st state
	v  walkVerdict
}

// action is what one rule does to a branch: nothing decided (next), or a verdict.
type action struct {
	st   state
	next bool
	v    verdict // accept, drop, reject, return, jump, goto
}

type tracer struct {
	t        *Table
	pkt      *Packet
	branches int
}

const (
	maxDepth    = 64
	maxBranches = 1 << 16
)

// Trace walks pkt through the kube-proxy table of its family, exploring every numgen branch. An arriving
// packet goes through the prerouting base chains, then (routed on its destination after DNAT) the input
// chains, or the forward and postrouting chains; a local packet goes through the output chains, then
// postrouting. A hook's base chains run by priority (lower first, equal ones in creation order); accept
// ends only the current base chain, drop and reject end the walk, falling off a base chain applies its
// policy; a nat chain is skipped once an earlier one on the hook has done that kind of NAT. Without a
// table for the family, the packet is accepted untouched. An error reports a rule the tracer cannot
// evaluate, a jump to a missing chain, or a loop.
func (ts *Tables) Trace(pkt Packet) (*Result, error) {
	if !pkt.Src.IsValid() || !pkt.Dst.IsValid() {
		return nil, fmt.Errorf("packet needs a source and a destination address")
	}
	pkt.Src, pkt.Dst = pkt.Src.Unmap(), pkt.Dst.Unmap()
	if pkt.Src.Is4() != pkt.Dst.Is4() {
		return nil, fmt.Errorf("source %s and destination %s are of different families", pkt.Src, pkt.Dst)
	}
	if _, ok := protoNumbers[pkt.Protocol]; !ok {
		return nil, fmt.Errorf("unsupported protocol %q", pkt.Protocol)
	}
	family := "ip"
	if pkt.Dst.Is6() {
		family = "ip6"
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	tr := &tracer{t: ts.tables[family], pkt: &pkt}
	type pending struct {
		st    state
		hooks []string
	}
	first := []string{"prerouting", "route"}
	if pkt.Local {
		first = []string{"output", "postrouting"}
	}
	work := []pending{{state{dst: pkt.Dst, dport: pkt.DPort, prob: 1}, first}}
	res := &Result{}
	for len(work) > 0 {
		p := work[len(work)-1]
		work = work[:len(work)-1]
		if len(p.hooks) == 0 {
			res.Outcomes = append(res.Outcomes, tr.outcome(p.st, vAccept))
			continue
		}
		hook := p.hooks[0]
		if hook == "route" {
			rest := []string{"forward", "postrouting"}
			if pkt.isLocal(p.st.dst) {
				rest = []string{"input"}
			}
			work = append(work, pending{p.st, rest})
			continue
		}
		brs, err := tr.hook(hook, p.st)
		if err != nil {
			return nil, err
		}
		for _, b := range brs {
			if b.v == vAccept {
				work = append(work, pending{b.st, p.hooks[1:]})
			} else {
				res.Outcomes = append(res.Outcomes, tr.outcome(b.st, b.v))
			}
		}
	}
	slices.SortStableFunc(res.Outcomes, func(a, b Outcome) int {
		if c := strings.Compare(a.Verdict, b.Verdict); c != 0 {
			return c
		}
		if c := strings.Compare(a.Endpoint, b.Endpoint); c != 0 {
			return c
		}
		return strings.Compare(a.Hook, b.Hook)
	})
	return res, nil
}

func (tr *tracer) outcome(st state, v walkVerdict) Outcome {
	return Outcome{
		Verdict:     v.String(),
		Hook:        st.hook,
		Dst:         netip.AddrPortFrom(st.dst, st.dport),
		Endpoint:    st.endpoint,
		Masquerade:  st.masq,
		Mark:        st.mark,
		Probability: st.prob,
		Remembered:  slices.Clone(st.added),
		Path:        slices.Clone(st.path),
		Rules:       slices.Clone(st.rules),
	}
}

// hook runs a hook's base chains in order. Accepted branches go on to the next base chain.
func (tr *tracer) hook(hook string, st state) ([]branch, error) {
	if tr.t == nil {
		return []branch{{st, vAccept}}, nil
	}
	live := []state{st}
	var out []branch
	for _, c := range tr.t.baseChains(hook) {
		var next []state
		for _, s := range live {
			if c.Type == "nat" && natDone(hook, s) {
				next = append(next, s)
				continue
			}
			s.hook = tr.t.id() + " " + c.Name
			brs, err := tr.chain(c, s, 0)
			if err != nil {
				return nil, err
			}
			for _, b := range brs {
				v := b.v
				if v == vReturn {
					v = vAccept
					if c.Policy == "drop" {
						v = vDrop
					}
				}
				if v == vAccept {
					next = append(next, b.st)
				} else {
					out = append(out, branch{b.st, v})
				}
			}
		}
		live = next
	}
	for _, s := range live {
		out = append(out, branch{s, vAccept})
	}
	return out, nil
}

// natDone reports whether the branch was already NATed of the kind a nat chain on hook does (the kernel
// consults a hook's nat chains only until one of them sets up the mapping).
func natDone(hook string, s state) bool {
	switch hook {
	case "prerouting", "output":
		return s.endpoint != ""
	}
	return s.masq
}

// chain walks c from its first rule.
func (tr *tracer) chain(c *Chain, st state, depth int) ([]branch, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("chain nesting deeper than %d at %s (a loop?)", maxDepth, c.Name)
	}
	st.path = append(slices.Clip(st.path), c.Name)
	return tr.rules(c, 0, st, depth)
}

// rules walks c from rule idx on.
func (tr *tracer) rules(c *Chain, idx int, st state, depth int) ([]branch, error) {
	for i := idx; i < len(c.Rules); i++ {
		acts, err := tr.rule(c.Rules[i], st)
		if err != nil {
			return nil, fmt.Errorf("chain %s rule %d (%s): %w", c.Name, i+1, c.Rules[i], err)
		}
		if len(acts) == 1 && acts[0].next {
			st = acts[0].st
			continue
		}
		var out []branch
		for _, a := range acts {
			if !a.next {
				a.st.rules = append(slices.Clip(a.st.rules), c.Name+": "+c.Rules[i].String())
			}
			brs, err := tr.act(c, i, a, depth)
			if err != nil {
				return nil, err
			}
			out = append(out, brs...)
		}
		return out, nil
	}
	return []branch{{st, vReturn}}, nil
}

// act applies rule i's action to one branch, and walks on as far as the chain goes.
func (tr *tracer) act(c *Chain, i int, a action, depth int) ([]branch, error) {
	if a.next {
		return tr.rules(c, i+1, a.st, depth)
	}
	switch a.v.kind {
	case "accept":
		return []branch{{a.st, vAccept}}, nil
	case "drop":
		return []branch{{a.st, vDrop}}, nil
	case "reject":
		return []branch{{a.st, vReject}}, nil
	case "return":
		return []branch{{a.st, vReturn}}, nil
	case "continue":
		return tr.rules(c, i+1, a.st, depth)
	}
	sub := tr.t.Chains[a.v.chain]
	if sub == nil {
		return nil, fmt.Errorf("chain %s rule %d: %s to missing chain %s", c.Name, i+1, a.v.kind, a.v.chain)
	}
	brs, err := tr.chain(sub, a.st, depth+1)
	if err != nil {
		return nil, err
	}
	if a.v.kind == "goto" {
		return brs, nil
	}
	var out []branch
	for _, b := range brs {
		if b.v != vReturn {
			out = append(out, b)
			continue
		}
		more, err := tr.rules(c, i+1, b.st, depth)
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
	}
	return out, nil
}

// rule evaluates one rule on a branch. Only its last item can fork (numgen).
func (tr *tracer) rule(r *Rule, st state) ([]action, error) {
	for _, it := range r.items {
		switch it := it.(type) {
		case *matchItem:
			ok, err := tr.match(it, &st)
			if err != nil {
				return nil, err
			}
			if !ok {
				return []action{{st: st, next: true}}, nil
			}
		case *counterItem:
		case *markSetItem:
			st.mark = it.apply(st.mark)
		case *updateItem:
			if len(it.sels) != 1 || !strings.HasSuffix(it.sels[0].name, " saddr") {
				return nil, fmt.Errorf("update with key %s is not supported by the tracer", joinSelectors(it.sels))
			}
			if !slices.Contains(st.added, it.set) {
				st.added = append(slices.Clip(st.added), it.set)
			}
		case *verdictItem:
			return []action{{st: st, v: it.v}}, nil
		case *rejectItem:
			return []action{{st: st, v: verdict{kind: "reject"}}}, nil
		case *masqItem:
			st.masq = true
			return []action{{st: st, v: verdict{kind: "accept"}}}, nil
		case *dnatItem:
			if it.numgen == 0 {
				return []action{{st: dnat(st, it.target), v: verdict{kind: "accept"}}}, nil
			}
			return tr.fork(st, it.numgen, func(s state, i int) action {
				if e := findIndex(it.elems, i); e != nil {
					return action{st: dnat(s, *e), v: verdict{kind: "accept"}}
				}
				return action{st: s, next: true}
			})
		case *vmapItem:
			if it.numgen > 0 {
				return tr.fork(st, it.numgen, func(s state, i int) action {
					if e := findIndex(it.elems, i); e != nil {
						return action{st: s, v: e.verdict}
					}
					return action{st: s, next: true}
				})
			}
			v, ok := tr.lookupVerdict(it, &st)
			if !ok {
				return []action{{st: st, next: true}}, nil
			}
			return []action{{st: st, v: v}}, nil
		default:
			return nil, fmt.Errorf("statement %s is not supported by the tracer", it)
		}
	}
	return []action{{st: st, next: true}}, nil
}

// fork splits a branch n ways with probability 1/n each.
func (tr *tracer) fork(st state, n int, f func(state, int) action) ([]action, error) {
	tr.branches += n
	if tr.branches > maxBranches {
		return nil, fmt.Errorf("more than %d branches", maxBranches)
	}
	out := make([]action, n)
	for i := range n {
		s := st
		s.prob /= float64(n)
		s.path = slices.Clip(s.path)
		s.added = slices.Clip(s.added)
		out[i] = f(s, i)
	}
	return out, nil
}

func findIndex(elems []elem, i int) *elem {
	k := strconv.Itoa(i)
	for j := range elems {
		if elems[j].key[0] == k {
			return &elems[j]
		}
	}
	return nil
}

func dnat(st state, e elem) state {
	st.dst = e.addr
	if e.hasPort {
		st.dport = e.port
	}
	st.endpoint = netip.AddrPortFrom(st.dst, st.dport).String()
	return st
}

// value returns the packet's value for a selector, canonical as set elements are; ok is false when the
// selector's protocol dependency (tcp dport on a udp packet) does not hold.
func (tr *tracer) value(s selector, st *state) (string, bool) {
	pkt := tr.pkt
	switch s.name {
	case "ip saddr", "ip6 saddr":
		return pkt.Src.String(), true
	case "ip daddr", "ip6 daddr":
		return st.dst.String(), true
	case "meta l4proto":
		return pkt.Protocol, true
	case "th dport":
		return strconv.Itoa(int(st.dport)), true
	case "tcp dport", "udp dport", "sctp dport":
		return strconv.Itoa(int(st.dport)), pkt.Protocol == s.proto
	case "mark":
		return formatMark(st.mark), true
	case "iifname":
		return pkt.InIface, true
	case "oifname":
		return pkt.OutIface, true
	case "ct state":
		return "new", true
	case "ct status":
		if st.endpoint != "" {
			return "dnat", true
		}
		return "", true
	case "fib daddr type":
		return tr.addrType(st.dst), true
	case "fib saddr type":
		return tr.addrType(pkt.Src), true
	}
	return "", false
}

func (tr *tracer) addrType(a netip.Addr) string {
	switch {
	case tr.pkt.isLocal(a):
		return "local"
	case a.IsMulticast():
		return "multicast"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "broadcast"
	case a.IsUnspecified():
		return "unspec"
	}
	return "unicast"
}

// key returns the packet's values for selectors.
func (tr *tracer) key(sels []selector, st *state) ([]string, bool) {
	key := make([]string, len(sels))
	for i, s := range sels {
		v, ok := tr.value(s, st)
		if !ok {
			return nil, false
		}
		key[i] = v
	}
	return key, true
}

func keyMatch(types, elemKey, key []string) bool {
	for i := range key {
		if !partMatch(types[i], elemKey[i], key[i]) {
			return false
		}
	}
	return true
}

func (tr *tracer) match(m *matchItem, st *state) (bool, error) {
	key, ok := tr.key(m.sels, st)
	if !ok {
		return false, nil
	}
	if m.mask != "" {
		mask, _ := strconv.ParseUint(m.mask, 0, 32)
		key[0] = formatMark(st.mark & uint32(mask))
	}
	types := selectorTypes(m.sels)
	hit := false
	if m.set != "" {
		s := tr.t.Sets[m.set]
		if s == nil {
			return false, fmt.Errorf("missing set %s", m.set)
		}
		hit = tr.inSet(s, key, st)
	} else {
		for _, v := range m.vals {
			if keyMatch(types, v, key) {
				hit = true
				break
			}
		}
	}
	return hit != m.neg, nil
}

// inSet looks key up in a named set; a dynamic set also holds the packet's source when the packet's
// Affinity lists it or this branch added it.
func (tr *tracer) inSet(s *Set, key []string, st *state) bool {
	if len(key) == 1 && key[0] == tr.pkt.Src.String() &&
		(slices.Contains(tr.pkt.Affinity, s.Name) || slices.Contains(st.added, s.Name)) {
		return true
	}
	return tr.findElem(s, key) != nil
}

func (tr *tracer) findElem(s *Set, key []string) *elem {
	if !s.interval() {
		return s.elems[strings.Join(key, " . ")]
	}
	for _, e := range s.sortedElems() {
		if keyMatch(s.KeyType, e.key, key) {
			return e
		}
	}
	return nil
}

// lookupVerdict finds the verdict for the packet's key in a verdict map.
func (tr *tracer) lookupVerdict(v *vmapItem, st *state) (verdict, bool) {
	key, ok := tr.key(v.sels, st)
	if !ok {
		return verdict{}, false
	}
	if v.set != "" {
		s := tr.t.Sets[v.set]
		if s == nil {
			return verdict{}, false
		}
		if e := tr.findElem(s, key); e != nil {
			return e.verdict, true
		}
		return verdict{}, false
	}
	types := selectorTypes(v.sels)
	for _, e := range v.elems {
		if keyMatch(types, e.key, key) {
			return e.verdict, true
		}
	}
	return verdict{}, false
}
