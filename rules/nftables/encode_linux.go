package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// This file turns transactions into nf_tables netlink messages: the same objects, with the same
// attributes, expressions and user data that nft 1.0 sends for the commands tx.String() prints, so that
// `nft list table` reads the same whichever wrote the table. What nft sends was read with
// `nft --debug=netlink,mnl`; the kernel tests compare both tables.
//
// One difference is deliberate: nft names anonymous sets "__set%d" and lets the kernel pick the number,
// which makes the kernel scan every set of the table for each new one (and a table holds one per
// multi-endpoint Service); the encoder names them itself.

// nft's data type numbers (src/datatype.h) and how it combines them for concatenations.
const (
	typeInteger  = 4
	typeIPAddr   = 7
	typeIP6Addr  = 8
	typeInetProt = 12
	typeInetServ = 13
	typeBits     = 6
	typeVerdict  = 0xffffff00 // NFT_DATA_VERDICT
)

// nft's expression ids in set user data (typeof).
const (
	udExprVerdict = 1
	udExprPayload = 7
	udExprConcat  = 13
	udProtoIP     = 12 // proto_ip
	udProtoIP6    = 13 // proto_ip6
)

// Attributes and verdict codes that golang.org/x/sys/unix does not name.
const (
	nftaTableUserdata = 6  // NFTA_TABLE_USERDATA
	nftaChainUserdata = 12 // NFTA_CHAIN_USERDATA
	nfDrop            = 0  // NF_DROP
	nfAccept          = 1  // NF_ACCEPT
	nftJump           = -3 // NFT_JUMP
	nftGoto           = -4 // NFT_GOTO
	nftReturn         = -5 // NFT_RETURN
)

// User data TLV types (libnftnl's NFTNL_UDATA_*).
const (
	udSetKeyByteorder  = 0
	udSetDataByteorder = 1
	udSetMerge         = 2
	udSetKeyTypeof     = 3
	udSetDataTypeof    = 4
	udSetDataInterval  = 6
	udSetComment       = 7
	udComment          = 0 // table, chain, rule and element comments
	udElemFlags        = 1
	udTypeofExpr       = 0
	udTypeofData       = 1
	byteorderHost      = 1
	byteorderBig       = 2
)

// nfproto returns the netfilter family number of the table.
func (f *family) nfproto() byte {
	if f.v1 == familyIPv6.v1 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

func (f *family) addrLen() uint32 {
	if f == familyIPv6 {
		return 16
	}
	return 4
}

func (f *family) addrTypeNum() uint32 {
	if f == familyIPv6 {
		return typeIP6Addr
	}
	return typeIPAddr
}

// addrOffset is where the source or destination address is in the network header.
func (f *family) addrOffset(saddr bool) uint32 {
	switch {
	case f == familyIPv6 && saddr:
		return 8
	case f == familyIPv6:
		return 24
	case saddr:
		return 12
	}
	return 16
}

// reg returns the register nft uses for the field that starts idx 32-bit words into a concatenation:
// the 128-bit register when the field starts on one, else the 32-bit one.
func reg(idx uint32) uint32 {
	if idx%4 == 0 {
		return unix.NFT_REG_1 + idx/4
	}
	return unix.NFT_REG32_00 + idx
}

// words is a field's length in 32-bit registers.
func words(n uint32) uint32 { return (n + 3) / 4 }

// udata builds libnftnl user data: type, length, value.
type udata []byte

func (u udata) add(t byte, v []byte) udata {
	u = append(u, t, byte(len(v)))
	return append(u, v...)
}

func (u udata) u32(t byte, v uint32) udata { return u.add(t, binaryutil.NativeEndian.PutUint32(v)) }

func (u udata) str(t byte, s string) udata { return u.add(t, append([]byte(s), 0)) }

func commentData(s string) []byte { return udata(nil).str(udComment, s) }

// encoder builds the messages of one transaction.
type encoder struct {
	fam   *family
	msgs  []netlink.Message
	descs []string
	// setID numbers the sets created in the batch; anon names anonymous sets.
	setID  uint32
	anon   *uint32
	anonOf map[string]uint32 // set IDs of the named sets created in this batch
	err    error
}

func (e *encoder) attrs() *netlink.AttributeEncoder {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	return ae
}

// msg appends one message of type t (an NFT_MSG_*), with flags besides Request.
func (e *encoder) msg(t uint16, flags netlink.HeaderFlags, ae *netlink.AttributeEncoder, desc string) {
	b, err := ae.Encode()
	if err != nil && e.err == nil {
		e.err = fmt.Errorf("encoding %s: %w", desc, err)
	}
	hdr := []byte{e.fam.nfproto(), unix.NFNETLINK_V0, 0, 0}
	e.msgs = append(e.msgs, netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | uint16(t)), Flags: netlink.Request | flags},
		Data:   append(hdr, b...),
	})
	e.descs = append(e.descs, desc)
}

