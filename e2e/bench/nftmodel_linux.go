package main

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"kube-proxy/e2e/harness"
)

// The monitor's model of mode nftables: the IPv4 table kube-proxy as the nf_tables notifications describe
// it. Of each rule it keeps what a new connection's DNAT depends on (the endpoint a single-endpoint rule
// translates to, or the map a numgen rule looks its endpoint up in); of each set and map its elements. The
// service-ips verdict map then says which chain a Service's address goes to, and that chain's rules which
// endpoints it reaches. Anonymous maps are named by whoever creates them (the kernel, `__map<n>`, for
// nft; our writer names its own): a name can come back for a new map after the old one went, so a NEWSET
// of an anonymous set starts it afresh. A NEWSET of a named set that exists is an update (the kernel
// announces every `add map` again) and keeps its elements.

// Netlink attributes and values of nf_tables expressions not in x/sys/unix.
const (
	nftaTableName    = 1 // NFTA_TABLE_NAME
	nftaLookupDreg   = 3 // NFTA_LOOKUP_DREG
	nftaNatRegAddr   = 3 // NFTA_NAT_REG_ADDR_MIN
	nftaNatRegProto  = 5 // NFTA_NAT_REG_PROTO_MIN
	nftaImmDreg      = 1 // NFTA_IMMEDIATE_DREG
	nftaImmData      = 2 // NFTA_IMMEDIATE_DATA
	nftaSetElemKey   = 1 // NFTA_SET_ELEM_KEY
	nftaSetElemData  = 2 // NFTA_SET_ELEM_DATA
	nftaSetListTable = 1 // NFTA_SET_ELEM_LIST_TABLE
	nftaSetListSet   = 2 // NFTA_SET_ELEM_LIST_SET
	nftaSetListElems = 3 // NFTA_SET_ELEM_LIST_ELEMENTS
	nftaDataValue    = 1 // NFTA_DATA_VALUE
	nftaDataVerdict  = 2 // NFTA_DATA_VERDICT
	nftaVerdictChain = 2 // NFTA_VERDICT_CHAIN
	protoTCP         = 6
)

// nftRule is what the model keeps of one rule: the endpoint its DNAT translates to (single endpoint), or
// the map it looks the endpoint up in (several); neither for a rule without DNAT.
type nftRule struct {
	dnat netip.AddrPort
	dmap string
}

// nftElem is a set or map element's value: the data of a map, or the chain of a verdict map's jump or goto.
type nftElem struct {
	data  string
	chain string
}

// nftModel is the IPv4 table kube-proxy: rules by chain and handle, elements by set and key (raw bytes).
type nftModel struct {
	rules map[string]map[uint64]nftRule
	sets  map[string]map[string]nftElem
}

func newNFTModel() *nftModel {
	return &nftModel{rules: map[string]map[uint64]nftRule{}, sets: map[string]map[string]nftElem{}}
}

// apply applies one notification (or dump message) of the IPv4 family, nfgenmsg stripped.
func (m *nftModel) apply(msgType uint16, attrs []byte) {
	switch msgType {
	case unix.NFT_MSG_DELTABLE:
		if attrString(attrs, nftaTableName) == nftTable {
			m.rules, m.sets = map[string]map[uint64]nftRule{}, map[string]map[string]nftElem{}
		}
	case unix.NFT_MSG_DELCHAIN:
		if attrString(attrs, unix.NFTA_CHAIN_TABLE) == nftTable {
			delete(m.rules, attrString(attrs, unix.NFTA_CHAIN_NAME))
		}
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		r, ok := parseRule(attrs, false)
		if !ok || r.table != nftTable {
			return
		}
		if msgType == unix.NFT_MSG_DELRULE {
			delete(m.rules[r.chain], r.handle)
			return
		}
		c := m.rules[r.chain]
		if c == nil {
			c = map[uint64]nftRule{}
			m.rules[r.chain] = c
		}
		c[r.handle] = parseDNAT(attrBytes(attrs, unix.NFTA_RULE_EXPRESSIONS))
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		if attrString(attrs, unix.NFTA_SET_TABLE) != nftTable {
			return
		}
		name := attrString(attrs, unix.NFTA_SET_NAME)
		flags, _ := attrU32(attrs, unix.NFTA_SET_FLAGS)
		switch {
		case msgType == unix.NFT_MSG_DELSET:
			delete(m.sets, name)
		case m.sets[name] == nil || flags&unix.NFT_SET_ANONYMOUS != 0:
			m.sets[name] = map[string]nftElem{}
		}
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		if attrString(attrs, nftaSetListTable) != nftTable {
			return
		}
		set := attrString(attrs, nftaSetListSet)
		forEachAttr(attrBytes(attrs, nftaSetListElems), func(t uint16, elem []byte) {
			if t != unix.NFTA_LIST_ELEM {
				return
			}
			key, value := parseElem(elem)
			s := m.sets[set]
			if msgType == unix.NFT_MSG_DELSETELEM {
				delete(s, key)
				return
			}
			if s == nil { // elements of a set the model missed: keep them anyway
				s = map[string]nftElem{}
				m.sets[set] = s
			}
			s[key] = value
		})
	}
}

