package iptrace

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// Rule is one parsed iptables rule: header matches, match modules in order, and a target.
type Rule struct {
	Src, Dst       AddrMask // not valid: any address
	NotSrc, NotDst bool
	In, Out        string // interface names; a trailing "+" matches any suffix
	NotIn, NotOut  bool
	Proto          string // "", "tcp", "udp", "sctp", ...
	NotProto       bool
	Matches        []*Match
	Target         string // "" when the rule has no target (it only counts)
	Goto           bool   // -g instead of -j
	// Target options, parsed.
	ToDestination string // DNAT
	ToPorts       uint16 // REDIRECT (0: keep the port)
	MarkValue     uint32 // MARK: new mark = (mark &^ MarkMask) ^ MarkValue
	MarkMask      uint32
	RejectWith    string // REJECT
	RandomFully   bool   // MASQUERADE

	ipv6    bool
	markSet bool
}

// Match is one "-m module" with its options.
type Match struct {
	Module string
	Not    map[string]bool // options given with "!" in front, by option name
	// comment
	Comment string
	// tcp, udp, sctp
	DPort, SPort string // "80" or "80:90"; "" when absent
	// addrtype
	SrcType, DstType string
	// statistic (random mode only)
	Probability float64 // as the kernel stores it (rounded to 1/2^31)
	hasProb     bool
	// recent
	RecentName    string
	RecentCommand string // "set", "rcheck", "update" or "remove"
	Seconds       int
	Reap          bool
	// mark
	MarkValue, MarkMask uint32
	HasMask             bool
	// conntrack
	CtStates []string
	// set: the set's name and the packet fields its dimensions take, in order ("src" or "dst" each)
	SetName string
	SetDirs []string
	// physdev (only --physdev-is-in)
	PhysdevIsIn bool
	// nfacct: the accounting object the packet is counted in (the match always matches)
	NFAcctName string
	// ipvs: the virtual server IPVS sent the packet to (zero values: not matched on)
	VAddr  AddrMask
	VPort  uint16
	VProto uint8

	ipv6 bool
}

// maxSetDims is the most dimensions an ipset match takes (IPSET_DIM_MAX).
const maxSetDims = 6

// protoNumbers are the protocols an ipvs match may name.
var protoNumbers = map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}

// Words splits an iptables-restore or iptables-save line into words, honouring double quotes and the
// backslash escapes in them as iptables-restore does.
func Words(line string) ([]string, error) { return tokenize(line) }

// tokenize is Words.
func tokenize(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case inQuote && c == '\\' && i+1 < len(line) && (line[i+1] == '"' || line[i+1] == '\\'):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			inQuote = !inQuote
			have = true
		case !inQuote && (c == ' ' || c == '\t'):
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote")
	}
	if have {
		out = append(out, cur.String())
	}
	return out, nil
}

// AddrMask is an address match, "-d ADDR/MASK": an address under a mask, which is a prefix length or, as
// iptables also accepts, any mask written as an address ("-d 0.0.0.5/0.0.0.255").
type AddrMask struct {
	Addr, Mask netip.Addr
}

// IsValid reports whether the match is set.
func (m AddrMask) IsValid() bool { return m.Addr.IsValid() }

// Contains reports whether a, under the mask, equals the address.
func (m AddrMask) Contains(a netip.Addr) bool {
	if a.Is4() != m.Addr.Is4() {
		return false
	}
	x, k, y := a.AsSlice(), m.Mask.AsSlice(), m.Addr.AsSlice()
	for i := range x {
		if x[i]&k[i] != y[i] {
			return false
		}
	}
	return true
}

// bits returns the prefix length of a contiguous mask, or -1.
func (m AddrMask) bits() int {
	n, done := 0, false
	for _, b := range m.Mask.AsSlice() {
		for i := 7; i >= 0; i-- {
			set := b&(1<<i) != 0
			switch {
			case set && done:
				return -1
			case set:
				n++
			default:
				done = true
			}
		}
	}
	return n
}

// String prints the match as iptables-save does: ADDR/LEN for a prefix, ADDR/MASK otherwise.
func (m AddrMask) String() string {
	if n := m.bits(); n >= 0 {
		return netip.PrefixFrom(m.Addr, n).String()
	}
	return m.Addr.String() + "/" + m.Mask.String()
}

