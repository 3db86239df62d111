package iptrace

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
	// Local is set for packets originated on the node (they start in OUTPUT instead of PREROUTING).
	Local bool
	// LocalAddrs are the node's addresses: addrtype LOCAL matches them and loopback, and an arriving packet
	// for one of them goes to INPUT instead of FORWARD.
	LocalAddrs []netip.Addr
	// Recent lists the "-m recent" lists that already hold Src (a client with session affinity).
	Recent []string
	// Bridged is set for a packet that arrived through a bridge port (physdev --physdev-is-in).
	Bridged bool
	// Persistence holds the client's IPVS persistence templates: for a persistent virtual server (named
	// as VirtualServer.String writes it, "tcp/10.96.0.1:80") the real server it already sent Src to.
	Persistence map[string]netip.AddrPort
}

func (p *Packet) isLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(p.LocalAddrs, a)
}

// Outcome is where one branch of the walk ends (see traceresult.Outcome).
type Outcome = traceresult.Outcome

// Result is every way a packet can go.
type Result = traceresult.Result

type verdict int

const (
	vReturn verdict = iota // fell off the chain or RETURN
	vAccept
	vDrop
	vReject
)

func (v verdict) String() string {
	return [...]string{"RETURN", "ACCEPT", "DROP", "REJECT"}[v]
}

// state is one branch of the walk.
type state struct {
	dst    netip.Addr
	dport  uint16
	dnat   string
	mark   uint32
	masq   bool
	prob   float64
	recent []string
	path   []string
	rules  []string
	ipvs   *VirtualServer // the virtual server IPVS sent the packet through, if any
}

func (s state) fork() state {
	s.recent = slices.Clip(s.recent)
	s.path = slices.Clip(s.path)
	s.rules = slices.Clip(s.rules)
	return s
}

type branch struct {
	st state
	v  verdict
}

type tracer struct {
	ts       *Tables
	pkt      *Packet
	branches int
}

const (
	maxDepth    = 64
	maxBranches = 1 << 16
)

// Trace walks pkt through the nat and filter tables, exploring every random branch: arriving packets start
// in nat PREROUTING, then go to filter INPUT (and nat INPUT) when the destination is local, else to filter
// FORWARD and nat POSTROUTING; local packets go through nat OUTPUT, filter OUTPUT and nat POSTROUTING.
// Missing tables or chains accept. An error reports a rule the tracer cannot evaluate or a loop.
//
// IPVS, when virtual servers were given (AddVirtualServer), looks the packet up where the kernel's IPVS
// hooks do: an arriving packet after filter INPUT, the node's own after nat OUTPUT. A packet for a virtual
// server is sent to its real servers (see VirtualServer); an arriving one then leaves through filter
// OUTPUT and nat POSTROUTING instead of going on to nat INPUT, as IPVS's NAT forwarding sends it.
func (ts *Tables) Trace(pkt Packet) (*Result, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	tr := &tracer{ts: ts, pkt: &pkt}
	start := state{dst: pkt.Dst, dport: pkt.DPort, prob: 1}
	type pending struct {
		st    state
		hooks []string
	}
	var first []string
	if pkt.Local {
		first = []string{"nat/OUTPUT", hookIPVS, "filter/OUTPUT", "nat/POSTROUTING"}
	} else {
		first = []string{"nat/PREROUTING"}
	}
	work := []pending{{start, first}}
	res := &Result{}
	for len(work) > 0 {
		p := work[len(work)-1]
		work = work[:len(work)-1]
		if len(p.hooks) == 0 {
			res.Outcomes = append(res.Outcomes, tr.outcome(p.st, "ACCEPT", ""))
			continue
		}
		hook := p.hooks[0]
		var brs []branch
		var err error
		if hook == hookIPVS {
			var hit bool
			if brs, hit = tr.ipvsStep(p.st); hit && !pkt.Local {
				p.hooks = []string{hookIPVS, "filter/OUTPUT", "nat/POSTROUTING"}
			}
		} else if brs, err = tr.hook(hook, p.st); err != nil {
			return nil, err
		}
		for _, b := range brs {
			switch b.v {
			case vAccept:
				rest := p.hooks[1:]
				if hook == "nat/PREROUTING" {
					// The routing decision, on the destination after DNAT.
					if pkt.isLocal(b.st.dst) {
						rest = []string{"filter/INPUT", hookIPVS, "nat/INPUT"}
					} else {
						rest = []string{"filter/FORWARD", "nat/POSTROUTING"}
					}
				}
				work = append(work, pending{b.st, rest})
			case vDrop, vReject:
				res.Outcomes = append(res.Outcomes, tr.outcome(b.st, b.v.String(), hook))
			}
		}
	}
	slices.SortStableFunc(res.Outcomes, func(a, b Outcome) int {
		if c := strings.Compare(a.Verdict, b.Verdict); c != 0 {
			return c
		}
		return strings.Compare(a.Endpoint, b.Endpoint)
	})
	return res, nil
}