func (e *encoder) table(ae *netlink.AttributeEncoder, attr uint16) { ae.String(attr, TableName) }

// encode adds the messages of every op of t.
func (e *encoder) encode(t *tx) {
	for i := range t.ops {
		o := &t.ops[i]
		var b strings.Builder
		o.text(&b, t.fam)
		desc := strings.TrimSuffix(b.String(), "\n")
		switch {
		case o.table:
			e.tableOp(o, desc)
		case o.chain != nil:
			e.chainOp(o, desc)
		case o.rule != nil:
			e.rule(o.target, o.rule, o.kind == opInsert, desc)
		case o.handle != 0:
			e.deleteRule(o, desc)
		case o.set != nil:
			e.setOp(o, desc)
		case o.counter != "":
			e.counterOp(o, desc)
		default:
			e.elements(o, desc)
		}
	}
}

func (e *encoder) tableOp(o *op, desc string) {
	ae := e.attrs()
	e.table(ae, unix.NFTA_TABLE_NAME)
	if o.kind == opDelete {
		e.msg(unix.NFT_MSG_DELTABLE, 0, ae, desc)
		return
	}
	ae.Uint32(unix.NFTA_TABLE_FLAGS, 0)
	ae.Bytes(nftaTableUserdata, commentData(tableComment))
	e.msg(unix.NFT_MSG_NEWTABLE, netlink.Create, ae, desc)
}

var hooks = map[string]uint32{"prerouting": unix.NF_INET_PRE_ROUTING, "input": unix.NF_INET_LOCAL_IN,
	"forward": unix.NF_INET_FORWARD, "output": unix.NF_INET_LOCAL_OUT, "postrouting": unix.NF_INET_POST_ROUTING}

func (e *encoder) chainOp(o *op, desc string) {
	c := o.chain
	ae := e.attrs()
	switch o.kind {
	case opFlush:
		e.table(ae, unix.NFTA_RULE_TABLE)
		ae.String(unix.NFTA_RULE_CHAIN, c.name)
		e.msg(unix.NFT_MSG_DELRULE, 0, ae, desc)
		return
	case opDelete:
		e.table(ae, unix.NFTA_CHAIN_TABLE)
		ae.String(unix.NFTA_CHAIN_NAME, c.name)
		e.msg(unix.NFT_MSG_DELCHAIN, 0, ae, desc)
		return
	}
	e.table(ae, unix.NFTA_CHAIN_TABLE)
	ae.String(unix.NFTA_CHAIN_NAME, c.name)
	if c.hook != "" {
		ae.String(unix.NFTA_CHAIN_TYPE, c.typ)
		ae.Nested(unix.NFTA_CHAIN_HOOK, func(nae *netlink.AttributeEncoder) error {
			nae.Uint32(unix.NFTA_HOOK_HOOKNUM, hooks[c.hook])
			nae.Uint32(unix.NFTA_HOOK_PRIORITY, uint32(int32(c.prio)))
			return nil
		})
	}
	if c.comment != "" {
		ae.Bytes(nftaChainUserdata, commentData(c.comment))
	}
	e.msg(unix.NFT_MSG_NEWCHAIN, netlink.Create, ae, desc)
}