func parsePrefix(s string, ipv6 bool) (AddrMask, error) {
	fail := func() (AddrMask, error) { return AddrMask{}, fmt.Errorf("host/network %q not found", s) }
	addr, mask, hasMask := strings.Cut(s, "/")
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return fail()
	}
	if a.Is6() != ipv6 {
		return AddrMask{}, fmt.Errorf("host/network %q is not of this family", s)
	}
	bits := a.BitLen()
	var m netip.Addr
	if hasMask {
		if n, err := strconv.Atoi(mask); err == nil {
			if n < 0 || n > a.BitLen() {
				return fail()
			}
			bits = n
		} else if m, err = netip.ParseAddr(mask); err != nil || m.Is6() != ipv6 {
			return fail()
		}
	}
	if !m.IsValid() {
		b := make([]byte, a.BitLen()/8)
		for i := range bits {
			b[i/8] |= 1 << (7 - i%8)
		}
		m, _ = netip.AddrFromSlice(b)
	}
	x, k := a.AsSlice(), m.AsSlice()
	for i := range x {
		x[i] &= k[i]
	}
	a, _ = netip.AddrFromSlice(x)
	return AddrMask{Addr: a, Mask: m}, nil
}

func parseMark(s string) (value, mask uint32, hasMask bool, err error) {
	v, m, hasMask := strings.Cut(s, "/")
	vv, err := strconv.ParseUint(v, 0, 32)
	if err != nil {
		return 0, 0, false, fmt.Errorf("bad mark value %q", s)
	}
	mask = math.MaxUint32
	if hasMask {
		mm, err := strconv.ParseUint(m, 0, 32)
		if err != nil {
			return 0, 0, false, fmt.Errorf("bad mark value %q", s)
		}
		mask = uint32(mm)
	}
	return uint32(vv), mask, hasMask, nil
}

// ParseRule parses the words of a rule after "-A chain" (or "-I chain [n]"). ipv6 selects the family the
// addresses must belong to.
func ParseRule(args []string, ipv6 bool) (*Rule, error) {
	p := &ruleParser{r: &Rule{ipv6: ipv6}, args: args}
	not := false
	for ; p.i < len(args); p.i++ {
		a := args[p.i]
		if a == "!" {
			if not {
				return nil, fmt.Errorf("multiple \"!\"")
			}
			not = true
			continue
		}
		wasNot := not
		not = false
		if err := p.word(a, wasNot); err != nil {
			return nil, err
		}
	}
	if not {
		return nil, fmt.Errorf("\"!\" at the end")
	}
	if err := p.r.check(); err != nil {
		return nil, err
	}
	return p.r, nil
}

// ruleParser is ParseRule's state: the rule so far, the words and the index of the current one.
type ruleParser struct {
	r        *Rule
	args     []string
	i        int
	cur      *Match // the match options attach to
	inTarget bool   // after -j or -g, until the next -m: options are the target's
}

// next takes the argument of option opt, the word after index *i, and moves *i to it.
func (p *ruleParser) next(i *int, opt string) (string, error) {
	if *i+1 >= len(p.args) {
		return "", fmt.Errorf("option %q requires an argument", opt)
	}
	*i++
	return p.args[*i], nil
}

// word parses the word a and the arguments it takes; not tells whether "!" came before it.
func (p *ruleParser) word(a string, not bool) error {
	switch a {
	case "-s", "--source", "-d", "--destination":
		return p.address(a, not)
	case "-i", "--in-interface", "-o", "--out-interface":
		return p.iface(a, not)
	case "-p", "--protocol":
		v, err := p.next(&p.i, a)
		if err != nil {
			return err
		}
		p.r.Proto, p.r.NotProto = strings.ToLower(v), not
		return nil
	case "-m", "--match":
		return p.match(a, not)
	case "-j", "--jump", "-g", "--goto":
		return p.target(a, not)
	}
	if !strings.HasPrefix(a, "--") {
		return fmt.Errorf("bad argument %q", a)
	}
	if p.inTarget {
		if not {
			return fmt.Errorf("\"!\" before target option %s", a)
		}
		return p.r.targetOption(a, &p.i, p.args, p.next)
	}
	return p.matchOption(a, not)
}