// elemCount returns the number of elements a NEWSETELEM or DELSETELEM message carries.
func elemCount(attrs []byte) int {
	n := 0
	forEachAttr(attrBytes(attrs, nftaSetListElems), func(t uint16, _ []byte) {
		if t == unix.NFTA_LIST_ELEM {
			n++
		}
	})
	return n
}

// parseElem returns a set element's key and value (raw data, or the chain of a jump or goto).
func parseElem(elem []byte) (string, nftElem) {
	var key string
	var value nftElem
	forEachAttr(elem, func(t uint16, v []byte) {
		switch t {
		case nftaSetElemKey:
			key = string(attrBytes(v, nftaDataValue))
		case nftaSetElemData:
			forEachAttr(v, func(t uint16, v []byte) {
				switch t {
				case nftaDataValue:
					value.data = string(v)
				case nftaDataVerdict:
					value.chain = attrString(v, nftaVerdictChain)
				}
			})
		}
	})
	return key, value
}

// parseDNAT finds what a rule DNATs to: the map of a lookup whose result feeds the nat expression, or the
// address and port immediates load into the nat expression's registers.
func parseDNAT(exprs []byte) nftRule {
	var r nftRule
	regs := map[uint32][]byte{}
	nat := false
	var addrReg, protoReg uint32
	forEachAttr(exprs, func(t uint16, elem []byte) {
		if t != unix.NFTA_LIST_ELEM {
			return
		}
		name := attrString(elem, unix.NFTA_EXPR_NAME)
		data := attrBytes(elem, unix.NFTA_EXPR_DATA)
		switch name {
		case "immediate":
			if reg, ok := attrU32(data, nftaImmDreg); ok {
				if v := attrBytes(attrBytes(data, nftaImmData), nftaDataValue); v != nil {
					regs[reg] = v
				}
			}
		case "lookup":
			if _, ok := attrU32(data, nftaLookupDreg); ok {
				r.dmap = attrString(data, unix.NFTA_LOOKUP_SET)
			}
		case "nat":
			nat = true
			addrReg, _ = attrU32(data, nftaNatRegAddr)
			protoReg, _ = attrU32(data, nftaNatRegProto)
		}
	})
	if !nat {
		return nftRule{}
	}
	if r.dmap != "" {
		return r
	}
	if a, p := regs[addrReg], regs[protoReg]; len(a) == 4 && len(p) >= 2 {
		r.dnat = netip.AddrPortFrom(netip.AddrFrom4([4]byte(a)), binary.BigEndian.Uint16(p))
	}
	return r
}

// serviceKey is the service-ips key of an IPv4 TCP address and port: ipv4_addr . inet_proto .
// inet_service, each in a 4-byte register (protocol and port padded with zeros after them).
func serviceKey(ip netip.Addr, port uint16) string {
	k := make([]byte, 12)
	a := ip.As4()
	copy(k, a[:])
	k[4] = protoTCP
	binary.BigEndian.PutUint16(k[8:], port)
	return string(k)
}

// dispatch returns the chain service-ips sends ip:port (TCP) to, "" if none.
func (m *nftModel) dispatch(ip netip.Addr, port uint16) string {
	return m.sets[nftServiceIPs][serviceKey(ip, port)].chain
}

