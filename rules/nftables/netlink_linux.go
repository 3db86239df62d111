package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"runtime"
	"strconv"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netlinkKernel writes transactions as nf_tables netlink batches and reads the table back over netlink.
//
// Why not `nft -f`, as knftables runs it: nft first lists the table (every chain and every set, with the
// anonymous set of each Service) to check the commands, so each write costs time in proportion to the
// table. Measured here at 10,000 Services of three endpoints: adding one Service through `nft -f` takes
// 150-220 ms, of which the kernel work is a few milliseconds; the netlink batch takes about that much.
type netlinkKernel struct {
	fam  *family
	sock *batchSocket
	// reader lists the table (google/nftables); conn options carry the network namespace.
	reader *gnft.Conn
	// anon is the number of the last anonymous set named by the encoder.
	anon uint32
}

var _ kernel = (*netlinkKernel)(nil)

// anonBase is where the encoder's anonymous set numbers start: above those nft gives out (it takes the
// lowest free number, and a table taken over from nft holds small ones).
const anonBase = 1 << 20

// newNetlinkKernel opens the netlink sockets of one family's table in the network namespace ns (the
// current one when ns is netns.None()).
func newNetlinkKernel(f *family, ns netns.NsHandle) (*netlinkKernel, error) {
	sock, err := newBatchSocket(ns)
	if err != nil {
		return nil, err
	}
	opts := []gnft.ConnOption{gnft.AsLasting()}
	if ns.IsOpen() {
		opts = append(opts, gnft.WithNetNSFd(int(ns)))
	}
	reader, err := gnft.New(opts...)
	if err != nil {
		sock.close()
		return nil, fmt.Errorf("opening an nftables netlink socket: %w", err)
	}
	return &netlinkKernel{fam: f, sock: sock, reader: reader, anon: anonBase}, nil
}

// Close releases the sockets.
func (k *netlinkKernel) Close() {
	k.sock.close()
	_ = k.reader.CloseLasting()
}

// Run sends t as one batch: the kernel applies all of it or none.
func (k *netlinkKernel) Run(_ context.Context, t *tx) error {
	e := &encoder{fam: k.fam, anon: &k.anon, anonOf: map[string]uint32{}}
	e.encode(t)
	if e.err != nil {
		return e.err
	}
	return k.sock.batch(e.msgs, e.descs)
}

// ruleDumpChains is how many chains RuleHandles lists one by one; for more it lists the whole table once.
const ruleDumpChains = 32

// RuleHandles lists the handles of the rules of chains: each chain's rules when there are few, else every
// rule of the table (one dump, the rules' expressions skipped).
func (k *netlinkKernel) RuleHandles(_ context.Context, chains []string) (map[string][]uint64, error) {
	if len(chains) > ruleDumpChains {
		all, err := k.sock.ruleHandles(k.fam.nfproto(), "")
		if err != nil {
			return nil, fmt.Errorf("listing the rules of the table: %w", err)
		}
		out := map[string][]uint64{}
		for _, c := range chains {
			if hs := all[c]; len(hs) > 0 {
				out[c] = hs
			}
		}
		return out, nil
	}
	out := map[string][]uint64{}
	for _, c := range chains {
		hs, err := k.sock.ruleHandles(k.fam.nfproto(), c)
		if err != nil {
			return nil, fmt.Errorf("listing the rules of %s: %w", c, err)
		}
		if len(hs[c]) > 0 {
			out[c] = hs[c]
		}
	}
	return out, nil
}

func (k *netlinkKernel) table() *gnft.Table {
	tf := gnft.TableFamilyIPv4
	if k.fam == familyIPv6 {
		tf = gnft.TableFamilyIPv6
	}
	return &gnft.Table{Name: TableName, Family: tf}
}