// address parses -s or -d.
func (p *ruleParser) address(a string, not bool) error {
	v, err := p.next(&p.i, a)
	if err != nil {
		return err
	}
	prefix, err := parsePrefix(v, p.r.ipv6)
	if err != nil {
		return err
	}
	if a == "-s" || a == "--source" {
		p.r.Src, p.r.NotSrc = prefix, not
	} else {
		p.r.Dst, p.r.NotDst = prefix, not
	}
	return nil
}

// iface parses -i or -o.
func (p *ruleParser) iface(a string, not bool) error {
	v, err := p.next(&p.i, a)
	if err != nil {
		return err
	}
	if a == "-i" || a == "--in-interface" {
		p.r.In, p.r.NotIn = v, not
	} else {
		p.r.Out, p.r.NotOut = v, not
	}
	return nil
}

// match parses -m, which starts a match the options after it attach to.
func (p *ruleParser) match(a string, not bool) error {
	if not {
		return fmt.Errorf("\"!\" before -m")
	}
	v, err := p.next(&p.i, a)
	if err != nil {
		return err
	}
	switch v {
	case "comment", "tcp", "udp", "sctp", "addrtype", "statistic", "recent", "mark", "conntrack", "set", "physdev", "ipvs", "nfacct":
	default:
		return fmt.Errorf("couldn't load match %q: not supported by iptrace", v)
	}
	p.cur = &Match{Module: v, ipv6: p.r.ipv6}
	p.r.Matches = append(p.r.Matches, p.cur)
	p.inTarget = false
	return nil
}

// target parses -j or -g, which the options after it belong to.
func (p *ruleParser) target(a string, not bool) error {
	if not {
		return fmt.Errorf("\"!\" before %s", a)
	}
	if p.r.Target != "" {
		return fmt.Errorf("multiple targets")
	}
	v, err := p.next(&p.i, a)
	if err != nil {
		return err
	}
	p.r.Target, p.r.Goto = v, a == "-g" || a == "--goto"
	p.inTarget = true
	if p.r.Target == "REJECT" {
		p.r.RejectWith = "icmp-port-unreachable"
		if p.r.ipv6 {
			p.r.RejectWith = "icmp6-port-unreachable"
		}
	}
	return nil
}

// matchOption parses an option of the current match, or of the protocol match iptables loads implicitly.
func (p *ruleParser) matchOption(a string, not bool) error {
	if p.cur == nil || !p.cur.accepts(a) {
		// An option of the protocol match iptables loads implicitly for "-p tcp --dport 80".
		if (a == "--dport" || a == "--sport" || a == "--destination-port" || a == "--source-port") &&
			(p.r.Proto == "tcp" || p.r.Proto == "udp" || p.r.Proto == "sctp") {
			p.cur = &Match{Module: p.r.Proto}
			p.r.Matches = append(p.r.Matches, p.cur)
		} else {
			return fmt.Errorf("unknown option %q", a)
		}
	}
	return p.cur.option(a, not, &p.i, p.next)
}

// check checks a parsed rule as a whole: its matches, then the options its target requires.
func (r *Rule) check() error {
	for _, m := range r.Matches {
		if err := m.check(r); err != nil {
			return err
		}
	}
	switch r.Target {
	case "DNAT":
		if r.ToDestination == "" {
			return fmt.Errorf("DNAT needs --to-destination")
		}
	case "REDIRECT":
		if r.ToPorts != 0 && r.Proto != "tcp" && r.Proto != "udp" && r.Proto != "sctp" {
			return fmt.Errorf("REDIRECT --to-ports needs -p tcp, udp or sctp")
		}
	case "MARK":
		if !r.markSet {
			return fmt.Errorf("MARK target: parameter required")
		}
	}
	return nil
}

