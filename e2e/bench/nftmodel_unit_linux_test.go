package main

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Builders of nf_tables netlink attributes, as the kernel sends them in notifications.
func nlAttr(typ uint16, v []byte) []byte { return appendAttr(nil, typ, v) }
func nlNest(typ uint16, parts ...[]byte) []byte {
	var v []byte
	for _, p := range parts {
		v = append(v, p...)
	}
	return nlAttr(typ|unix.NLA_F_NESTED, v)
}
func nlStr(typ uint16, s string) []byte { return nlAttr(typ, append([]byte(s), 0)) }
func nlU32(typ uint16, v uint32) []byte { return nlAttr(typ, binary.BigEndian.AppendUint32(nil, v)) }

func nlExpr(name string, data ...[]byte) []byte {
	return nlNest(unix.NFTA_LIST_ELEM, nlStr(unix.NFTA_EXPR_NAME, name), nlNest(unix.NFTA_EXPR_DATA, data...))
}

func nlRule(table, chain string, handle uint64, exprs ...[]byte) []byte {
	b := append(nlStr(unix.NFTA_RULE_TABLE, table), nlStr(unix.NFTA_RULE_CHAIN, chain)...)
	b = append(b, nlAttr(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, handle))...)
	return append(b, nlNest(unix.NFTA_RULE_EXPRESSIONS, exprs...)...)
}

// mapDNAT is `meta l4proto tcp dnat ip addr . port to numgen random mod N map @set` as nft 1.0.6 encodes it.
func mapDNAT(set string) [][]byte {
	return [][]byte{
		nlExpr("meta", nlU32(unix.NFTA_META_DREG, 1), nlU32(unix.NFTA_META_KEY, unix.NFT_META_L4PROTO)),
		nlExpr("numgen", nlU32(unix.NFTA_NG_DREG, 1)),
		nlExpr("lookup", nlStr(unix.NFTA_LOOKUP_SET, set), nlU32(unix.NFTA_LOOKUP_SREG, 1), nlU32(nftaLookupDreg, 1)),
		nlExpr("nat", nlU32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT), nlU32(nftaNatRegAddr, 1), nlU32(nftaNatRegProto, 9)),
	}
}

// oneDNAT is `meta l4proto tcp dnat to IP:PORT`: immediates into registers 1 and 2.
func oneDNAT(ep string) [][]byte {
	ap := netip.MustParseAddrPort(ep)
	ip := ap.Addr().As4()
	imm := func(reg uint32, v []byte) []byte {
		return nlExpr("immediate", nlU32(nftaImmDreg, reg), nlNest(nftaImmData, nlAttr(nftaDataValue, v)))
	}
	return [][]byte{
		imm(1, ip[:]),
		imm(2, binary.BigEndian.AppendUint16(nil, ap.Port())),
		nlExpr("nat", nlU32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT), nlU32(nftaNatRegAddr, 1), nlU32(nftaNatRegProto, 2)),
	}
}

// nlSet is a set message; the kernel's anonymous sets have the flag NFT_SET_ANONYMOUS.
func nlSet(table, name string) []byte {
	b := append(nlStr(unix.NFTA_SET_TABLE, table), nlStr(unix.NFTA_SET_NAME, name)...)
	var flags uint32
	if strings.HasPrefix(name, "__") {
		flags = unix.NFT_SET_ANONYMOUS | unix.NFT_SET_CONSTANT | unix.NFT_SET_MAP
	}
	return append(b, nlU32(unix.NFTA_SET_FLAGS, flags)...)
}

// nlElems is a set element message; each element is a key and either map data or a goto chain.
func nlElems(table, set string, elems ...[2]any) []byte {
	var list [][]byte
	for _, e := range elems {
		parts := [][]byte{nlNest(nftaSetElemKey, nlAttr(nftaDataValue, e[0].([]byte)))}
		switch v := e[1].(type) {
		case []byte:
			parts = append(parts, nlNest(nftaSetElemData, nlAttr(nftaDataValue, v)))
		case string:
			parts = append(parts, nlNest(nftaSetElemData, nlNest(nftaDataVerdict,
				nlU32(unix.NFTA_VERDICT_CODE, uint32(0xfffffffc)), nlStr(nftaVerdictChain, v))))
		}
		list = append(list, nlNest(unix.NFTA_LIST_ELEM, parts...))
	}
	b := append(nlStr(nftaSetListTable, table), nlStr(nftaSetListSet, set)...)
	return append(b, nlNest(nftaSetListElems, list...)...)
}

// numgenElem is element k of an anonymous DNAT map: numgen value → ip . port (each in a 4-byte register).
func numgenElem(k uint32, ep string) [2]any {
	ap := netip.MustParseAddrPort(ep)
	ip := ap.Addr().As4()
	data := append(ip[:], binary.BigEndian.AppendUint16(nil, ap.Port())...)
	return [2]any{binary.NativeEndian.AppendUint32(nil, k), append(data, 0, 0)}
}

