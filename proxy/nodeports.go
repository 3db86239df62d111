package proxy

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// NodePortAddresses is nodePortAddresses for one IP family: the CIDRs NodePorts (and health-check node
// ports) answer on, with upstream's keywords resolved: "primary" (the node's first IP of the family, taken
// from each snapshot so it follows the Node), "localhost" (127.0.0.0/8, ::1/128) and "all".
type NodePortAddresses struct {
	// CIDRs of this family, keywords other than "primary" expanded.
	CIDRs []netip.Prefix
	// Primary is set when the list contained "primary".
	Primary bool
}

// ParseNodePortAddresses keeps the entries of family from a validated nodePortAddresses list.
func ParseNodePortAddresses(list []string, family v1.IPFamily) NodePortAddresses {
	var n NodePortAddresses
	add := func(p netip.Prefix) {
		if ipFamily(p.Addr()) == family {
			n.CIDRs = append(n.CIDRs, p)
		}
	}
	for _, s := range list {
		switch s {
		case "primary":
			n.Primary = true
		case "localhost":
			add(netip.MustParsePrefix("127.0.0.0/8"))
			add(netip.MustParsePrefix("::1/128"))
		case "all":
			add(netip.MustParsePrefix("0.0.0.0/0"))
			add(netip.MustParsePrefix("::/0"))
		default:
			if p, err := parseCIDR(s); err == nil {
				add(p)
			}
		}
	}
	return n
}

// forIP returns the CIDRs in force when the node's primary IP is primary (invalid when unknown).
func (n NodePortAddresses) forIP(primary netip.Addr) (cidrs []netip.Prefix, matchAll bool) {
	cidrs = slices.Clone(n.CIDRs)
	if n.Primary && primary.IsValid() && !primary.IsLoopback() {
		cidrs = append(cidrs, netip.PrefixFrom(primary, primary.BitLen()))
	}
	if len(cidrs) == 0 || slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		return nil, true
	}
	return cidrs, false
}

// InterfaceAddrs returns the addresses of the node's interfaces.
func InterfaceAddrs() ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("reading the node's addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(ifAddrs))
	for _, a := range ifAddrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