func (e *encoder) counterOp(o *op, desc string) {
	ae := e.attrs()
	e.table(ae, unix.NFTA_OBJ_TABLE)
	ae.String(unix.NFTA_OBJ_NAME, o.counter)
	ae.Uint32(unix.NFTA_OBJ_TYPE, unix.NFT_OBJECT_COUNTER)
	if o.kind == opDelete {
		e.msg(unix.NFT_MSG_DELOBJ, 0, ae, desc)
		return
	}
	ae.Nested(unix.NFTA_OBJ_DATA, func(nae *netlink.AttributeEncoder) error {
		nae.Uint64(unix.NFTA_COUNTER_BYTES, 0)
		nae.Uint64(unix.NFTA_COUNTER_PACKETS, 0)
		return nil
	})
	e.msg(unix.NFT_MSG_NEWOBJ, netlink.Create, ae, desc)
}

// keyTypeOf returns nft's type number and length of a key layout.
func (e *encoder) keyTypeOf(layout []keyType) (typ, length uint32) {
	for _, k := range layout {
		var t, n uint32
		switch k {
		case keyAddr:
			t, n = e.fam.addrTypeNum(), e.fam.addrLen()
		case keyProto:
			t, n = typeInetProt, 1
		case keyPort:
			t, n = typeInetServ, 2
		}
		typ = typ<<typeBits | t
		length += words(n) * 4
	}
	return typ, length
}

func (e *encoder) setOp(o *op, desc string) {
	s := o.set
	ae := e.attrs()
	switch o.kind {
	case opFlush:
		e.table(ae, unix.NFTA_SET_ELEM_LIST_TABLE)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, s.name)
		e.msg(unix.NFT_MSG_DELSETELEM, 0, ae, desc)
		return
	case opDelete:
		e.table(ae, unix.NFTA_SET_TABLE)
		ae.String(unix.NFTA_SET_NAME, s.name)
		e.msg(unix.NFT_MSG_DELSET, 0, ae, desc)
		return
	}
	var flags uint32
	if s.isMap {
		flags |= unix.NFT_SET_MAP
	}
	if s.dynamic {
		flags |= unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL
	}
	typ, length := e.keyTypeOf(s.key)
	e.setID++
	e.anonOf[s.name] = e.setID
	e.table(ae, unix.NFTA_SET_TABLE)
	ae.String(unix.NFTA_SET_NAME, s.name)
	ae.Uint32(unix.NFTA_SET_FLAGS, flags)
	ae.Uint32(unix.NFTA_SET_KEY_TYPE, typ)
	ae.Uint32(unix.NFTA_SET_KEY_LEN, length)
	if s.isMap {
		ae.Uint32(unix.NFTA_SET_DATA_TYPE, typeVerdict)
		ae.Uint32(unix.NFTA_SET_DATA_LEN, 0)
	}
	ae.Uint32(unix.NFTA_SET_ID, e.setID)
	if s.timeout > 0 {
		ae.Uint64(unix.NFTA_SET_TIMEOUT, uint64(s.timeout.Milliseconds()))
	}
	var ud udata
	if len(s.key) > 1 {
		ud = ud.u32(udSetKeyByteorder, 0)
	} else {
		ud = ud.u32(udSetKeyByteorder, byteorderBig)
	}
	if s.isMap {
		ud = ud.u32(udSetDataByteorder, 0)
	}
	if len(s.key) > 1 {
		ud = ud.add(udSetKeyTypeof, udata(nil).u32(udTypeofExpr, udExprConcat).add(udTypeofData, nil))
	}
	if s.isMap {
		ud = ud.u32(udSetDataInterval, 0)
	}
	if s.comment != "" {
		ud = ud.str(udSetComment, s.comment)
	}
	ae.Bytes(unix.NFTA_SET_USERDATA, ud)
	e.msg(unix.NFT_MSG_NEWSET, netlink.Create, ae, desc)
}

// elemData returns an element's key bytes: each field padded to 32 bits.
func (e *encoder) keyBytes(layout []keyType, k elemKey) []byte {
	var b []byte
	addrs := 0
	for _, t := range layout {
		switch t {
		case keyAddr:
			a := k.addr
			if addrs > 0 {
				a = k.addr2
			}
			addrs++
			b = append(b, a.AsSlice()...)
		case keyProto:
			b = append(b, k.proto, 0, 0, 0)
		case keyPort:
			b = append(b, byte(k.port>>8), byte(k.port), 0, 0)
		}
	}
	return b
}

// maxElemBytes bounds the element list of one message (a netlink attribute's length is 16 bits).
const maxElemBytes = 48 << 10

