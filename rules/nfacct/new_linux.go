package nfacct

import (
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// New connects to the nfacct subsystem of the calling process's network namespace, or, when netns is a
// namespace's file descriptor (not 0), of that namespace. Like upstream, it asks the kernel for counters
// first: when that fails the subsystem is missing (or not allowed), and the error wraps ErrNotSupported.
func New(netns int) (*Client, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("%w: opening a netfilter netlink socket: %v", ErrNotSupported, err)
	}
	c := newClient(conn)
	if _, err := c.List(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: %v", ErrNotSupported, err)
	}
	return c, nil
}