// Read lists the table: nil when it does not exist.
func (k *netlinkKernel) Read(context.Context) (*kernelState, error) {
	t := k.table()
	if _, err := k.reader.ListTableOfFamily(TableName, t.Family); err != nil {
		if errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file") || strings.Contains(err.Error(), "expected table count") {
			return nil, nil
		}
		return nil, fmt.Errorf("looking up the table: %w", err)
	}
	ks := newKernelState()
	chains, err := k.reader.ListChainsOfTableFamily(t.Family)
	if err != nil {
		return nil, fmt.Errorf("listing chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name != TableName {
			continue
		}
		ks.chains[c.Name] = true
		if c.Hooknum != nil && c.Priority != nil {
			for name, num := range hooks {
				if num == uint32(*c.Hooknum) {
					ks.bases[c.Name] = chainSpec{name: c.Name, typ: string(c.Type), hook: name, prio: int(*c.Priority)}
				}
			}
		}
	}
	sets, err := k.reader.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("listing sets: %w", err)
	}
	for _, s := range sets {
		if s.Anonymous {
			for _, p := range []string{"__set", "__map"} {
				if n, err := strconv.ParseUint(strings.TrimPrefix(s.Name, p), 10, 32); err == nil && strings.HasPrefix(s.Name, p) && uint32(n) > k.anon {
					k.anon = uint32(n)
				}
			}
			continue
		}
		ks.sets[s.Name] = true
		if isAffinitySet(s.Name) {
			continue
		}
		elems, err := k.reader.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("listing the elements of %s: %w", s.Name, err)
		}
		layout := layoutOf(s.Name)
		for _, el := range elems {
			ref, ok := decodeKey(k.fam, s.Name, layout, el.Key)
			if !ok {
				return nil, fmt.Errorf("an element of %s has a key of %d bytes", s.Name, len(el.Key))
			}
			v := elemValue{comment: el.Comment}
			if len(el.Val) > 0 {
				// google/nftables hands a verdict over as the attributes inside NFTA_DATA_VERDICT.
				if v.verdict, ok = decodeVerdict(el.Val); !ok {
					return nil, fmt.Errorf("an element of %s has data that is not a verdict", s.Name)
				}
			}
			ks.elems[ref] = v
		}
	}
	return ks, nil
}

// decodeKey reads an element key written by keyBytes.
func decodeKey(f *family, set string, layout []keyType, b []byte) (elemRef, bool) {
	ref := elemRef{set: set}
	addrs := 0
	for _, t := range layout {
		switch t {
		case keyAddr:
			n := int(f.addrLen())
			if len(b) < n {
				return ref, false
			}
			a, _ := netip.AddrFromSlice(b[:n])
			if addrs == 0 {
				ref.key.addr = a
			} else {
				ref.key.addr2 = a
			}
			addrs++
			b = b[n:]
		case keyProto:
			if len(b) < 4 {
				return ref, false
			}
			ref.key.proto = b[0]
			b = b[4:]
		case keyPort:
			if len(b) < 4 {
				return ref, false
			}
			ref.key.port = binary.BigEndian.Uint16(b)
			b = b[4:]
		}
	}
	return ref, len(b) == 0
}

// decodeVerdict reads the attributes of an NFTA_DATA_VERDICT: the code and the chain.
func decodeVerdict(b []byte) (verdict, bool) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return verdict{}, false
	}
	ad.ByteOrder = binary.BigEndian
	var v verdict
	code, ok := int32(0), false
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			code, ok = int32(ad.Uint32()), true
		case unix.NFTA_VERDICT_CHAIN:
			v.chain = ad.String()
		}
	}
	if ad.Err() != nil || !ok {
		return verdict{}, false
	}
	switch code {
	case nfAccept:
		v.kind = verdictAccept
	case nfDrop:
		v.kind = verdictDrop
	case nftJump:
		v.kind = verdictJump
	case nftGoto:
		v.kind = verdictGoto
	case nftReturn:
		v.kind = verdictReturn
	default:
		return verdict{}, false
	}
	return v, true
}

// batchSocket is a NETLINK_NETFILTER socket that sends nf_tables batches and reads their errors.
type batchSocket struct {
	fd     int
	seq    uint32
	sndbuf int
}

func newBatchSocket(ns netns.NsHandle) (*batchSocket, error) {
	open := func() (int, error) {
		return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	}
	var fd int
	var err error
	if ns.IsOpen() {
		fd, err = inNamespace(ns, open)
	} else {
		fd, err = open()
	}
	if err != nil {
		return nil, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	s := &batchSocket{fd: fd}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		s.close()
		return nil, fmt.Errorf("binding the netfilter netlink socket: %w", err)
	}
	// Errors carry the kernel's message but not a copy of the request; the receive buffer holds the
	// errors of a failed batch, one per command in the worst case.
	for _, o := range []struct{ level, opt, v int }{
		{unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1},
		{unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1},
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16 << 20},
	} {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			s.close()
			return nil, fmt.Errorf("setting netlink socket option %d: %w", o.opt, err)
		}
	}
	return s, nil
}

// inNamespace runs open with the calling thread in network namespace ns.
func inNamespace(ns netns.NsHandle, open func() (int, error)) (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := netns.Get()
	if err != nil {
		return -1, err
	}
	defer cur.Close()
	if err := netns.Set(ns); err != nil {
		return -1, err
	}
	fd, openErr := open()
	if err := netns.Set(cur); err != nil {
		panic(fmt.Sprintf("cannot return to the original network namespace: %v", err))
	}
	return fd, openErr
}