func (e *encoder) elements(o *op, desc string) {
	layout := o.layout()
	var list []byte
	flush := func() {
		if len(list) == 0 {
			return
		}
		ae := e.attrs()
		e.table(ae, unix.NFTA_SET_ELEM_LIST_TABLE)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, o.target)
		if id, ok := e.anonOf[o.target]; ok {
			ae.Uint32(unix.NFTA_SET_ELEM_LIST_SET_ID, id)
		}
		ae.Bytes(unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_LIST_ELEMENTS, list)
		if o.kind == opDelete {
			e.msg(unix.NFT_MSG_DELSETELEM, 0, ae, desc)
		} else {
			e.msg(unix.NFT_MSG_NEWSETELEM, netlink.Create, ae, desc)
		}
		list = nil
	}
	for _, el := range o.elems {
		var v *verdict
		var ud udata
		if o.kind == opAdd {
			if el.value.verdict.kind != verdictNone {
				v = &el.value.verdict
			}
			if el.value.comment != "" {
				ud = commentData(el.value.comment)
			}
		}
		item := elemItem(e.keyBytes(layout, el.key), nil, v, 0, ud)
		if len(list)+len(item) > maxElemBytes {
			flush()
		}
		list = append(list, item...)
	}
	flush()
}

func verdictCode(k verdictKind) uint32 {
	code := int32(nfAccept)
	switch k {
	case verdictDrop:
		code = nfDrop
	case verdictJump:
		code = nftJump
	case verdictGoto:
		code = nftGoto
	case verdictReturn:
		code = nftReturn
	}
	return uint32(code)
}

// anonSet describes an anonymous set a rule needs: created (constant, with its elements) in the batch just
// before the rule that uses it.
type anonSet struct {
	name            string
	id              uint32
	flags           uint32
	keyType, keyLen uint32
	dataType        uint32
	dataLen         uint32
	ud              udata
	// elems are NFTA_SET_ELEM_LIST_ELEMENTS payloads of at most maxElemBytes each: a Service with
	// thousands of endpoints has a numgen map larger than one netlink attribute holds (64 KiB), so its
	// elements go in several messages (the set is bound, and becomes constant, only with the rule).
	elems [][]byte
	count int
}

func (e *encoder) newAnon(isMap bool) *anonSet {
	*e.anon++
	e.setID++
	s := &anonSet{id: e.setID, flags: unix.NFT_SET_ANONYMOUS | unix.NFT_SET_CONSTANT}
	prefix := "__set"
	if isMap {
		prefix = "__map"
		s.flags |= unix.NFT_SET_MAP
	}
	s.name = prefix + strconv.FormatUint(uint64(*e.anon), 10)
	return s
}

// addElem appends one element: a key, optional data (value bytes or a verdict), flags and user data.
func (s *anonSet) addElem(key, value []byte, v *verdict, flags uint32, ud udata) {
	item := elemItem(key, value, v, flags, ud)
	if n := len(s.elems); n == 0 || len(s.elems[n-1])+len(item) > maxElemBytes {
		s.elems = append(s.elems, nil)
	}
	last := &s.elems[len(s.elems)-1]
	*last = append(*last, item...)
	s.count++
}

// elemItem encodes one set element as an NFTA_LIST_ELEM: its key, optional data (value bytes or a
// verdict), flags and user data.
func elemItem(key, value []byte, v *verdict, flags uint32, ud udata) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Nested(unix.NFTA_SET_ELEM_KEY, func(nae *netlink.AttributeEncoder) error {
		nae.Bytes(unix.NFTA_DATA_VALUE, key)
		return nil
	})
	if value != nil {
		ae.Nested(unix.NFTA_SET_ELEM_DATA, func(nae *netlink.AttributeEncoder) error {
			nae.Bytes(unix.NFTA_DATA_VALUE, value)
			return nil
		})
	}
	if v != nil {
		ae.Nested(unix.NFTA_SET_ELEM_DATA, func(nae *netlink.AttributeEncoder) error {
			nae.Nested(unix.NFTA_DATA_VERDICT, func(vae *netlink.AttributeEncoder) error {
				vae.Uint32(unix.NFTA_VERDICT_CODE, verdictCode(v.kind))
				if v.chain != "" {
					vae.String(unix.NFTA_VERDICT_CHAIN, v.chain)
				}
				return nil
			})
			return nil
		})
	}
	if flags != 0 {
		ae.Uint32(unix.NFTA_SET_ELEM_FLAGS, flags)
	}
	if ud != nil {
		ae.Bytes(unix.NFTA_SET_ELEM_USERDATA, ud)
	}
	b, _ := ae.Encode()
	item := netlink.NewAttributeEncoder()
	item.Bytes(unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, b)
	ib, _ := item.Encode()
	return ib
}