// endpoints returns the endpoints ("ip:port", sorted) the DNAT rule of chain translates to. A chain with
// several DNAT rules is one whose new rule was inserted ahead of the old one, which our mode nftables
// deletes a second later (rules/nftables: supersede); the benchmark's Service chains each hold one rule
// that DNATs every packet, so the first in the chain, the newest, is the one packets meet: the rule with
// the highest handle.
func (m *nftModel) endpoints(chain string) []string {
	var first uint64
	for h, r := range m.rules[chain] {
		if (r.dnat.IsValid() || r.dmap != "") && h > first {
			first = h
		}
	}
	if first == 0 {
		return nil
	}
	r := m.rules[chain][first]
	if r.dnat.IsValid() {
		return []string{r.dnat.String()}
	}
	var out []string
	for _, e := range m.sets[r.dmap] {
		if len(e.data) >= 6 {
			d := []byte(e.data)
			out = append(out, netip.AddrPortFrom(netip.AddrFrom4([4]byte(d[:4])), binary.BigEndian.Uint16(d[4:6])).String())
		}
	}
	slices.Sort(out)
	return out
}

// reaches returns the endpoints a new TCP connection to ip:port is sent to, sorted: none when service-ips
// has no element for it.
func (m *nftModel) reaches(ip netip.Addr, port uint16) []string {
	c := m.dispatch(ip, port)
	if c == "" {
		return nil
	}
	return m.endpoints(c)
}

// mapsOf returns the maps the rules of chain look endpoints up in.
func (m *nftModel) mapsOf(chain string) []string {
	var out []string
	for _, r := range m.rules[chain] {
		if r.dmap != "" {
			out = append(out, r.dmap)
		}
	}
	return out
}

// attrBytes returns the value of the first attribute of type typ in b, nil if none.
func attrBytes(b []byte, typ uint16) []byte {
	var out []byte
	found := false
	forEachAttr(b, func(t uint16, v []byte) {
		if t == typ && !found {
			out, found = v, true
		}
	})
	return out
}

// attrString returns a string attribute of b, "" if none.
func attrString(b []byte, typ uint16) string { return cstr(attrBytes(b, typ)) }

// attrU32 returns a big-endian 32-bit attribute of b.
func attrU32(b []byte, typ uint16) (uint32, bool) {
	v := attrBytes(b, typ)
	if len(v) != 4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(v), true
}

// dumpNFT reads the IPv4 table kube-proxy from the kernel in ns by netlink dumps: the rules of chains
// and the maps they look endpoints up in, or with no chains the whole table (every rule, every set and
// its elements).
func dumpNFT(ns *harness.NetNS, chains []string) (*nftModel, error) {
	m := newNFTModel()
	err := inNetNS(ns, func(c *nlConn) error {
		apply := func(typ uint16, attrs []byte) { m.apply(typ, attrs) }
		var sets []string
		if len(chains) == 0 {
			if err := c.dump(ruleRequest(nftTable, ""), func() { m.rules = map[string]map[uint64]nftRule{} }, apply); err != nil {
				return err
			}
			err := c.dump(nftRequest(unix.NFT_MSG_GETSET, strAttr{unix.NFTA_SET_TABLE, nftTable}), func() { sets = sets[:0] },
				func(typ uint16, attrs []byte) {
					if typ == unix.NFT_MSG_NEWSET {
						sets = append(sets, attrString(attrs, unix.NFTA_SET_NAME))
					}
				})
			if err != nil {
				return err
			}
		} else {
			for _, chain := range chains {
				if err := c.dump(ruleRequest(nftTable, chain), func() { delete(m.rules, chain) }, apply); err != nil {
					return err
				}
				sets = append(sets, m.mapsOf(chain)...)
			}
		}
		for _, set := range sets {
			m.sets[set] = map[string]nftElem{}
			req := nftRequest(unix.NFT_MSG_GETSETELEM, strAttr{nftaSetListTable, nftTable}, strAttr{nftaSetListSet, set})
			if err := c.dump(req, func() { m.sets[set] = map[string]nftElem{} }, apply); err != nil {
				return fmt.Errorf("set %s: %w", set, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading table ip %s in %s: %w", nftTable, ns.Name, err)
	}
	return m, nil
}