func (r *Rule) targetOption(a string, i *int, args []string, next func(*int, string) (string, error)) error {
	var v string
	var err error
	switch {
	case r.Target == "DNAT" && a == "--to-destination":
		if v, err = next(i, a); err != nil {
			return err
		}
		if _, err := netip.ParseAddrPort(v); err != nil {
			if _, err := netip.ParseAddr(v); err != nil {
				return fmt.Errorf("bad --to-destination %q", v)
			}
		}
		r.ToDestination = v
	case r.Target == "MARK" && (a == "--set-xmark" || a == "--set-mark" || a == "--or-mark" || a == "--xor-mark" || a == "--and-mark"):
		if v, err = next(i, a); err != nil {
			return err
		}
		val, mask, hasMask, err := parseMark(v)
		if err != nil {
			return err
		}
		switch a {
		case "--set-xmark":
			r.MarkValue, r.MarkMask = val, mask
		case "--set-mark":
			if hasMask {
				r.MarkValue, r.MarkMask = val, mask|val
			} else {
				r.MarkValue, r.MarkMask = val, math.MaxUint32
			}
		case "--or-mark":
			r.MarkValue, r.MarkMask = val, val
		case "--xor-mark":
			r.MarkValue, r.MarkMask = val, 0
		case "--and-mark":
			r.MarkValue, r.MarkMask = 0, ^val
		}
		r.markSet = true
	case r.Target == "REDIRECT" && a == "--to-ports":
		if v, err = next(i, a); err != nil {
			return err
		}
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil || p == 0 {
			return fmt.Errorf("bad --to-ports %q (one port)", v)
		}
		r.ToPorts = uint16(p)
	case r.Target == "MASQUERADE" && a == "--random-fully":
		r.RandomFully = true
	case r.Target == "REJECT" && a == "--reject-with":
		if v, err = next(i, a); err != nil {
			return err
		}
		r.RejectWith = v
	default:
		return fmt.Errorf("unknown option %q for target %s", a, r.Target)
	}
	return nil
}

// accepts reports whether an option belongs to this match module.
func (m *Match) accepts(opt string) bool {
	switch m.Module {
	case "comment":
		return opt == "--comment"
	case "tcp", "udp", "sctp":
		return opt == "--dport" || opt == "--sport" || opt == "--destination-port" || opt == "--source-port"
	case "addrtype":
		return opt == "--src-type" || opt == "--dst-type"
	case "statistic":
		return opt == "--mode" || opt == "--probability"
	case "recent":
		switch opt {
		case "--name", "--set", "--rcheck", "--update", "--remove", "--seconds", "--reap", "--rsource", "--mask":
			return true
		}
	case "mark":
		return opt == "--mark"
	case "conntrack":
		return opt == "--ctstate"
	case "set":
		return opt == "--match-set"
	case "physdev":
		return opt == "--physdev-is-in"
	case "ipvs":
		return opt == "--vaddr" || opt == "--vport" || opt == "--vproto"
	case "nfacct":
		return opt == "--nfacct-name"
	}
	return false
}

func (m *Match) option(a string, not bool, i *int, next func(*int, string) (string, error)) error {
	var v string
	if optionTakesArg(a) {
		var err error
		if v, err = next(i, a); err != nil {
			return err
		}
	}
	if not {
		if !negatable(a) {
			return fmt.Errorf("\"!\" not allowed before %s", a)
		}
		if m.Not == nil {
			m.Not = map[string]bool{}
		}
	}
	key, err := m.setOption(a, v, i, next)
	if err != nil {
		return err
	}
	if not {
		m.Not[key] = true
	}
	return nil
}

// optionTakesArg reports whether a match option takes an argument.
func optionTakesArg(a string) bool {
	return !(a == "--set" || a == "--rcheck" || a == "--update" || a == "--remove" || a == "--reap" || a == "--rsource" ||
		a == "--physdev-is-in")
}

// negatable reports whether a match option may have "!" in front.
func negatable(a string) bool {
	switch a {
	case "--dport", "--sport", "--destination-port", "--source-port", "--src-type", "--dst-type", "--mark", "--ctstate",
		"--rcheck", "--set", "--update", "--remove", "--match-set", "--physdev-is-in", "--vaddr", "--vport", "--vproto":
		return true
	}
	return false
}