func (s *batchSocket) close() {
	if s.fd >= 0 {
		_ = unix.Close(s.fd)
		s.fd = -1
	}
}

// batch sends msgs between a batch begin and end, asking for an acknowledgement of the last one, and
// returns the kernel's errors, each naming its command (descs[i] describes msgs[i]).
func (s *batchSocket) batch(msgs []netlink.Message, descs []string) error {
	if len(msgs) == 0 {
		return nil
	}
	fb, err := s.frame(msgs, descs)
	if err != nil {
		return err
	}
	if err := s.send(fb.buf, len(msgs)); err != nil {
		return err
	}
	// The kernel processes the batch within sendto: every reply is queued by now.
	errs, acked, err := s.replies(fb)
	if err != nil {
		return err
	}
	if len(errs) > 0 {
		if len(errs) > 3 {
			errs = append(errs[:3], fmt.Errorf("and %d more errors", len(errs)-3))
		}
		return errors.Join(errs...)
	}
	if !acked {
		return fmt.Errorf("the kernel did not acknowledge the batch of %d commands", len(msgs))
	}
	return nil
}

// framedBatch is a batch ready to send: its bytes, what each sequence number stands for (the batch, then
// each command), and the sequence number of the last command, whose acknowledgement ends the replies.
type framedBatch struct {
	buf     []byte
	bySeq   map[uint32]string
	lastSeq uint32
}

// frame puts msgs between a batch begin and end, asks for an acknowledgement of the last one, numbers
// them all and encodes them.
func (s *batchSocket) frame(msgs []netlink.Message, descs []string) (*framedBatch, error) {
	begin := netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN), Flags: netlink.Request},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}}
	end := begin
	end.Header.Type = netlink.HeaderType(unix.NFNL_MSG_BATCH_END)
	all := make([]netlink.Message, 0, len(msgs)+2)
	all = append(all, begin)
	all = append(all, msgs...)
	all = append(all, end)
	all[len(all)-2].Header.Flags |= netlink.Acknowledge
	fb := &framedBatch{bySeq: map[uint32]string{}}
	for i := range all {
		s.seq++
		all[i].Header.Sequence = s.seq
		all[i].Header.Length = uint32((unix.NLMSG_HDRLEN + len(all[i].Data) + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1))
		b, err := all[i].MarshalBinary()
		if err != nil {
			return nil, fmt.Errorf("encoding a netlink message: %w", err)
		}
		fb.buf = append(fb.buf, b...)
		switch {
		case i == 0:
			fb.bySeq[s.seq] = "the batch"
		case i <= len(descs):
			fb.bySeq[s.seq] = descs[i-1]
		}
	}
	fb.lastSeq = all[len(all)-2].Header.Sequence
	return fb, nil
}

// send writes a framed batch of n commands, first growing the send buffer to hold it.
func (s *batchSocket) send(buf []byte, n int) error {
	if len(buf)+(1<<16) > s.sndbuf {
		s.sndbuf = len(buf) + 1<<20
		if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, s.sndbuf); err != nil {
			return fmt.Errorf("growing the netlink send buffer to %d bytes: %w", s.sndbuf, err)
		}
	}
	if err := unix.Sendto(s.fd, buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending %d nftables commands (%d bytes): %w", n, len(buf), err)
	}
	return nil
}

