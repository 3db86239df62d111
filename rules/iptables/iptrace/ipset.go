package iptrace

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ipSet is one ipset as the set match sees it: its type's dimensions and its members.
type ipSet struct {
	typ     string
	dims    []dimKind
	members map[string]bool // canonical member strings
}

// dimKind is what one dimension of a set type takes from the packet.
type dimKind int

const (
	dimIP   dimKind = iota // an address
	dimPort                // "proto:port" (hash types) or a port (bitmap:port)
	dimNet                 // an address inside a prefix
)

// setTypes are the ipset types the tracer understands, with their dimensions.
var setTypes = map[string][]dimKind{
	"hash:ip":          {dimIP},
	"hash:ip,port":     {dimIP, dimPort},
	"hash:ip,port,ip":  {dimIP, dimPort, dimIP},
	"hash:ip,port,net": {dimIP, dimPort, dimNet},
	"bitmap:port":      {dimPort},
}

// SetIPSet gives the tracer an ipset: its name, its type as ipset names it ("hash:ip", "hash:ip,port",
// "hash:ip,port,ip", "hash:ip,port,net" or "bitmap:port") and its members written as `ipset save` writes
// them ("10.96.0.1", "10.96.0.1,tcp:80", "10.96.0.1,tcp:80,10.244.1.5", "10.96.0.1,tcp:80,10.0.0.0/8",
// "30080"). It replaces the set's members if it was given before. Rules can name a set with "-m set
// --match-set" only once it was given, as the kernel refuses rules naming a missing set.
func (ts *Tables) SetIPSet(name, typ string, members ...string) error {
	dims, ok := setTypes[typ]
	if !ok {
		return fmt.Errorf("ipset %s: type %q not supported by iptrace", name, typ)
	}
	s := &ipSet{typ: typ, dims: dims, members: make(map[string]bool, len(members))}
	for _, m := range members {
		c, err := canonMember(dims, m, ts.ipv6)
		if err != nil {
			return fmt.Errorf("ipset %s (%s): %w", name, typ, err)
		}
		s.members[c] = true
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.sets == nil {
		ts.sets = map[string]*ipSet{}
	}
	ts.sets[name] = s
	return nil
}

// canonMember parses a member of a set with the given dimensions and writes it canonically.
func canonMember(dims []dimKind, m string, ipv6 bool) (string, error) {
	parts := strings.Split(strings.TrimSpace(m), ",")
	if len(parts) != len(dims) {
		return "", fmt.Errorf("member %q: want %d fields", m, len(dims))
	}
	out := make([]string, len(parts))
	for i, p := range parts {
		var err error
		switch dims[i] {
		case dimIP:
			var a netip.Addr
			if a, err = netip.ParseAddr(p); err == nil && a.Is6() != ipv6 {
				err = fmt.Errorf("address of the other family")
			}
			out[i] = a.String()
		case dimNet:
			var pre netip.Prefix
			if strings.Contains(p, "/") {
				pre, err = netip.ParsePrefix(p)
			} else {
				var a netip.Addr
				if a, err = netip.ParseAddr(p); err == nil {
					pre = netip.PrefixFrom(a, a.BitLen())
				}
			}
			if err == nil && pre.Addr().Is6() != ipv6 {
				err = fmt.Errorf("address of the other family")
			}
			out[i] = pre.Masked().String()
		case dimPort:
			if len(dims) == 1 { // bitmap:port
				var n uint64
				n, err = strconv.ParseUint(p, 10, 16)
				out[i] = strconv.FormatUint(n, 10)
				break
			}
			proto, port, ok := strings.Cut(p, ":")
			if !ok {
				proto, port = "tcp", p // ipset's default protocol
			}
			if _, known := protoNumbers[strings.ToLower(proto)]; !known {
				err = fmt.Errorf("protocol %q not supported by iptrace", proto)
				break
			}
			var n uint64
			n, err = strconv.ParseUint(port, 10, 16)
			out[i] = strings.ToLower(proto) + ":" + strconv.FormatUint(n, 10)
		}
		if err != nil {
			return "", fmt.Errorf("member %q: field %q: %v", m, p, err)
		}
	}
	return strings.Join(out, ","), nil
}

// checkSets refuses a rule whose set match names a set that was not given or takes more dimensions than
// the set has, as the kernel does.
func (ts *Tables) checkSets(r *Rule) error {
	for _, m := range r.Matches {
		if m.Module != "set" {
			continue
		}
		s := ts.sets[m.SetName]
		if s == nil {
			return fmt.Errorf("set %s doesn't exist", m.SetName)
		}
		if len(m.SetDirs) > len(s.dims) {
			return fmt.Errorf("set %s (%s) has %d dimensions, the match uses %d", m.SetName, s.typ, len(s.dims), len(m.SetDirs))
		}
	}
	return nil
}

// inSet reports whether the packet, as st has it now, is in the set a set match names. Each dimension
// takes the source or destination address or port, as the match's directions say.
func (tr *tracer) inSet(m *Match, st *state) (bool, error) {
	s := tr.ts.sets[m.SetName]
	if s == nil {
		return false, fmt.Errorf("set %s doesn't exist", m.SetName)
	}
	if len(m.SetDirs) != len(s.dims) {
		return false, fmt.Errorf("set %s (%s): a match on %d of its %d dimensions is not supported by the tracer",
			m.SetName, s.typ, len(m.SetDirs), len(s.dims))
	}
	parts := make([]string, len(s.dims))
	for i, d := range s.dims {
		src := m.SetDirs[i] == "src"
		switch d {
		case dimIP, dimNet:
			a := st.dst
			if src {
				a = tr.pkt.Src
			}
			if d == dimIP {
				parts[i] = a.String()
				continue
			}
			parts[i] = "" // matched against every prefix below
		case dimPort:
			if src {
				return false, fmt.Errorf("set %s: a source port is not supported by the tracer", m.SetName)
			}
			if _, ok := protoNumbers[tr.pkt.Protocol]; !ok {
				return false, nil // no ports: the kernel's set match fails
			}
			if len(s.dims) == 1 {
				parts[i] = strconv.Itoa(int(st.dport))
			} else {
				parts[i] = tr.pkt.Protocol + ":" + strconv.Itoa(int(st.dport))
			}
		}
	}
	for i, d := range s.dims {
		if d != dimNet {
			continue
		}
		// A net dimension: look for a member whose prefix holds the address.
		a := st.dst
		if m.SetDirs[i] == "src" {
			a = tr.pkt.Src
		}
		for member := range s.members {
			f := strings.Split(member, ",")
			pre, err := netip.ParsePrefix(f[i])
			if err != nil || !pre.Contains(a) {
				continue
			}
			same := true
			for j := range f {
				if j != i && f[j] != parts[j] {
					same = false
				}
			}
			if same {
				return true, nil
			}
		}
		return false, nil
	}
	return s.members[strings.Join(parts, ",")], nil
}
