package nfacct

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/mdlayher/netlink"
)

// MaxNameLength is the longest counter name the kernel takes (NFACCT_NAME_MAX, 32, less the
// terminating NUL).
const MaxNameLength = 31

// The nfnetlink accounting protocol (linux/netfilter/nfnetlink_acct.h and nfnetlink.h).
const (
	subsysAcct = 7 // NFNL_SUBSYS_ACCT

	msgNew = 0 // NFNL_MSG_ACCT_NEW: create a counter, and the type of the kernel's replies describing one
	msgGet = 1 // NFNL_MSG_ACCT_GET

	attrName    = 1 // NFACCT_NAME: NUL-terminated string
	attrPackets = 2 // NFACCT_PKTS: big-endian u64
	attrBytes   = 3 // NFACCT_BYTES: big-endian u64

	// nfgenmsgLen is the size of struct nfgenmsg, which every nfnetlink message starts with: family,
	// version (NFNETLINK_V0) and a big-endian resource id, all zero here.
	nfgenmsgLen = 4
)

// Errors the kernel's answers map to.
var (
	// ErrNotFound is returned for a counter that does not exist.
	ErrNotFound = errors.New("no such nfacct counter")
	// ErrNotSupported is returned when the kernel has no nfacct subsystem (or it cannot be reached).
	ErrNotSupported = errors.New("nfacct is not available")
)

// Counter is one nfacct object: its name and what it counted so far.
type Counter struct {
	Name    string
	Packets uint64
	Bytes   uint64
}

// Client talks to the nfacct subsystem of one network namespace over netlink. It is safe for concurrent
// use.
type Client struct {
	conn *netlink.Conn
}

// newClient returns a Client over an open netlink connection (NETLINK_NETFILTER, or a test's fake).
func newClient(conn *netlink.Conn) *Client { return &Client{conn: conn} }

// Close closes the netlink connection.
func (c *Client) Close() error { return c.conn.Close() }

// Get returns the counter called name; the error wraps ErrNotFound when there is none.
func (c *Client) Get(name string) (Counter, error) {
	if err := checkName(name); err != nil {
		return Counter{}, err
	}
	all, err := c.List()
	if err != nil {
		return Counter{}, fmt.Errorf("getting nfacct counter %q: %w", name, err)
	}
	for _, ctr := range all {
		if ctr.Name == name {
			return ctr, nil
		}
	}
	return Counter{}, fmt.Errorf("getting nfacct counter %q: %w", name, ErrNotFound)
}

// List returns every counter of the namespace. It is how Get reads one: the kernel answers a request for
// a single counter with a multi-part message it never ends (NLM_F_MULTI without NLMSG_DONE), on which
// netlink.Conn would wait forever, while a dump ends properly. A node holds a handful of counters.
func (c *Client) List() ([]Counter, error) {
	msgs, err := c.conn.Execute(request(msgGet, netlink.Request|netlink.Dump, ""))
	if err != nil {
		return nil, fmt.Errorf("listing nfacct counters: %w", err)
	}
	out := make([]Counter, 0, len(msgs))
	for _, m := range msgs {
		if m.Header.Type != msgType(msgNew) {
			continue
		}
		ctr, err := decode(m.Data)
		if err != nil {
			return nil, fmt.Errorf("listing nfacct counters: %w", err)
		}
		out = append(out, ctr)
	}
	return out, nil
}

// Ensure creates the counter called name unless it exists already; an existing counter keeps its counts.
func (c *Client) Ensure(name string) error {
	_, err := c.Get(name)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return err
	}
	// Without NLM_F_EXCL or NLM_F_REPLACE the kernel creates the counter, or answers EBUSY when it exists:
	// created meanwhile by someone else, which is just as good.
	_, err = c.conn.Execute(request(msgNew, netlink.Request|netlink.Acknowledge|netlink.Create, name))
	if err != nil && !errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("creating nfacct counter %q: %w", name, err)
	}
	return nil
}

// checkName refuses names the kernel would refuse or cut short.
func checkName(name string) error {
	if name == "" || len(name) > MaxNameLength {
		return fmt.Errorf("nfacct counter name %q: must be 1 to %d bytes long", name, MaxNameLength)
	}
	return nil
}

// msgType is the netlink message type of an accounting command.
func msgType(cmd int) netlink.HeaderType { return netlink.HeaderType(subsysAcct<<8 | cmd) }

// request builds an accounting request naming one counter, or none when name is empty.
func request(cmd int, flags netlink.HeaderFlags, name string) netlink.Message {
	var attrs []byte
	if name != "" {
		ae := netlink.NewAttributeEncoder()
		ae.String(attrName, name) // with its NUL, as the kernel wants it
		attrs, _ = ae.Encode()    // encoding a short string cannot fail
	}
	data := make([]byte, nfgenmsgLen, nfgenmsgLen+len(attrs))
	return netlink.Message{
		Header: netlink.Header{Type: msgType(cmd), Flags: flags},
		Data:   append(data, attrs...),
	}
}

// decode parses the kernel's description of a counter: an nfgenmsg header, then attributes. Attributes
// it does not know (the use count, flags, quota, padding) are skipped.
func decode(b []byte) (Counter, error) {
	if len(b) < nfgenmsgLen {
		return Counter{}, fmt.Errorf("decoding an nfacct message: %d bytes, shorter than its header", len(b))
	}
	ad, err := netlink.NewAttributeDecoder(b[nfgenmsgLen:])
	if err != nil {
		return Counter{}, fmt.Errorf("decoding an nfacct message: %w", err)
	}
	ad.ByteOrder = binary.BigEndian
	var c Counter
	var seen int
	for ad.Next() {
		switch ad.Type() {
		case attrName:
			c.Name = ad.String()
			seen |= 1 << attrName
		case attrPackets:
			c.Packets = ad.Uint64()
			seen |= 1 << attrPackets
		case attrBytes:
			c.Bytes = ad.Uint64()
			seen |= 1 << attrBytes
		}
	}
	if err := ad.Err(); err != nil {
		return Counter{}, fmt.Errorf("decoding an nfacct message: %w", err)
	}
	if want := 1<<attrName | 1<<attrPackets | 1<<attrBytes; seen != want {
		return Counter{}, fmt.Errorf("decoding an nfacct message: name, packets or bytes missing")
	}
	return c, nil
}
