package nftables

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestBatchFrame checks how a batch is framed: begin, the commands, end, numbered in order, with an
// acknowledgement asked of the last command only, and each number named by what it stands for.
func TestBatchFrame(t *testing.T) {
	s := &batchSocket{fd: -1, seq: 10}
	cmds := []netlink.Message{
		{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE), Flags: netlink.Request}, Data: []byte{2, 0, 0, 0, 1}},
		{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWCHAIN), Flags: netlink.Request}, Data: []byte{2, 0, 0, 0}},
	}
	fb, err := s.frame(cmds, []string{"add table", "add chain"})
	if err != nil {
		t.Fatal(err)
	}
	type framed struct {
		Type   netlink.HeaderType
		Flags  netlink.HeaderFlags
		Seq    uint32
		Length uint32
	}
	var got []framed
	for m, err := range messages(fb.buf) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, framed{m.Header.Type, m.Header.Flags, m.Header.Sequence, m.Header.Length})
	}
	want := []framed{
		{netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN), netlink.Request, 11, 20},
		{cmds[0].Header.Type, netlink.Request, 12, 24},
		{cmds[1].Header.Type, netlink.Request | netlink.Acknowledge, 13, 20},
		{netlink.HeaderType(unix.NFNL_MSG_BATCH_END), netlink.Request, 14, 20},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("framed messages (-want +got):\n%s", diff)
	}
	if fb.lastSeq != 13 || s.seq != 14 {
		t.Errorf("lastSeq %d, socket seq %d; want 13, 14", fb.lastSeq, s.seq)
	}
	if diff := cmp.Diff(map[uint32]string{11: "the batch", 12: "add table", 13: "add chain"}, fb.bySeq); diff != "" {
		t.Errorf("bySeq (-want +got):\n%s", diff)
	}
	if cmds[1].Header.Flags != netlink.Request {
		t.Error("frame changed the caller's messages")
	}
}

// ackReply is the kernel's reply to the message numbered seq: an acknowledgement (code 0) or an error,
// capped, with an extended acknowledgement message when msg is set.
func ackReply(t *testing.T, seq uint32, code int32, msg string) []byte {
	t.Helper()
	data := binary.NativeEndian.AppendUint32(nil, uint32(code))
	req := make([]byte, unix.NLMSG_HDRLEN)
	binary.NativeEndian.PutUint32(req[8:], seq)
	data = append(data, req...)
	flags := netlink.HeaderFlags(0x100) // NLM_F_CAPPED
	if msg != "" {
		flags |= 0x200 // NLM_F_ACK_TLVS
		ae := netlink.NewAttributeEncoder()
		ae.String(1, msg) // NLMSGERR_ATTR_MSG
		b, err := ae.Encode()
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, b...)
	}
	m := netlink.Message{Header: netlink.Header{Type: netlink.Error, Flags: flags, Sequence: seq,
		Length: uint32((unix.NLMSG_HDRLEN + len(data) + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1))}, Data: data}
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBatchReplies feeds replies to a batch through a socket pair and checks what replies makes of them:
// errors named by their command (with the kernel's message), the acknowledgement of the last command,
// and malformed replies.
func TestBatchReplies(t *testing.T) {
	fb := &framedBatch{bySeq: map[uint32]string{11: "the batch", 12: "add table", 13: "add chain"}, lastSeq: 13}
	for _, tc := range []struct {
		name    string
		replies [][]byte
		errs    []string
		acked   bool
		err     string
	}{
		{name: "nothing queued"},
		{name: "acknowledged", replies: [][]byte{ackReply(t, 13, 0, "")}, acked: true},
		{name: "errors, then the acknowledgement", replies: [][]byte{
			append(ackReply(t, 12, -int32(unix.ENOENT), "no such table"), ackReply(t, 99, -int32(unix.EINVAL), "")...),
			ackReply(t, 13, -int32(unix.EEXIST), ""),
			ackReply(t, 12, -int32(unix.ENOENT), "read after the last command's reply"),
		}, errs: []string{
			"add table: no such table: no such file or directory",
			"command 99: invalid argument",
			"add chain: file exists",
		}, acked: true},
		{name: "an earlier command acknowledged, and bytes short of a message", replies: [][]byte{append(ackReply(t, 12, 0, ""), make([]byte, unix.NLMSG_HDRLEN-1)...)}},
		{name: "malformed", replies: [][]byte{{4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
			err: "reading the kernel's reply: a message of 4 bytes in 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			s := &batchSocket{fd: fds[0]}
			defer s.close()
			defer unix.Close(fds[1])
			for _, r := range tc.replies {
				if _, err := unix.Write(fds[1], r); err != nil {
					t.Fatal(err)
				}
			}
			errs, acked, err := s.replies(fb)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range errs {
				got = append(got, e.Error())
			}
			if diff := cmp.Diff(tc.errs, got); diff != "" || acked != tc.acked {
				t.Errorf("acked %v, want %v; errors (-want +got):\n%s", acked, tc.acked, diff)
			}
		})
	}
}