// setOption sets match option a, whose argument (if it takes one) is v, and returns the name its "!" is
// kept under.
func (m *Match) setOption(a, v string, i *int, next func(*int, string) (string, error)) (key string, err error) {
	switch a {
	case "--comment":
		if len(v) > 256 {
			return a, fmt.Errorf("comment may not exceed 256 characters")
		}
		m.Comment = v
	case "--dport", "--destination-port":
		return "--dport", setPorts(&m.DPort, v)
	case "--sport", "--source-port":
		return "--sport", setPorts(&m.SPort, v)
	case "--src-type", "--dst-type":
		return a, m.addrtypeOption(a, v)
	case "--mode", "--probability":
		return a, m.statisticOption(a, v)
	case "--name", "--set", "--rcheck", "--update", "--remove", "--seconds", "--reap", "--rsource", "--mask":
		return a, m.recentOption(a, v)
	case "--mark":
		m.MarkValue, m.MarkMask, m.HasMask, err = parseMark(v)
		return a, err
	case "--nfacct-name":
		if v == "" || len(v) > 31 {
			return a, fmt.Errorf("nfacct-name %q: must be 1 to 31 characters", v)
		}
		m.NFAcctName = v
	case "--ctstate":
		return a, m.ctstateOption(v)
	case "--match-set":
		return a, m.setMatchOption(a, v, i, next)
	case "--physdev-is-in":
		m.PhysdevIsIn = true
	case "--vaddr", "--vport", "--vproto":
		return a, m.ipvsOption(a, v)
	}
	return a, nil
}

// setPorts sets a tcp, udp or sctp port match to v, a port or a range.
func setPorts(dst *string, v string) error {
	if err := checkPorts(v); err != nil {
		return err
	}
	*dst = v
	return nil
}

// addrtypeOption sets --src-type or --dst-type.
func (m *Match) addrtypeOption(a, v string) error {
	if v != "LOCAL" && v != "UNICAST" && v != "BROADCAST" && v != "MULTICAST" && v != "UNSPEC" {
		return fmt.Errorf("addrtype %q not supported by iptrace", v)
	}
	if a == "--src-type" {
		m.SrcType = v
	} else {
		m.DstType = v
	}
	return nil
}

// statisticOption sets --mode (random only) or --probability.
func (m *Match) statisticOption(a, v string) error {
	switch a {
	case "--mode":
		if v != "random" {
			return fmt.Errorf("statistic mode %q not supported by iptrace", v)
		}
	case "--probability":
		p, err := strconv.ParseFloat(v, 64)
		if err != nil || p < 0 || p > 1 {
			return fmt.Errorf("bad --probability %q", v)
		}
		// The kernel keeps the probability as a fraction of 2^31.
		m.Probability = float64(uint32(math.Round(p*0x80000000))) / 0x80000000
		m.hasProb = true
	}
	return nil
}

// recentOption sets an option of the recent match.
func (m *Match) recentOption(a, v string) error {
	switch a {
	case "--name":
		m.RecentName = v
	case "--set", "--rcheck", "--update", "--remove":
		if m.RecentCommand != "" {
			return fmt.Errorf("recent: only one of --set, --rcheck, --update, --remove")
		}
		m.RecentCommand = a[2:]
	case "--seconds":
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("bad --seconds %q", v)
		}
		m.Seconds = n
	case "--reap":
		m.Reap = true
	case "--rsource":
	case "--mask":
		// Only the full mask is generated; accept it as iptables-save prints it.
	}
	return nil
}

// ctstateOption sets --ctstate, a list of states.
func (m *Match) ctstateOption(v string) error {
	for _, s := range strings.Split(v, ",") {
		switch s {
		case "NEW", "ESTABLISHED", "RELATED", "INVALID", "UNTRACKED", "SNAT", "DNAT":
		default:
			return fmt.Errorf("bad ctstate %q", s)
		}
	}
	m.CtStates = strings.Split(v, ",")
	return nil
}

// setMatchOption sets --match-set: the set's name v, then its dimensions' directions as the next word.
func (m *Match) setMatchOption(a, v string, i *int, next func(*int, string) (string, error)) error {
	dirs, err := next(i, a)
	if err != nil {
		return err
	}
	m.SetName, m.SetDirs = v, strings.Split(dirs, ",")
	if len(m.SetDirs) > maxSetDims {
		return fmt.Errorf("set match: more than %d dimensions in %q", maxSetDims, dirs)
	}
	for _, d := range m.SetDirs {
		if d != "src" && d != "dst" {
			return fmt.Errorf("set match: bad direction %q in %q", d, dirs)
		}
	}
	return nil
}

