package nfacct

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nlenc"
	"github.com/mdlayher/netlink/nltest"
)

// fakeKernel simulates the kernel's nfacct subsystem of one namespace: counters by name, created by
// NFNL_MSG_ACCT_NEW (EBUSY when one exists, as without NLM_F_EXCL or NLM_F_REPLACE), described by
// NFNL_MSG_ACCT_GET (ENOENT when none). It refuses what the kernel would refuse and fails the test on
// messages this package should never send.
type fakeKernel struct {
	t        *testing.T
	counters map[string]*Counter
	// missing makes every request fail as on a kernel without the subsystem.
	missing bool
	// createdBehind, when set, is created by "someone else" between a GET and the NEW that follows it.
	createdBehind string
}

func newFakeKernel(t *testing.T) *fakeKernel {
	return &fakeKernel{t: t, counters: map[string]*Counter{}}
}

func (k *fakeKernel) client() *Client { return newClient(nltest.Dial(k.handle)) }

func (k *fakeKernel) handle(reqs []netlink.Message) ([]netlink.Message, error) {
	if len(reqs) != 1 {
		k.t.Fatalf("%d messages in one request, want 1", len(reqs))
	}
	req := reqs[0]
	if k.missing {
		return kernelError(int(syscall.EOPNOTSUPP), reqs)
	}
	if req.Header.Type>>8 != subsysAcct {
		k.t.Fatalf("message type %#x is not of the accounting subsystem", req.Header.Type)
	}
	if len(req.Data) < nfgenmsgLen {
		return kernelError(int(syscall.EINVAL), reqs)
	}
	switch cmd := int(req.Header.Type & 0xff); cmd {
	case msgGet:
		if req.Header.Flags&netlink.Dump == 0 {
			// The kernel answers with NLM_F_MULTI and no NLMSG_DONE: netlink.Conn would wait forever.
			k.t.Fatalf("GET of one counter sent; only dumps end")
		}
		names := make([]string, 0, len(k.counters))
		for name := range k.counters {
			names = append(names, name)
		}
		slices.Sort(names)
		var out []netlink.Message
		for _, name := range names {
			out = append(out, describe(k.counters[name]))
		}
		// Every part is flagged multi-part, and NLMSG_DONE ends them, even when there are none.
		out = append(out, netlink.Message{Header: netlink.Header{Type: netlink.Done}, Data: make([]byte, 4)})
		for i := range out {
			out[i].Header.Flags |= netlink.Multi
			out[i].Header.Sequence, out[i].Header.PID = req.Header.Sequence, req.Header.PID
		}
		if k.createdBehind != "" {
			k.counters[k.createdBehind] = &Counter{Name: k.createdBehind}
		}
		return out, nil
	case msgNew:
		name, err := requestName(req.Data[nfgenmsgLen:])
		if err != nil {
			return kernelError(int(syscall.EINVAL), reqs)
		}
		if req.Header.Flags&netlink.Create == 0 {
			k.t.Fatalf("NEW without NLM_F_CREATE")
		}
		if _, ok := k.counters[name]; ok {
			return kernelError(int(syscall.EBUSY), reqs)
		}
		k.counters[name] = &Counter{Name: name}
		if req.Header.Flags&netlink.Acknowledge != 0 {
			return kernelError(0, reqs)
		}
		return nil, nil
	default:
		k.t.Fatalf("unexpected accounting command %d", cmd)
		return nil, nil
	}
}

// kernelError is the kernel's answer carrying an errno (0: an acknowledgement). Unlike nltest.Error it
// does not copy the request's flags: a dump's NLM_F_MATCH is the bit that marks extended
// acknowledgements in an answer.
func kernelError(errno int, reqs []netlink.Message) ([]netlink.Message, error) {
	req := reqs[0]
	return []netlink.Message{{
		Header: netlink.Header{Type: netlink.Error, Sequence: req.Header.Sequence, PID: req.Header.PID},
		Data:   append(nlenc.Int32Bytes(int32(-errno)), req.Data...),
	}}, nil
}

// requestName returns the NFACCT_NAME of a request, refusing names the kernel would.
func requestName(b []byte) (string, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", err
	}
	var name string
	var raw []byte
	for ad.Next() {
		if ad.Type() == attrName {
			raw = ad.Bytes()
			name = ad.String()
		}
	}
	if len(raw) == 0 || raw[len(raw)-1] != 0 || len(raw) > MaxNameLength+1 {
		return "", errors.New("bad name")
	}
	return name, ad.Err()
}