// hookIPVS is the IPVS look-up's place among the hooks.
const hookIPVS = "ipvs"

func (tr *tracer) outcome(st state, v, hook string) Outcome {
	o := Outcome{
		Verdict:     v,
		Hook:        hook,
		Dst:         netip.AddrPortFrom(st.dst, st.dport),
		Endpoint:    st.dnat,
		Masquerade:  st.masq,
		Mark:        st.mark,
		Probability: st.prob,
		Remembered:  slices.Clone(st.recent),
		Path:        slices.Clone(st.path),
		Rules:       slices.Clone(st.rules),
	}
	if v == "ACCEPT" {
		if tr.pkt.Local || !tr.pkt.isLocal(st.dst) {
			o.Hook = "nat/POSTROUTING"
		} else {
			o.Hook = "nat/INPUT"
		}
	}
	return o
}

// hook walks one built-in chain, applying its policy to branches that fall off its end.
func (tr *tracer) hook(hook string, st state) ([]branch, error) {
	table, chain, _ := strings.Cut(hook, "/")
	t := tr.ts.tables[table]
	if t == nil || t.Chains[chain] == nil {
		return []branch{{st, vAccept}}, nil
	}
	brs, err := tr.chain(t, t.Chains[chain], 0, st, 0)
	if err != nil {
		return nil, err
	}
	policy := vAccept
	if t.Chains[chain].Policy == "DROP" {
		policy = vDrop
	}
	for i := range brs {
		if brs[i].v == vReturn {
			brs[i].v = policy
		}
	}
	return brs, nil
}

// chain walks c from rule idx on.
func (tr *tracer) chain(t *Table, c *Chain, idx int, st state, depth int) ([]branch, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("chain nesting deeper than %d at %s/%s (a loop?)", maxDepth, t.Name, c.Name)
	}
	if idx == 0 {
		st.path = append(st.path, t.Name+"/"+c.Name)
	}
	for i := idx; i < len(c.Rules); i++ {
		r := c.Rules[i]
		p, sets, err := tr.match(r, &st)
		if err != nil {
			return nil, fmt.Errorf("%s/%s rule %d: %w", t.Name, c.Name, i+1, err)
		}
		if p == 0 {
			continue
		}
		if p < 1 {
			tr.branches++
			if tr.branches > maxBranches {
				return nil, fmt.Errorf("more than %d branches", maxBranches)
			}
			miss := st.fork()
			miss.prob *= 1 - p
			hit := st.fork()
			hit.prob *= p
			hit.addRecent(sets)
			a, err := tr.target(t, c, i, r, hit, depth)
			if err != nil {
				return nil, err
			}
			b, err := tr.chain(t, c, i+1, miss, depth)
			if err != nil {
				return nil, err
			}
			return append(a, b...), nil
		}
		st.addRecent(sets)
		if r.Target == "" || r.Target == "MARK" {
			if r.Target == "MARK" {
				st.mark = (st.mark &^ r.MarkMask) ^ r.MarkValue
				st.rules = append(st.rules, t.Name+"/"+c.Name+": "+r.String())
			}
			continue
		}
		return tr.target(t, c, i, r, st, depth)
	}
	return []branch{{st, vReturn}}, nil
}

