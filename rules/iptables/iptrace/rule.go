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
	r := &Rule{ipv6: ipv6}
	var cur *Match // the match options attach to
	not := false
	inTarget := false
	next := func(i *int, opt string) (string, error) {
		if *i+1 >= len(args) {
			return "", fmt.Errorf("option %q requires an argument", opt)
		}
		*i++
		return args[*i], nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "!" {
			if not {
				return nil, fmt.Errorf("multiple \"!\"")
			}
			not = true
			continue
		}
		var v string
		var err error
		wasNot := not
		not = false
		switch a {
		case "-s", "--source", "-d", "--destination":
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			p, err := parsePrefix(v, ipv6)
			if err != nil {
				return nil, err
			}
			if a == "-s" || a == "--source" {
				r.Src, r.NotSrc = p, wasNot
			} else {
				r.Dst, r.NotDst = p, wasNot
			}
			continue
		case "-i", "--in-interface", "-o", "--out-interface":
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			if a == "-i" || a == "--in-interface" {
				r.In, r.NotIn = v, wasNot
			} else {
				r.Out, r.NotOut = v, wasNot
			}
			continue
		case "-p", "--protocol":
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			r.Proto, r.NotProto = strings.ToLower(v), wasNot
			continue
		case "-m", "--match":
			if wasNot {
				return nil, fmt.Errorf("\"!\" before -m")
			}
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			switch v {
			case "comment", "tcp", "udp", "sctp", "addrtype", "statistic", "recent", "mark", "conntrack", "set", "physdev", "ipvs", "nfacct":
			default:
				return nil, fmt.Errorf("couldn't load match %q: not supported by iptrace", v)
			}
			cur = &Match{Module: v, ipv6: ipv6}
			r.Matches = append(r.Matches, cur)
			inTarget = false
			continue
		case "-j", "--jump", "-g", "--goto":
			if wasNot {
				return nil, fmt.Errorf("\"!\" before %s", a)
			}
			if r.Target != "" {
				return nil, fmt.Errorf("multiple targets")
			}
			if v, err = next(&i, a); err != nil {
				return nil, err
			}
			r.Target, r.Goto = v, a == "-g" || a == "--goto"
			inTarget = true
			if r.Target == "REJECT" {
				r.RejectWith = "icmp-port-unreachable"
				if ipv6 {
					r.RejectWith = "icmp6-port-unreachable"
				}
			}
			continue
		}
		if !strings.HasPrefix(a, "--") {
			return nil, fmt.Errorf("bad argument %q", a)
		}
		if inTarget {
			if wasNot {
				return nil, fmt.Errorf("\"!\" before target option %s", a)
			}
			if err := r.targetOption(a, &i, args, next); err != nil {
				return nil, err
			}
			continue
		}
		if cur == nil || !cur.accepts(a) {
			// An option of the protocol match iptables loads implicitly for "-p tcp --dport 80".
			if (a == "--dport" || a == "--sport" || a == "--destination-port" || a == "--source-port") &&
				(r.Proto == "tcp" || r.Proto == "udp" || r.Proto == "sctp") {
				cur = &Match{Module: r.Proto}
				r.Matches = append(r.Matches, cur)
			} else {
				return nil, fmt.Errorf("unknown option %q", a)
			}
		}
		if err := cur.option(a, wasNot, &i, next); err != nil {
			return nil, err
		}
	}
	if not {
		return nil, fmt.Errorf("\"!\" at the end")
	}
	for _, m := range r.Matches {
		if err := m.check(r); err != nil {
			return nil, err
		}
	}
	switch r.Target {
	case "DNAT":
		if r.ToDestination == "" {
			return nil, fmt.Errorf("DNAT needs --to-destination")
		}
	case "REDIRECT":
		if r.ToPorts != 0 && r.Proto != "tcp" && r.Proto != "udp" && r.Proto != "sctp" {
			return nil, fmt.Errorf("REDIRECT --to-ports needs -p tcp, udp or sctp")
		}
	case "MARK":
		if !r.markSet {
			return nil, fmt.Errorf("MARK target: parameter required")
		}
	}
	return r, nil
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
	var err error
	needsArg := !(a == "--set" || a == "--rcheck" || a == "--update" || a == "--remove" || a == "--reap" || a == "--rsource" ||
		a == "--physdev-is-in")
	if needsArg {
		if v, err = next(i, a); err != nil {
			return err
		}
	}
	if not {
		switch a {
		case "--dport", "--sport", "--destination-port", "--source-port", "--src-type", "--dst-type", "--mark", "--ctstate",
			"--rcheck", "--set", "--update", "--remove", "--match-set", "--physdev-is-in", "--vaddr", "--vport", "--vproto":
		default:
			return fmt.Errorf("\"!\" not allowed before %s", a)
		}
		if m.Not == nil {
			m.Not = map[string]bool{}
		}
	}
	key := a
	switch a {
	case "--comment":
		if len(v) > 256 {
			return fmt.Errorf("comment may not exceed 256 characters")
		}
		m.Comment = v
	case "--dport", "--destination-port":
		key = "--dport"
		if err := checkPorts(v); err != nil {
			return err
		}
		m.DPort = v
	case "--sport", "--source-port":
		key = "--sport"
		if err := checkPorts(v); err != nil {
			return err
		}
		m.SPort = v
	case "--src-type", "--dst-type":
		if v != "LOCAL" && v != "UNICAST" && v != "BROADCAST" && v != "MULTICAST" && v != "UNSPEC" {
			return fmt.Errorf("addrtype %q not supported by iptrace", v)
		}
		if a == "--src-type" {
			m.SrcType = v
		} else {
			m.DstType = v
		}
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
	case "--mark":
		m.MarkValue, m.MarkMask, m.HasMask, err = parseMark(v)
		if err != nil {
			return err
		}
	case "--nfacct-name":
		if v == "" || len(v) > 31 {
			return fmt.Errorf("nfacct-name %q: must be 1 to 31 characters", v)
		}
		m.NFAcctName = v
	case "--ctstate":
		for _, s := range strings.Split(v, ",") {
			switch s {
			case "NEW", "ESTABLISHED", "RELATED", "INVALID", "UNTRACKED", "SNAT", "DNAT":
			default:
				return fmt.Errorf("bad ctstate %q", s)
			}
		}
		m.CtStates = strings.Split(v, ",")
	case "--match-set":
		// The set's name, then its dimensions' directions as the next word.
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
	case "--physdev-is-in":
		m.PhysdevIsIn = true
	case "--vaddr":
		if m.VAddr, err = parsePrefix(v, m.ipv6); err != nil {
			return err
		}
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
	if not {
		m.Not[key] = true
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
	var b strings.Builder
	sp := func() {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
	}
	opt := func(not bool, name, val string) {
		sp()
		if not {
			b.WriteString("! ")
		}
		b.WriteString(name)
		if val != "" {
			b.WriteByte(' ')
			b.WriteString(val)
		}
	}
	prefix := func(p AddrMask) string {
		return p.String()
	}
	if r.Src.IsValid() {
		opt(r.NotSrc, "-s", prefix(r.Src))
	}
	if r.Dst.IsValid() {
		opt(r.NotDst, "-d", prefix(r.Dst))
	}
	if r.In != "" {
		opt(r.NotIn, "-i", r.In)
	}
	if r.Out != "" {
		opt(r.NotOut, "-o", r.Out)
	}
	if r.Proto != "" {
		opt(r.NotProto, "-p", r.Proto)
	}
	for _, m := range r.Matches {
		opt(false, "-m", m.Module)
		switch m.Module {
		case "comment":
			sp()
			b.WriteString("--comment ")
			saveString(&b, m.Comment)
		case "tcp", "udp", "sctp":
			if m.SPort != "" {
				opt(m.Not["--sport"], "--sport", m.SPort)
			}
			if m.DPort != "" {
				opt(m.Not["--dport"], "--dport", m.DPort)
			}
		case "addrtype":
			if m.SrcType != "" {
				opt(m.Not["--src-type"], "--src-type", m.SrcType)
			}
			if m.DstType != "" {
				opt(m.Not["--dst-type"], "--dst-type", m.DstType)
			}
		case "statistic":
			opt(false, "--mode", "random")
			opt(false, "--probability", strconv.FormatFloat(m.Probability, 'f', 11, 64))
		case "recent":
			opt(m.Not["--"+m.RecentCommand], "--"+m.RecentCommand, "")
			if m.Seconds != 0 {
				opt(false, "--seconds", strconv.Itoa(m.Seconds))
			}
			if m.Reap {
				opt(false, "--reap", "")
			}
			opt(false, "--name", m.RecentName)
			mask := "255.255.255.255"
			if r.isIPv6() {
				mask = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
			}
			opt(false, "--mask", mask)
			opt(false, "--rsource", "")
		case "mark":
			v := "0x" + strconv.FormatUint(uint64(m.MarkValue), 16)
			if m.HasMask {
				v += "/0x" + strconv.FormatUint(uint64(m.MarkMask), 16)
			}
			opt(m.Not["--mark"], "--mark", v)
		case "conntrack":
			opt(m.Not["--ctstate"], "--ctstate", strings.Join(m.CtStates, ","))
		case "set":
			opt(m.Not["--match-set"], "--match-set", m.SetName+" "+strings.Join(m.SetDirs, ","))
		case "physdev":
			opt(m.Not["--physdev-is-in"], "--physdev-is-in", "")
		case "nfacct":
			// libxt_nfacct prints the option with a trailing space and the quoting helper adds another.
			opt(false, "--nfacct-name", "")
			b.WriteString("  ")
			saveString(&b, m.NFAcctName)
		case "ipvs":
			// In libxt_ipvs' order: protocol (as a number), address with its mask, port.
			if m.VProto != 0 {
				opt(m.Not["--vproto"], "--vproto", strconv.Itoa(int(m.VProto)))
			}
			if m.VAddr.IsValid() {
				opt(m.Not["--vaddr"], "--vaddr", m.VAddr.String())
			}
			if m.VPort != 0 {
				opt(m.Not["--vport"], "--vport", strconv.Itoa(int(m.VPort)))
			}
		}
	}
	if r.Target != "" {
		if r.Goto {
			opt(false, "-g", r.Target)
		} else {
			opt(false, "-j", r.Target)
		}
		switch r.Target {
		case "DNAT":
			opt(false, "--to-destination", r.ToDestination)
		case "REDIRECT":
			if r.ToPorts != 0 {
				opt(false, "--to-ports", strconv.Itoa(int(r.ToPorts)))
			}
		case "MARK":
			opt(false, "--set-xmark", fmt.Sprintf("%#x/%#x", r.MarkValue, r.MarkMask))
		case "MASQUERADE":
			if r.RandomFully {
				opt(false, "--random-fully", "")
			}
		case "REJECT":
			opt(false, "--reject-with", r.RejectWith)
		}
	}
	return b.String()
}

func (r *Rule) isIPv6() bool { return r.ipv6 }