// emitAnon appends the messages creating an anonymous set and its elements.
func (e *encoder) emitAnon(s *anonSet, desc string) {
	ae := e.attrs()
	e.table(ae, unix.NFTA_SET_TABLE)
	ae.String(unix.NFTA_SET_NAME, s.name)
	ae.Uint32(unix.NFTA_SET_FLAGS, s.flags)
	ae.Uint32(unix.NFTA_SET_KEY_TYPE, s.keyType)
	ae.Uint32(unix.NFTA_SET_KEY_LEN, s.keyLen)
	if s.flags&unix.NFT_SET_MAP != 0 {
		ae.Uint32(unix.NFTA_SET_DATA_TYPE, s.dataType)
		ae.Uint32(unix.NFTA_SET_DATA_LEN, s.dataLen)
	}
	ae.Uint32(unix.NFTA_SET_ID, s.id)
	ae.Nested(unix.NFTA_SET_DESC, func(nae *netlink.AttributeEncoder) error {
		nae.Uint32(unix.NFTA_SET_DESC_SIZE, uint32(s.count))
		return nil
	})
	ae.Bytes(unix.NFTA_SET_USERDATA, s.ud)
	e.msg(unix.NFT_MSG_NEWSET, netlink.Create, ae, desc+" (its anonymous set)")
	for _, elems := range s.elems {
		ae = e.attrs()
		e.table(ae, unix.NFTA_SET_ELEM_LIST_TABLE)
		// The set by its batch ID only: given a name, the kernel first looks for it by walking every set
		// of the table (the new one is last), which at 10,000 Services is a third of a cold start's
		// kernel time.
		ae.Uint32(unix.NFTA_SET_ELEM_LIST_SET_ID, s.id)
		ae.Bytes(unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_LIST_ELEMENTS, elems)
		e.msg(unix.NFT_MSG_NEWSETELEM, netlink.Create, ae, desc+" (its anonymous set's elements)")
	}
}

// rule appends a rule: the anonymous sets it needs, then the rule itself, added at the end of its chain or
// (insert) at its head.
func (e *encoder) rule(chain string, r *ruleSpec, insert bool, desc string) {
	var exprs []expr.Any
	for _, t := range r.terms {
		exprs = e.terms(exprs, t, desc)
	}
	list := netlink.NewAttributeEncoder()
	for _, x := range exprs {
		b, err := expr.Marshal(e.fam.nfproto(), x)
		if err != nil && e.err == nil {
			e.err = fmt.Errorf("encoding %s: %w", desc, err)
		}
		list.Bytes(unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, b)
	}
	lb, _ := list.Encode()
	ae := e.attrs()
	e.table(ae, unix.NFTA_RULE_TABLE)
	ae.String(unix.NFTA_RULE_CHAIN, chain)
	ae.Bytes(unix.NLA_F_NESTED|unix.NFTA_RULE_EXPRESSIONS, lb)
	if r.comment != "" {
		ae.Bytes(unix.NFTA_RULE_USERDATA, commentData(r.comment))
	}
	flags := netlink.Create | netlink.Append
	if insert {
		flags = netlink.Create
	}
	e.msg(unix.NFT_MSG_NEWRULE, flags, ae, desc)
}

// deleteRule deletes one rule of a chain by its handle.
func (e *encoder) deleteRule(o *op, desc string) {
	ae := e.attrs()
	e.table(ae, unix.NFTA_RULE_TABLE)
	ae.String(unix.NFTA_RULE_CHAIN, o.target)
	ae.Uint64(unix.NFTA_RULE_HANDLE, o.handle)
	e.msg(unix.NFT_MSG_DELRULE, 0, ae, desc)
}