// target applies rule i's target to a branch that matched it, and walks on as far as the chain goes.
func (tr *tracer) target(t *Table, c *Chain, i int, r *Rule, st state, depth int) ([]branch, error) {
	if r.Target != "" {
		st.rules = append(slices.Clip(st.rules), t.Name+"/"+c.Name+": "+r.String())
	}
	switch r.Target {
	case "":
		return tr.chain(t, c, i+1, st, depth)
	case "MARK":
		st.mark = (st.mark &^ r.MarkMask) ^ r.MarkValue
		return tr.chain(t, c, i+1, st, depth)
	case "ACCEPT":
		return []branch{{st, vAccept}}, nil
	case "DROP":
		return []branch{{st, vDrop}}, nil
	case "REJECT":
		return []branch{{st, vReject}}, nil
	case "RETURN":
		return []branch{{st, vReturn}}, nil
	case "DNAT":
		ap, err := netip.ParseAddrPort(r.ToDestination)
		if err != nil {
			a, err2 := netip.ParseAddr(r.ToDestination)
			if err2 != nil {
				return nil, fmt.Errorf("bad DNAT destination %q", r.ToDestination)
			}
			ap = netip.AddrPortFrom(a, st.dport)
		}
		st.dst, st.dport, st.dnat = ap.Addr(), ap.Port(), r.ToDestination
		return []branch{{st, vAccept}}, nil
	case "REDIRECT":
		// To the node itself: 127.0.0.1 (::1) for the node's own packets, else the first address of the
		// node (the kernel takes the incoming interface's primary address).
		to := netip.IPv6Loopback()
		if !tr.ts.ipv6 {
			to = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
		if !tr.pkt.Local {
			for _, a := range tr.pkt.LocalAddrs {
				if a.Is6() == tr.ts.ipv6 && !a.IsLoopback() {
					to = a
					break
				}
			}
		}
		port := st.dport
		if r.ToPorts != 0 {
			port = r.ToPorts
		}
		st.dst, st.dport = to, port
		st.dnat = netip.AddrPortFrom(to, port).String()
		return []branch{{st, vAccept}}, nil
	case "MASQUERADE", "SNAT":
		st.masq = true
		return []branch{{st, vAccept}}, nil
	}
	sub := t.Chains[r.Target]
	if sub == nil {
		return nil, fmt.Errorf("jump to missing chain %s", r.Target)
	}
	brs, err := tr.chain(t, sub, 0, st, depth+1)
	if err != nil {
		return nil, err
	}
	var out []branch
	for _, b := range brs {
		if b.v != vReturn || r.Goto {
			out = append(out, b)
			continue
		}
		more, err := tr.chain(t, c, i+1, b.st, depth)
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
	}
	return out, nil
}

func ifaceMatch(pattern, name string) bool {
	if p, ok := strings.CutSuffix(pattern, "+"); ok {
		return strings.HasPrefix(name, p)
	}
	return pattern == name
}

func portMatch(spec string, port uint16) bool {
	lo, hi, isRange := strings.Cut(spec, ":")
	l, _ := strconv.Atoi(lo)
	if !isRange {
		return int(port) == l
	}
	h, _ := strconv.Atoi(hi)
	return int(port) >= l && int(port) <= h
}

func (s *state) addRecent(names []string) {
	for _, n := range names {
		if !slices.Contains(s.recent, n) {
			s.recent = append(slices.Clip(s.recent), n)
		}
	}
}

// match returns the probability that r matches the branch (0, 1, or a statistic's probability) and the
// recent lists the source is added to when it does.
func (tr *tracer) match(r *Rule, st *state) (float64, []string, error) {
	pkt := tr.pkt
	if r.Src.IsValid() && r.Src.Contains(pkt.Src) == r.NotSrc {
		return 0, nil, nil
	}
	if r.Dst.IsValid() && r.Dst.Contains(st.dst) == r.NotDst {
		return 0, nil, nil
	}
	if r.In != "" && ifaceMatch(r.In, pkt.InIface) == r.NotIn {
		return 0, nil, nil
	}
	if r.Out != "" && ifaceMatch(r.Out, pkt.OutIface) == r.NotOut {
		return 0, nil, nil
	}
	if r.Proto != "" && (r.Proto == pkt.Protocol) == r.NotProto {
		return 0, nil, nil
	}
	p := 1.0
	var setRecent []string
	for _, m := range r.Matches {
		switch m.Module {
		case "comment", "nfacct": // nfacct only counts the packet
		case "tcp", "udp", "sctp":
			if pkt.Protocol != m.Module {
				return 0, nil, nil
			}
			if m.DPort != "" && portMatch(m.DPort, st.dport) == m.Not["--dport"] {
				return 0, nil, nil
			}
			if m.SPort != "" {
				return 0, nil, fmt.Errorf("--sport is not supported by the tracer")
			}
		case "addrtype":
			if m.SrcType != "" && tr.addrType(pkt.Src, m.SrcType) == m.Not["--src-type"] {
				return 0, nil, nil
			}
			if m.DstType != "" && tr.addrType(st.dst, m.DstType) == m.Not["--dst-type"] {
				return 0, nil, nil
			}
		case "statistic":
			p *= m.Probability
		case "recent":
			has := slices.Contains(pkt.Recent, m.RecentName) || slices.Contains(st.recent, m.RecentName)
			switch m.RecentCommand {
			case "set":
				setRecent = append(setRecent, m.RecentName)
				if m.Not["--set"] {
					return 0, nil, nil
				}
			case "rcheck", "update":
				if has == m.Not["--"+m.RecentCommand] {
					return 0, nil, nil
				}
			case "remove":
				return 0, nil, fmt.Errorf("recent --remove is not supported by the tracer")
			}
		case "mark":
			if (st.mark&m.MarkMask == m.MarkValue) == m.Not["--mark"] {
				return 0, nil, nil
			}
		case "set":
			in, err := tr.inSet(m, st)
			if err != nil {
				return 0, nil, err
			}
			if in == m.Not["--match-set"] {
				return 0, nil, nil
			}
		case "physdev":
			if pkt.Bridged == m.Not["--physdev-is-in"] {
				return 0, nil, nil
			}
		case "ipvs":
			if !matchIPVS(m, st) {
				return 0, nil, nil
			}
		case "conntrack":
			states := []string{"NEW"}
			if st.dnat != "" {
				states = append(states, "DNAT")
			}
			hit := false
			for _, s := range m.CtStates {
				if slices.Contains(states, s) {
					hit = true
				}
			}
			if hit == m.Not["--ctstate"] {
				return 0, nil, nil
			}
		default:
			return 0, nil, fmt.Errorf("match %q is not supported by the tracer", m.Module)
		}
	}
	return p, setRecent, nil
}

func (tr *tracer) addrType(a netip.Addr, typ string) bool {
	switch typ {
	case "LOCAL":
		return tr.pkt.isLocal(a)
	case "MULTICAST":
		return a.IsMulticast()
	case "BROADCAST":
		return a == netip.AddrFrom4([4]byte{255, 255, 255, 255})
	case "UNSPEC":
		return a.IsUnspecified()
	case "UNICAST":
		return !tr.pkt.isLocal(a) && !a.IsMulticast() && !a.IsUnspecified()
	}
	return false
}