// TestNFTModel feeds the model notifications shaped as the kernel sends them: a Service's chain with a
// numgen map, service-ips announced again (kept), the chain rewritten as upstream rewrites it (the map deleted and a new one created under the same
// kernel-chosen name, with and without the DELSET), then to one endpoint, then its service-ips element
// deleted.
func TestNFTModel(t *testing.T) {
	m := newNFTModel()
	svc := netip.MustParseAddr("10.96.0.7")
	chain := "service-A-bench/svc-00007/tcp/http"
	reaches := func(want ...string) {
		t.Helper()
		if got := m.reaches(svc, 80); !slices.Equal(got, want) {
			t.Errorf("reaches %v, want %v", got, want)
		}
	}
	m.apply(unix.NFT_MSG_NEWSET, nlSet(nftTable, nftServiceIPs))
	m.apply(unix.NFT_MSG_NEWSET, nlSet(nftTable, "__map0"))
	m.apply(unix.NFT_MSG_NEWSETELEM, nlElems(nftTable, "__map0", numgenElem(0, "10.244.128.2:8080"), numgenElem(1, "10.244.128.1:8080")))
	m.apply(unix.NFT_MSG_NEWRULE, nlRule(nftTable, chain, 5, mapDNAT("__map0")...))
	reaches()
	elems := nlElems(nftTable, nftServiceIPs, [2]any{[]byte(serviceKey(svc, 80)), chain})
	if n := elemCount(elems); n != 1 {
		t.Errorf("elemCount = %d, want 1", n)
	}
	m.apply(unix.NFT_MSG_NEWSETELEM, elems)
	reaches("10.244.128.1:8080", "10.244.128.2:8080")
	// Adding the named map again (upstream's full syncs do) is announced, and keeps its elements.
	m.apply(unix.NFT_MSG_NEWSET, nlSet(nftTable, nftServiceIPs))
	reaches("10.244.128.1:8080", "10.244.128.2:8080")
	if m.reaches(svc, 443) != nil || m.dispatch(svc, 80) != chain {
		t.Errorf("dispatch of port 443 %q, of 80 %q", m.dispatch(svc, 443), m.dispatch(svc, 80))
	}

	// Rewritten with three endpoints: the old map goes (DELSET), a new one takes its name.
	m.apply(unix.NFT_MSG_DELRULE, nlRule(nftTable, chain, 5))
	m.apply(unix.NFT_MSG_DELSET, nlSet(nftTable, "__map0"))
	m.apply(unix.NFT_MSG_NEWSET, nlSet(nftTable, "__map0"))
	m.apply(unix.NFT_MSG_NEWSETELEM, nlElems(nftTable, "__map0", numgenElem(0, "10.244.128.1:8080"),
		numgenElem(1, "10.244.128.3:8080"), numgenElem(2, "10.244.128.4:8080")))
	m.apply(unix.NFT_MSG_NEWRULE, nlRule(nftTable, chain, 6, mapDNAT("__map0")...))
	reaches("10.244.128.1:8080", "10.244.128.3:8080", "10.244.128.4:8080")

	// Again without a DELSET: the NEWSET alone starts the map afresh.
	m.apply(unix.NFT_MSG_DELRULE, nlRule(nftTable, chain, 6))
	m.apply(unix.NFT_MSG_NEWSET, nlSet(nftTable, "__map0"))
	m.apply(unix.NFT_MSG_NEWSETELEM, nlElems(nftTable, "__map0", numgenElem(0, "10.244.128.5:8080"), numgenElem(1, "10.244.128.6:8080")))
	m.apply(unix.NFT_MSG_NEWRULE, nlRule(nftTable, chain, 7, mapDNAT("__map0")...))
	reaches("10.244.128.5:8080", "10.244.128.6:8080")

	// Our writer inserts the new rule ahead of the old one and deletes the old one a second later: the
	// new rule (the highest handle) is the one packets meet.
	m.apply(unix.NFT_MSG_NEWSET, nlSet(nftTable, "__map1"))
	m.apply(unix.NFT_MSG_NEWSETELEM, nlElems(nftTable, "__map1", numgenElem(0, "10.244.128.7:8080")))
	m.apply(unix.NFT_MSG_NEWRULE, nlRule(nftTable, chain, 70, mapDNAT("__map1")...))
	reaches("10.244.128.7:8080")
	m.apply(unix.NFT_MSG_DELRULE, nlRule(nftTable, chain, 7))
	reaches("10.244.128.7:8080")

	// One endpoint: a plain DNAT; a rule of another table changes nothing.
	m.apply(unix.NFT_MSG_DELRULE, nlRule(nftTable, chain, 70))
	m.apply(unix.NFT_MSG_NEWRULE, nlRule(nftTable, chain, 8, oneDNAT("10.244.128.9:8080")...))
	m.apply(unix.NFT_MSG_NEWRULE, nlRule("nat", chain, 9, oneDNAT("10.244.128.10:8080")...))
	reaches("10.244.128.9:8080")
	if got := m.mapsOf(chain); len(got) != 0 {
		t.Errorf("maps of a single-endpoint chain: %v", got)
	}

	m.apply(unix.NFT_MSG_DELSETELEM, nlElems(nftTable, nftServiceIPs, [2]any{[]byte(serviceKey(svc, 80)), chain}))
	reaches()
	m.apply(unix.NFT_MSG_DELCHAIN, append(nlStr(unix.NFTA_CHAIN_TABLE, nftTable), nlStr(unix.NFTA_CHAIN_NAME, chain)...))
	if len(m.endpoints(chain)) != 0 {
		t.Errorf("a deleted chain still has endpoints %v", m.endpoints(chain))
	}
	m.apply(unix.NFT_MSG_DELTABLE, nlStr(nftaTableName, nftTable))
	if len(m.sets) != 0 || len(m.rules) != 0 {
		t.Errorf("after DELTABLE: %d sets, %d chains", len(m.sets), len(m.rules))
	}
}