func le32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }

// payloadAddr loads the source or destination address into a register.
func (e *encoder) payloadAddr(saddr bool, offsetBytes, length, dreg uint32) *expr.Payload {
	return &expr.Payload{Base: expr.PayloadBaseNetworkHeader, Offset: e.fam.addrOffset(saddr) + offsetBytes, Len: length, DestRegister: dreg}
}

func l4protoExpr(dreg uint32) *expr.Meta { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: dreg} }

func dportExpr(dreg uint32) *expr.Payload {
	return &expr.Payload{Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2, DestRegister: dreg}
}

func cmpOp(neg bool) expr.CmpOp {
	if neg {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

// terms appends the expressions of one term, as nft compiles it.
func (e *encoder) terms(x []expr.Any, t term, desc string) []expr.Any {
	f := e.fam
	switch t.kind {
	// Matches.
	case tCTStateNew:
		return anyBitSet(x, &expr.Ct{Key: expr.CtKeySTATE, Register: 1}, 8) // NF_CT_STATE_BIT(IP_CT_NEW)
	case tCTStatusDNAT:
		return anyBitSet(x, &expr.Ct{Key: expr.CtKeySTATUS, Register: 1}, 0x20) // IPS_DST_NAT
	case tMarkNonZero:
		return anyBitSet(x, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1}, t.mark)
	case tAddr:
		return e.prefixMatch(x, t.saddr, t.neg, t.prefix)
	case tAddrSet:
		return e.addrSetMatch(x, t, desc)
	case tAddrInSet:
		return append(x, e.payloadAddr(t.saddr, 0, f.addrLen(), 1), e.lookup(t.name))
	case tHairpin:
		n := words(f.addrLen())
		return append(x, e.payloadAddr(true, 0, f.addrLen(), reg(0)), e.payloadAddr(false, 0, f.addrLen(), reg(n)),
			l4protoExpr(reg(2*n)), dportExpr(reg(2*n+1)), e.lookup(t.name))
	case tFibLocal:
		return append(x, &expr.Fib{Register: 1, FlagSADDR: t.saddr, FlagDADDR: !t.saddr, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: le32(unix.RTN_LOCAL)})
	case tIifname:
		return iifnameMatch(x, t)
	case tL4Proto:
		return append(x, l4protoExpr(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{t.proto}})

	// Statements.
	case tVmapAddrProtoPort:
		n := words(f.addrLen())
		return append(x, e.payloadAddr(false, 0, f.addrLen(), reg(0)), l4protoExpr(reg(n)), dportExpr(reg(n+1)), e.vmapLookup(t.name))
	case tVmapProtoPort:
		return append(x, l4protoExpr(reg(0)), dportExpr(reg(1)), e.vmapLookup(t.name))
	case tVerdict:
		return append(x, &expr.Verdict{Kind: verdictExprKind(t.verdict), Chain: t.name})
	case tReject:
		return e.reject(x)
	case tMarkOr:
		return markSet(x, ^t.mark, t.mark)
	case tMarkXor:
		return markSet(x, 0xffffffff, t.mark)
	case tMasquerade:
		return append(x, &expr.Masq{FullyRandom: true})
	case tDNAT:
		return e.dnat(x, t.eps[0])
	case tDNATMap:
		return e.dnatMap(x, t.eps, desc)
	case tNumgenVmap:
		return e.numgenVmap(x, t.chains, desc)
	case tUpdateSaddr:
		return append(x, e.payloadAddr(true, 0, f.addrLen(), 1),
			&expr.Dynset{SrcRegKey: 1, SetName: t.name, SetID: e.anonOf[t.name], Operation: unix.NFT_DYNSET_OP_UPDATE})
	case tCounter:
		return append(x, &expr.Objref{Type: unix.NFT_OBJECT_COUNTER, Name: t.name})
	}
	if e.err == nil {
		e.err = fmt.Errorf("encoding %s: unknown term kind %d", desc, t.kind)
	}
	return x
}

// lookup matches the key in register 1 against set name: one of the table's named sets, by the ID it has
// in the batch when the batch creates it.
func (e *encoder) lookup(name string) *expr.Lookup {
	return &expr.Lookup{SourceRegister: 1, SetName: name, SetID: e.anonOf[name]}
}

// vmapLookup takes the verdict of the key in register 1 from verdict map name.
func (e *encoder) vmapLookup(name string) *expr.Lookup {
	l := e.lookup(name)
	l.DestRegister, l.IsDestRegSet = unix.NFT_REG_VERDICT, true
	return l
}

// anyBitSet loads a 32-bit key (a conntrack key or the mark) into register 1 and matches when any bit of
// mask is set in it.
func anyBitSet(x []expr.Any, load expr.Any, mask uint32) []expr.Any {
	return append(x, load,
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(mask), Xor: le32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: le32(0)})
}