// ipvsOption sets --vaddr, --vport or --vproto.
func (m *Match) ipvsOption(a, v string) error {
	var err error
	switch a {
	case "--vaddr":
		m.VAddr, err = parsePrefix(v, m.ipv6)
		return err
	case "--vport":
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return fmt.Errorf("ipvs: bad --vport %q", v)
		}
		m.VPort = uint16(n)
	case "--vproto":
		n, ok := protoNumbers[strings.ToLower(v)]
		if !ok {
			p, err := strconv.ParseUint(v, 10, 8)
			if err != nil {
				return fmt.Errorf("ipvs: bad --vproto %q", v)
			}
			n = uint8(p)
		}
		m.VProto = n
	}
	return nil
}

func checkPorts(v string) error {
	lo, hi, isRange := strings.Cut(v, ":")
	for _, s := range []string{lo, hi} {
		if !isRange && s == hi {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 65535 {
			return fmt.Errorf("invalid port %q", v)
		}
	}
	return nil
}

func (m *Match) check(r *Rule) error {
	switch m.Module {
	case "tcp", "udp", "sctp":
		if r.Proto != m.Module || r.NotProto {
			return fmt.Errorf("%s match needs \"-p %s\"", m.Module, m.Module)
		}
	case "recent":
		if m.RecentName == "" {
			m.RecentName = "DEFAULT"
		}
		if m.RecentCommand == "" {
			return fmt.Errorf("recent: one of --set, --rcheck, --update, --remove required")
		}
		if m.Reap && m.Seconds == 0 {
			return fmt.Errorf("recent: --reap needs --seconds")
		}
	case "statistic":
		if !m.hasProb {
			return fmt.Errorf("statistic: --probability required")
		}
	case "conntrack":
		if len(m.CtStates) == 0 {
			return fmt.Errorf("conntrack: --ctstate required")
		}
	case "mark":
		if m.MarkMask == 0 && m.MarkValue == 0 && !m.HasMask {
			return fmt.Errorf("mark: --mark required")
		}
	case "set":
		if m.SetName == "" {
			return fmt.Errorf("set match: --match-set required")
		}
	case "physdev":
		if !m.PhysdevIsIn {
			return fmt.Errorf("physdev: only --physdev-is-in is supported by iptrace")
		}
	case "nfacct":
		if m.NFAcctName == "" {
			return fmt.Errorf("nfacct: --nfacct-name required")
		}
	case "ipvs":
		if !m.VAddr.IsValid() && m.VPort == 0 && m.VProto == 0 {
			return fmt.Errorf("ipvs: one of --vaddr, --vport, --vproto required (bare --ipvs is not supported by iptrace)")
		}
	}
	return nil
}

// saveString quotes a string as iptables-save does: bare when it only has letters, digits, '-', '_' and
// '.', else in double quotes with '"' and '\' escaped.
func saveString(b *strings.Builder, s string) {
	plain := s != ""
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			plain = false
			break
		}
	}
	if plain {
		b.WriteString(s)
		return
	}
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
}

// String returns the rule in iptables-save's canonical form, without "-A chain".
func (r *Rule) String() string {
	var w saveWriter
	r.writeHeader(&w)
	for _, m := range r.Matches {
		m.write(&w, r.isIPv6())
	}
	r.writeTarget(&w)
	return w.b.String()
}

// saveWriter builds a rule's iptables-save form.
type saveWriter struct {
	b strings.Builder
}

// sp separates what comes next from what was written.
func (w *saveWriter) sp() {
	if w.b.Len() > 0 {
		w.b.WriteByte(' ')
	}
}

// opt writes an option, negated or not, with its value unless that is "".
func (w *saveWriter) opt(not bool, name, val string) {
	w.sp()
	if not {
		w.b.WriteString("! ")
	}
	w.b.WriteString(name)
	if val != "" {
		w.b.WriteByte(' ')
		w.b.WriteString(val)
	}
}

// writeHeader writes the addresses, interfaces and protocol.
func (r *Rule) writeHeader(w *saveWriter) {
	if r.Src.IsValid() {
		w.opt(r.NotSrc, "-s", r.Src.String())
	}
	if r.Dst.IsValid() {
		w.opt(r.NotDst, "-d", r.Dst.String())
	}
	if r.In != "" {
		w.opt(r.NotIn, "-i", r.In)
	}
	if r.Out != "" {
		w.opt(r.NotOut, "-o", r.Out)
	}
	if r.Proto != "" {
		w.opt(r.NotProto, "-p", r.Proto)
	}
}