// replies reads the replies queued for a sent batch until the acknowledgement of its last command (acked),
// or until none is left: the errors, each naming its command. err is set when the replies cannot be read.
func (s *batchSocket) replies(fb *framedBatch) (errs []error, acked bool, err error) {
	rbuf := make([]byte, 1<<16)
	for !acked {
		n, _, err := unix.Recvfrom(s.fd, rbuf, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN || err == unix.EWOULDBLOCK {
			break
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("reading the kernel's reply: %w", err)
		}
		for m, err := range messages(rbuf[:n]) {
			if err != nil {
				return nil, false, fmt.Errorf("reading the kernel's reply: %w", err)
			}
			seq, code, ok := ackOf(m)
			if !ok {
				continue
			}
			if code != 0 {
				errs = append(errs, fb.commandError(m, seq, code))
			}
			acked = acked || seq == fb.lastSeq
		}
	}
	return errs, acked, nil
}

// messages yields the netlink messages of a received buffer, in order; a malformed one ends them with an
// error.
func messages(buf []byte) iter.Seq2[netlink.Message, error] {
	return func(yield func(netlink.Message, error) bool) {
		for b := buf; len(b) >= unix.NLMSG_HDRLEN; {
			var m netlink.Message
			l := int(binary.NativeEndian.Uint32(b))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				yield(m, fmt.Errorf("a message of %d bytes in %d", l, len(b)))
				return
			}
			if err := m.UnmarshalBinary(b[:l]); err != nil {
				yield(m, err)
				return
			}
			b = b[min(len(b), (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
			if !yield(m, nil) {
				return
			}
		}
	}
}

// ackOf reads an acknowledgement (code 0) or an error: its code and the sequence number of the message it
// answers. ok is false for any other message.
func ackOf(m netlink.Message) (seq uint32, code int32, ok bool) {
	if m.Header.Type != netlink.Error || len(m.Data) < 4+unix.NLMSG_HDRLEN {
		return 0, 0, false
	}
	return binary.NativeEndian.Uint32(m.Data[4+8:]), int32(binary.NativeEndian.Uint32(m.Data)), true
}

// commandError is the error the kernel's reply m reports for the message numbered seq: named by its
// command, with the kernel's message when there is one.
func (fb *framedBatch) commandError(m netlink.Message, seq uint32, code int32) error {
	what := fb.bySeq[seq]
	if what == "" {
		what = "command " + strconv.FormatUint(uint64(seq), 10)
	}
	if msg := extAckMessage(m); msg != "" {
		return fmt.Errorf("%s: %s: %w", what, msg, unix.Errno(-code))
	}
	return fmt.Errorf("%s: %w", what, unix.Errno(-code))
}

// ruleHandles dumps the rules of one chain of the table (every chain when chain is empty) and returns
// their handles by chain, in each chain's order. A missing table or chain has no rules.
func (s *batchSocket) ruleHandles(nfproto byte, chain string) (map[string][]uint64, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_RULE_TABLE, TableName)
	if chain != "" {
		ae.String(unix.NFTA_RULE_CHAIN, chain)
	}
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	s.seq++
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump, Sequence: s.seq},
		Data: append([]byte{nfproto, unix.NFNETLINK_V0, 0, 0}, attrs...),
	}
	req.Header.Length = uint32(unix.NLMSG_HDRLEN + len(req.Data))
	b, err := req.MarshalBinary()
	if err != nil {
		return nil, err
	}
	if err := unix.Sendto(s.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("asking for the rules: %w", err)
	}
	out := map[string][]uint64{}
	rbuf := make([]byte, 1<<18)
	for {
		n, _, err := unix.Recvfrom(s.fd, rbuf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the rules: %w", err)
		}
		for m, err := range messages(rbuf[:n]) {
			if err != nil {
				return nil, fmt.Errorf("reading the rules: %w", err)
			}
			if m.Header.Sequence != s.seq {
				continue
			}
			if m.Header.Flags&netlink.DumpInterrupted != 0 {
				return nil, errors.New("the rules changed while they were listed")
			}
			switch m.Header.Type {
			case netlink.Done:
				return out, nil
			case netlink.Error:
				if len(m.Data) < 4 {
					return nil, errors.New("reading the rules: a short error message")
				}
				code := int32(binary.NativeEndian.Uint32(m.Data))
				switch {
				case code == 0:
					continue
				case unix.Errno(-code) == unix.ENOENT:
					return out, nil
				}
				return nil, fmt.Errorf("listing the rules: %w", unix.Errno(-code))
			}
			if len(m.Data) < 4 {
				continue
			}
			ad, err := netlink.NewAttributeDecoder(m.Data[4:])
			if err != nil {
				return nil, fmt.Errorf("reading a rule: %w", err)
			}
			ad.ByteOrder = binary.BigEndian
			var c string
			var h uint64
			for ad.Next() {
				switch ad.Type() {
				case unix.NFTA_RULE_CHAIN:
					c = ad.String()
				case unix.NFTA_RULE_HANDLE:
					h = ad.Uint64()
				}
			}
			if err := ad.Err(); err != nil {
				return nil, fmt.Errorf("reading a rule: %w", err)
			}
			out[c] = append(out[c], h)
		}
	}
}

// extAckMessage returns the kernel's error message from an extended acknowledgement, if any.
func extAckMessage(m netlink.Message) string {
	if m.Header.Flags&0x200 == 0 { // NLM_F_ACK_TLVS
		return ""
	}
	off := 4 + unix.NLMSG_HDRLEN   // errno and the capped request header
	if m.Header.Flags&0x100 == 0 { // not NLM_F_CAPPED: the whole request follows
		if len(m.Data) < off {
			return ""
		}
		off = 4 + int(binary.NativeEndian.Uint32(m.Data[4:]))
	}
	if off > len(m.Data) {
		return ""
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[off:])
	if err != nil {
		return ""
	}
	for ad.Next() {
		if ad.Type() == 1 { // NLMSGERR_ATTR_MSG
			return ad.String()
		}
	}
	return ""
}