// markSet sets the packet mark to (mark & mask) ^ xor.
func markSet(x []expr.Any, mask, xor uint32) []expr.Any {
	return append(x, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(mask), Xor: le32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
}

// addrSetMatch matches an address against the prefixes of term t, an anonymous interval set created
// before the rule.
func (e *encoder) addrSetMatch(x []expr.Any, t term, desc string) []expr.Any {
	f := e.fam
	s := e.newAnon(false)
	s.flags |= unix.NFT_SET_INTERVAL
	s.keyType, s.keyLen = f.addrTypeNum(), f.addrLen()
	proto, field := uint32(udProtoIP), uint32(12) // ip daddr
	switch {
	case f == familyIPv6 && t.saddr:
		proto, field = udProtoIP6, 8
	case f == familyIPv6:
		proto, field = udProtoIP6, 9
	case t.saddr:
		field = 11
	}
	s.ud = udata(nil).u32(udSetKeyByteorder, byteorderBig).u32(udSetMerge, 1).
		add(udSetKeyTypeof, udata(nil).u32(udTypeofExpr, udExprPayload).
			add(udTypeofData, udata(nil).u32(0, proto).u32(1, field)))
	intervals(s, t.prefixs)
	e.emitAnon(s, desc)
	return append(x, e.payloadAddr(t.saddr, 0, f.addrLen(), 1),
		&expr.Lookup{SourceRegister: 1, SetName: s.name, SetID: s.id, Invert: t.neg})
}

// iifnameMatch compares the input interface's name with t's: the whole name, or (a prefix) its first
// bytes.
func iifnameMatch(x []expr.Any, t term) []expr.Any {
	data := []byte(t.name)
	if !t.ifPref {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, t.name)
	}
	return append(x, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: cmpOp(t.neg), Register: 1, Data: data})
}

// verdictExprKind is the expression kind of a verdict (accept for none).
func verdictExprKind(k verdictKind) expr.VerdictKind {
	switch k {
	case verdictDrop:
		return expr.VerdictDrop
	case verdictJump:
		return expr.VerdictJump
	case verdictGoto:
		return expr.VerdictGoto
	case verdictReturn:
		return expr.VerdictReturn
	}
	return expr.VerdictAccept
}

// reject rejects with the family's ICMP port unreachable.
func (e *encoder) reject(x []expr.Any) []expr.Any {
	code := uint8(3) // ICMP port unreachable
	if e.fam == familyIPv6 {
		code = 4 // ICMPv6 port unreachable
	}
	return append(x, &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code})
}

// dnat DNATs to one endpoint.
func (e *encoder) dnat(x []expr.Any, ep netip.AddrPort) []expr.Any {
	return append(x, &expr.Immediate{Register: 1, Data: ep.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: []byte{byte(ep.Port() >> 8), byte(ep.Port())}},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(e.fam.nfproto()), RegAddrMin: 1, RegProtoMin: 2, Specified: true})
}

// dnatMap DNATs to an endpoint picked at random: a random number looked up in an anonymous map of
// endpoints, created before the rule.
func (e *encoder) dnatMap(x []expr.Any, eps []netip.AddrPort, desc string) []expr.Any {
	f := e.fam
	s := e.newAnon(true)
	s.keyType, s.keyLen = typeInteger, 4
	s.dataType = f.addrTypeNum()<<typeBits | typeInetServ
	s.dataLen = words(f.addrLen())*4 + 4
	s.ud = udata(nil).u32(udSetKeyByteorder, byteorderHost).u32(udSetDataByteorder, 0).u32(udSetDataInterval, 0)
	for i, ep := range eps {
		v := append(ep.Addr().AsSlice(), byte(ep.Port()>>8), byte(ep.Port()), 0, 0)
		s.addElem(le32(uint32(i)), v, nil, 0, nil)
	}
	e.emitAnon(s, desc)
	return append(x, &expr.Numgen{Register: 1, Type: unix.NFT_NG_RANDOM, Modulus: uint32(len(eps))},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: s.name, SetID: s.id},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f.nfproto()), RegAddrMin: 1, RegProtoMin: reg(words(f.addrLen()))})
}