// write writes the match, "-m" and its options, in the order its libxt module prints them.
func (m *Match) write(w *saveWriter, ipv6 bool) {
	w.opt(false, "-m", m.Module)
	switch m.Module {
	case "comment":
		w.sp()
		w.b.WriteString("--comment ")
		saveString(&w.b, m.Comment)
	case "tcp", "udp", "sctp":
		m.writeIfSet(w, "--sport", m.SPort)
		m.writeIfSet(w, "--dport", m.DPort)
	case "addrtype":
		m.writeIfSet(w, "--src-type", m.SrcType)
		m.writeIfSet(w, "--dst-type", m.DstType)
	case "statistic":
		w.opt(false, "--mode", "random")
		w.opt(false, "--probability", strconv.FormatFloat(m.Probability, 'f', 11, 64))
	case "recent":
		m.writeRecent(w, ipv6)
	case "mark":
		v := "0x" + strconv.FormatUint(uint64(m.MarkValue), 16)
		if m.HasMask {
			v += "/0x" + strconv.FormatUint(uint64(m.MarkMask), 16)
		}
		w.opt(m.Not["--mark"], "--mark", v)
	case "conntrack":
		w.opt(m.Not["--ctstate"], "--ctstate", strings.Join(m.CtStates, ","))
	case "set":
		w.opt(m.Not["--match-set"], "--match-set", m.SetName+" "+strings.Join(m.SetDirs, ","))
	case "physdev":
		w.opt(m.Not["--physdev-is-in"], "--physdev-is-in", "")
	case "nfacct":
		// libxt_nfacct prints the option with a trailing space and the quoting helper adds another.
		w.opt(false, "--nfacct-name", "")
		w.b.WriteString("  ")
		saveString(&w.b, m.NFAcctName)
	case "ipvs":
		m.writeIPVS(w)
	}
}

// writeIfSet writes option name with value v, negated as the match has it, unless v is "".
func (m *Match) writeIfSet(w *saveWriter, name, v string) {
	if v != "" {
		w.opt(m.Not[name], name, v)
	}
}

// writeRecent writes the recent match's options, with the full mask of the family.
func (m *Match) writeRecent(w *saveWriter, ipv6 bool) {
	w.opt(m.Not["--"+m.RecentCommand], "--"+m.RecentCommand, "")
	if m.Seconds != 0 {
		w.opt(false, "--seconds", strconv.Itoa(m.Seconds))
	}
	if m.Reap {
		w.opt(false, "--reap", "")
	}
	w.opt(false, "--name", m.RecentName)
	mask := "255.255.255.255"
	if ipv6 {
		mask = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
	}
	w.opt(false, "--mask", mask)
	w.opt(false, "--rsource", "")
}

// writeIPVS writes the ipvs match's options in libxt_ipvs' order: protocol (as a number), address with
// its mask, port.
func (m *Match) writeIPVS(w *saveWriter) {
	if m.VProto != 0 {
		w.opt(m.Not["--vproto"], "--vproto", strconv.Itoa(int(m.VProto)))
	}
	if m.VAddr.IsValid() {
		w.opt(m.Not["--vaddr"], "--vaddr", m.VAddr.String())
	}
	if m.VPort != 0 {
		w.opt(m.Not["--vport"], "--vport", strconv.Itoa(int(m.VPort)))
	}
}

// writeTarget writes -j or -g and the target's options.
func (r *Rule) writeTarget(w *saveWriter) {
	if r.Target == "" {
		return
	}
	if r.Goto {
		w.opt(false, "-g", r.Target)
	} else {
		w.opt(false, "-j", r.Target)
	}
	switch r.Target {
	case "DNAT":
		w.opt(false, "--to-destination", r.ToDestination)
	case "REDIRECT":
		if r.ToPorts != 0 {
			w.opt(false, "--to-ports", strconv.Itoa(int(r.ToPorts)))
		}
	case "MARK":
		w.opt(false, "--set-xmark", fmt.Sprintf("%#x/%#x", r.MarkValue, r.MarkMask))
	case "MASQUERADE":
		if r.RandomFully {
			w.opt(false, "--random-fully", "")
		}
	case "REJECT":
		w.opt(false, "--reject-with", r.RejectWith)
	}
}

func (r *Rule) isIPv6() bool { return r.ipv6 }
