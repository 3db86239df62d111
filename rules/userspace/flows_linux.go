package userspace

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// FlowCleaner deletes stale UDP conntrack entries over netlink.
type FlowCleaner struct{ Family v1.IPFamily }

// Clean deletes the UDP entries Stale picks.
func (c FlowCleaner) Clean(dsts []Destination) error {
	family := netlink.InetFamily(unix.AF_INET)
	if c.Family == v1.IPv6Protocol {
		family = unix.AF_INET6
	}
	_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, flowFilter(dsts))
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("deleting stale UDP conntrack entries: %w", err)
	}
	return nil
}

type flowFilter []Destination

func (f flowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	return Stale(f, addrPort(flow.Forward.DstIP, flow.Forward.DstPort), addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort))
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}