// numgenVmap goes to a chain picked at random: a random number looked up in an anonymous verdict map,
// created before the rule.
func (e *encoder) numgenVmap(x []expr.Any, chains []string, desc string) []expr.Any {
	s := e.newAnon(true)
	s.keyType, s.keyLen = typeInteger, 4
	s.dataType, s.dataLen = typeVerdict, 0
	s.ud = udata(nil).u32(udSetKeyByteorder, byteorderHost).u32(udSetDataByteorder, 0).
		add(udSetDataTypeof, udata(nil).u32(udTypeofExpr, udExprVerdict).add(udTypeofData, nil)).
		u32(udSetDataInterval, 0)
	for i, c := range chains {
		s.addElem(le32(uint32(i)), nil, &verdict{kind: verdictGoto, chain: c}, 0, nil)
	}
	e.emitAnon(s, desc)
	return append(x, &expr.Numgen{Register: 1, Type: unix.NFT_NG_RANDOM, Modulus: uint32(len(chains))},
		&expr.Lookup{SourceRegister: 1, DestRegister: unix.NFT_REG_VERDICT, IsDestRegSet: true, SetName: s.name, SetID: s.id})
}

// prefixMatch compares an address with a prefix as nft does: a byte-aligned prefix loads and compares
// only its bytes; any other loads the whole address and masks it.
func (e *encoder) prefixMatch(x []expr.Any, saddr, neg bool, p netip.Prefix) []expr.Any {
	p = p.Masked()
	addr := p.Addr().AsSlice()
	if p.Bits()%8 == 0 {
		n := uint32(p.Bits() / 8)
		return append(x, e.payloadAddr(saddr, 0, n, 1), &expr.Cmp{Op: cmpOp(neg), Register: 1, Data: addr[:n]})
	}
	mask := make([]byte, len(addr))
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	n := uint32(len(addr))
	return append(x, e.payloadAddr(saddr, 0, n, 1),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: cmpOp(neg), Register: 1, Data: addr})
}

// intervals adds to s the elements of an interval set holding prefixes, as nft encodes them: overlapping
// and adjacent ranges merged; each range a start element and an end element (the first address after
// it, flagged as an end); an end element at address 0 first when the first range does not start there;
// and no end after a range that reaches the last address, whose start is flagged open instead.
func intervals(s *anonSet, ps []netip.Prefix) {
	type rng struct{ lo, hi netip.Addr } // inclusive
	var rs []rng
	for _, p := range ps {
		p = p.Masked()
		rs = append(rs, rng{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(rs, func(a, b rng) int { return a.lo.Compare(b.lo) })
	var merged []rng
	for _, r := range rs {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			if next := last.hi.Next(); !next.IsValid() || r.lo.Compare(next) <= 0 {
				if r.hi.Compare(last.hi) > 0 {
					last.hi = r.hi
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	if len(merged) > 0 && !merged[0].lo.IsUnspecified() {
		zero := netip.IPv4Unspecified()
		if merged[0].lo.Is6() {
			zero = netip.IPv6Unspecified()
		}
		s.addElem(zero.AsSlice(), nil, nil, unix.NFT_SET_ELEM_INTERVAL_END, nil)
	}
	for _, r := range merged {
		end := r.hi.Next()
		if !end.IsValid() {
			s.addElem(r.lo.AsSlice(), nil, nil, 0, udata(nil).u32(udElemFlags, 1)) // open interval
			continue
		}
		s.addElem(r.lo.AsSlice(), nil, nil, 0, nil)
		s.addElem(end.AsSlice(), nil, nil, unix.NFT_SET_ELEM_INTERVAL_END, nil)
	}
}

// lastAddr is the last address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