// describe is the kernel's description of a counter, with the attributes this package skips: the use
// count and, before the 64-bit values, a padding attribute as some architectures get.
func describe(c *Counter) netlink.Message {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.String(attrName, c.Name)
	ae.Bytes(8, nil) // NFACCT_PAD
	ae.Uint64(attrPackets, c.Packets)
	ae.Uint64(attrBytes, c.Bytes)
	ae.Uint32(4, 1) // NFACCT_USE
	attrs, _ := ae.Encode()
	return netlink.Message{
		Header: netlink.Header{Type: msgType(msgNew)},
		Data:   append(make([]byte, nfgenmsgLen), attrs...),
	}
}

func TestEnsureAndGet(t *testing.T) {
	tests := []struct {
		name     string
		existing *Counter // in the kernel before Ensure
		behind   bool     // created by someone else between Ensure's GET and NEW
		want     Counter
	}{
		{name: "missing: created at zero", want: Counter{Name: "localhost_nps_accepted_pkts"}},
		{name: "existing: counts kept",
			existing: &Counter{Name: "localhost_nps_accepted_pkts", Packets: 1 << 40, Bytes: 3<<40 + 7},
			want:     Counter{Name: "localhost_nps_accepted_pkts", Packets: 1 << 40, Bytes: 3<<40 + 7}},
		{name: "created meanwhile: EBUSY is success", behind: true, want: Counter{Name: "localhost_nps_accepted_pkts"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newFakeKernel(t)
			if tt.existing != nil {
				k.counters[tt.existing.Name] = tt.existing
			}
			if tt.behind {
				k.createdBehind = tt.want.Name
			}
			c := k.client()
			defer c.Close()
			if err := c.Ensure(tt.want.Name); err != nil {
				t.Fatalf("Ensure: %v", err)
			}
			if err := c.Ensure(tt.want.Name); err != nil {
				t.Fatalf("second Ensure: %v", err)
			}
			got, err := c.Get(tt.want.Name)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if got != tt.want {
				t.Errorf("Get = %+v, want %+v", got, tt.want)
			}
			if len(k.counters) != 1 {
				t.Errorf("kernel holds %d counters, want 1", len(k.counters))
			}
		})
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name    string
		counter string
		missing bool
		is      error  // errors.Is target, or nil
		text    string // in the message
	}{
		{name: "not found", counter: "ct_state_invalid_dropped_pkts", is: ErrNotFound, text: `"ct_state_invalid_dropped_pkts"`},
		{name: "empty name", counter: "", text: "must be 1 to 31 bytes"},
		{name: "name too long", counter: strings.Repeat("n", 32), text: "must be 1 to 31 bytes"},
		{name: "longest name", counter: strings.Repeat("n", 31), is: ErrNotFound},
		{name: "no subsystem", counter: "x", missing: true, is: syscall.EOPNOTSUPP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newFakeKernel(t)
			k.missing = tt.missing
			c := k.client()
			defer c.Close()
			_, err := c.Get(tt.counter)
			if err == nil {
				t.Fatal("Get succeeded")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("Get: %v, want one that is %v", err, tt.is)
			}
			if !strings.Contains(err.Error(), tt.text) {
				t.Errorf("Get: %q does not say %q", err, tt.text)
			}
			if tt.is != ErrNotFound && errors.Is(err, ErrNotFound) {
				t.Errorf("Get: %v is ErrNotFound", err)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	full := describe(&Counter{Name: "c", Packets: 5, Bytes: 300}).Data
	noBytes := func() []byte {
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		ae.String(attrName, "c")
		ae.Uint64(attrPackets, 5)
		b, _ := ae.Encode()
		return append(make([]byte, nfgenmsgLen), b...)
	}()
	tests := []struct {
		name    string
		data    []byte
		want    Counter
		wantErr string
	}{
		{name: "complete", data: full, want: Counter{Name: "c", Packets: 5, Bytes: 300}},
		{name: "no header", data: []byte{0, 0}, wantErr: "shorter than its header"},
		{name: "truncated attribute", data: full[:len(full)-3], wantErr: "decoding"},
		{name: "bytes missing", data: noBytes, wantErr: "missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decode(tt.data)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("decode = %+v, %v; want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("decode = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}
