package ipvs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/cloudflare/ipvs"
	"github.com/cloudflare/ipvs/netmask"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/rules/xtables"
)

// kernelIPVS drives IPVS over generic netlink with github.com/cloudflare/ipvs.
type kernelIPVS struct{ c ipvs.Client }

func ipvsFamily(a netip.Addr) ipvs.AddressFamily {
	if a.Is4() {
		return ipvs.INET
	}
	return ipvs.INET6
}

// service returns the library's service for a key. The kernel refuses a full service without a netmask
// attribute, so it is always set (a host mask: persistence is per client address).
func service(k vsKey) ipvs.Service {
	s := ipvs.Service{Address: k.Addr(), Port: k.port, Protocol: ipvs.Protocol(k.proto), Family: ipvsFamily(k.Addr())}
	if k.Addr().Is4() {
		s.Netmask = netmask.MaskFrom(32, 32)
	} else {
		s.Netmask = netmask.MaskFrom(128, 128)
	}
	return s
}

func destination(r realKey, weight uint32) ipvs.Destination {
	return ipvs.Destination{Address: r.Addr(), Port: r.port, Family: ipvsFamily(r.Addr()), FwdMethod: ipvs.Masquerade, Weight: weight}
}

// ipvsErr classifies the kernel's answers: EEXIST for duplicates, ESRCH (service) and ENOENT (real
// server) for missing objects.
func ipvsErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%w: %w", errExist, err)
	case errors.Is(err, unix.ESRCH), errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: %w", errNotExist, err)
	}
	return err
}

// services dumps the virtual servers over generic netlink and reads each one's attributes in place.
// The library's Services builds a ServiceExtended of every virtual server through an attribute decoder per
// nesting level: at 10,000 Services its dumps were the largest allocation of a full resync in the VM (67
// MB over one run's changes and idle period), and a good part of its CPU time under emulation.
func (h *kernelIPVS) services() ([]kernelVS, error) {
	fam, err := netlink.GenlFamilyGet(ipvsGenlName)
	if err != nil {
		return nil, fmt.Errorf("looking up the %s netlink family: %w", ipvsGenlName, err)
	}
	req := nl.NewNetlinkRequest(int(fam.ID), unix.NLM_F_DUMP)
	req.AddData(&nl.Genlmsg{Command: ipvsCmdGetService, Version: ipvsGenlVersion})
	var out []kernelVS
	err = req.ExecuteIter(unix.NETLINK_GENERIC, fam.ID, func(m []byte) bool {
		if len(m) < nl.SizeofGenlmsg {
			return true
		}
		eachAttr(m[nl.SizeofGenlmsg:], func(typ uint16, v []byte) {
			if typ == ipvsCmdAttrService {
				if vs, ok := parseIPVSService(v); ok {
					out = append(out, vs)
				}
			}
		})
		return true
	})
	return out, err
}

// The IPVS generic netlink protocol (linux/ip_vs.h).
const (
	ipvsGenlName       = "IPVS"
	ipvsGenlVersion    = 1
	ipvsCmdGetService  = 4
	ipvsCmdAttrService = 1
	ipvsSvcAttrAf      = 1
	ipvsSvcAttrProto   = 2
	ipvsSvcAttrAddr    = 3
	ipvsSvcAttrPort    = 4
	ipvsSvcAttrFwmark  = 5
	ipvsSvcAttrSched   = 6
	ipvsSvcAttrFlags   = 7
	ipvsSvcAttrTimeout = 8
)

// parseIPVSService reads a virtual server's attributes (IPVS_CMD_ATTR_SERVICE); fwmark services, never
// ours, and malformed ones are skipped.
func parseIPVSService(b []byte) (kernelVS, bool) {
	var vs kernelVS
	var af uint16
	var addr []byte
	var fwmark uint32
	var port uint16
	var proto uint16
	ok := true
	eachAttr(b, func(typ uint16, v []byte) {
		switch typ {
		case ipvsSvcAttrAf:
			ok = ok && len(v) == 2
			if len(v) == 2 {
				af = nl.NativeEndian().Uint16(v)
			}
		case ipvsSvcAttrProto:
			ok = ok && len(v) == 2
			if len(v) == 2 {
				proto = nl.NativeEndian().Uint16(v)
			}
		case ipvsSvcAttrAddr:
			addr = v
		case ipvsSvcAttrPort:
			ok = ok && len(v) == 2
			if len(v) == 2 {
				port = binary.BigEndian.Uint16(v)
			}
		case ipvsSvcAttrFwmark:
			if len(v) == 4 {
				fwmark = nl.NativeEndian().Uint32(v)
			}
		case ipvsSvcAttrSched:
			vs.scheduler = schedulerName(v)
		case ipvsSvcAttrFlags: // struct ip_vs_flags: the flags, then a mask
			ok = ok && len(v) == 8
			if len(v) == 8 {
				vs.flags = nl.NativeEndian().Uint32(v[:4]) &^ flagHashed
			}
		case ipvsSvcAttrTimeout:
			if len(v) == 4 {
				vs.timeout = nl.NativeEndian().Uint32(v)
			}
		}
	})
	if !ok || fwmark != 0 {
		return kernelVS{}, false
	}
	var a netip.Addr
	switch {
	case af == unix.AF_INET && len(addr) >= 4:
		a = netip.AddrFrom4([4]byte(addr[:4]))
	case af == unix.AF_INET6 && len(addr) >= 16:
		a = netip.AddrFrom16([16]byte(addr[:16]))
	default:
		return kernelVS{}, false
	}
	vs.key = newVSKey(a.Unmap(), port, protocol(proto))
	return vs, true
}

// schedulerName returns the scheduler's name, one shared string for the kernel's schedulers.
func schedulerName(v []byte) string {
	v, _, _ = bytes.Cut(v, []byte{0})
	for _, s := range knownSchedulers {
		if string(v) == s {
			return s
		}
	}
	return string(v)
}

var knownSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}

func (h *kernelIPVS) createService(vs kernelVS) error {
	s := service(vs.key)
	s.Scheduler, s.Flags, s.Timeout = vs.scheduler, ipvs.Flags(vs.flags), vs.timeout
	return ipvsErr(h.c.CreateService(s))
}

func (h *kernelIPVS) updateService(vs kernelVS) error {
	s := service(vs.key)
	s.Scheduler, s.Flags, s.Timeout = vs.scheduler, ipvs.Flags(vs.flags), vs.timeout
	return ipvsErr(h.c.UpdateService(s))
}

func (h *kernelIPVS) removeService(k vsKey) error { return ipvsErr(h.c.RemoveService(service(k))) }

func (h *kernelIPVS) reals(k vsKey) ([]kernelReal, error) {
	list, err := h.c.Destinations(service(k))
	if errors.Is(err, os.ErrNotExist) { // an empty dump (also what a missing service gives)
		return nil, nil
	}
	if err != nil {
		return nil, ipvsErr(err)
	}
	out := make([]kernelReal, 0, len(list))
	for _, d := range list {
		out = append(out, kernelReal{key: newRealKey(d.Address.Unmap(), d.Port), weight: d.Weight,
			active: d.ActiveConnections, inactive: d.InactiveConnections})
	}
	return out, nil
}

// procIPVS is the kernel's text listing of every virtual server with its real servers, of the network
// namespace of the reading process.
const procIPVS = "/proc/net/ip_vs"

// allReals reads procIPVS: one read instead of a netlink dump per virtual server. The listing gives
// addresses in hex ("0A60000A:0050", "[fd00:0000:...]:0050") and, per real server, its forwarding
// method, weight, active and inactive connection counts.
func (h *kernelIPVS) allReals() (map[vsKey][]kernelReal, error) {
	f, err := os.Open(procIPVS)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseProcIPVS(f)
}

func (h *kernelIPVS) createReal(k vsKey, r realKey, w uint32) error {
	return ipvsErr(h.c.CreateDestination(service(k), destination(r, w)))
}

func (h *kernelIPVS) updateReal(k vsKey, r realKey, w uint32) error {
	return ipvsErr(h.c.UpdateDestination(service(k), destination(r, w)))
}

func (h *kernelIPVS) removeReal(k vsKey, r realKey) error {
	return ipvsErr(h.c.RemoveDestination(service(k), destination(r, 0)))
}

func (h *kernelIPVS) setTimeouts(tcp, tcpFin, udp uint32) error {
	return h.c.SetConfig(ipvs.Config{TCPTimeout: tcp, TCPFinTimeout: tcpFin, UDPTimeout: udp})
}

// kernelSets drives ipsets over netfilter netlink with github.com/vishvananda/netlink.
type kernelSets struct{ h *netlink.Handle }

// setErr classifies the kernel's answers. IPSET_ERR_EXIST means "already added" for an add and a create,
// and "not added" for a delete; ENOENT means the set does not exist.
func setErr(err error, missingIfExist bool) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nl.IPSetError(nl.IPSET_ERR_EXIST)) && missingIfExist, errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: %w", errNotExist, err)
	case errors.Is(err, nl.IPSetError(nl.IPSET_ERR_EXIST)):
		return fmt.Errorf("%w: %w", errExist, err)
	}
	return err
}

func (s *kernelSets) createSet(name, typ string, family v1.IPFamily) error {
	o := netlink.IpsetCreateOptions{MaxElements: 65536}
	switch {
	case typ == typeBitmapPort:
		o.PortFrom, o.PortTo = 0, 65535
	case family == v1.IPv6Protocol:
		o.Family = unix.AF_INET6
	default:
		o.Family = unix.AF_INET
	}
	if typ == typeBitmapPort {
		o.MaxElements = 0
	}
	return setErr(s.h.IpsetCreate(name, typ, o), false)
}

func (s *kernelSets) destroySet(name string) error { return setErr(s.h.IpsetDestroy(name), true) }

// listSet dumps a set's members over netfilter netlink, reading each member's attributes in place into
// an entry. (netlink.IpsetList builds an IPSetEntry of pointers and slices per member, through a goroutine
// and a channel per attribute list: at 10,000 Services the sets' listings of one run's changes and idle
// period allocated 28.5 MB, and their CPU time was a good part of each resync's under emulation.)
func (s *kernelSets) listSet(name string) ([]entry, error) {
	req := nl.NewNetlinkRequest(nl.IPSET_CMD_LIST|(unix.NFNL_SUBSYS_IPSET<<8), nl.GetIpsetFlags(nl.IPSET_CMD_LIST))
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
	var out []entry
	typeName := "" // in the dump's first message only
	err := req.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(m []byte) bool {
		if len(m) < nl.SizeofNfgenmsg {
			return true
		}
		eachAttr(m[nl.SizeofNfgenmsg:], func(typ uint16, v []byte) {
			switch typ {
			case nl.IPSET_ATTR_TYPENAME:
				typeName = unix.ByteSliceToString(v)
			case nl.IPSET_ATTR_ADT:
				eachAttr(v, func(typ uint16, v []byte) {
					if typ == nl.IPSET_ATTR_DATA {
						out = append(out, setMember(v, typeName == typeHashIPPortNet))
					}
				})
			}
		})
		return true
	})
	var errno unix.Errno
	if errors.As(err, &errno) && int(errno) >= nl.IPSET_ERR_PRIVATE {
		err = nl.IPSetError(uintptr(errno))
	}
	if err != nil {
		return nil, setErr(err, false)
	}
	return out, nil
}

// setMember reads one member's attributes (IPSET_ATTR_DATA): the address, the port with its protocol,
// and the second address or network.
func setMember(b []byte, isNet bool) entry {
	var e entry
	var ip2 netip.Addr
	var cidr2 int
	hasPort, hasProto := false, false
	var proto uint8
	eachAttr(b, func(typ uint16, v []byte) {
		switch typ {
		case nl.IPSET_ATTR_IP:
			e.ip = ipOf(nestedAddr(v))
		case nl.IPSET_ATTR_IP2:
			ip2 = nestedAddr(v)
		case nl.IPSET_ATTR_CIDR2:
			if len(v) > 0 {
				cidr2 = int(v[0])
			}
		case nl.IPSET_ATTR_PORT:
			if len(v) >= 2 {
				e.port, hasPort = binary.BigEndian.Uint16(v), true
			}
		case nl.IPSET_ATTR_PROTO:
			if len(v) > 0 {
				proto, hasProto = v[0], true
			}
		}
	})
	if hasPort && hasProto && e.ip.IsValid() {
		e.proto = protocol(proto)
	}
	switch {
	case !ip2.IsValid():
	case isNet:
		if cidr2 == 0 {
			cidr2 = ip2.BitLen()
		}
		e = e.withNet(netip.PrefixFrom(ip2, cidr2))
	default:
		e = e.withIP2(ip2)
	}
	return e
}

// nestedAddr reads an address nested in an ipset attribute (IPSET_ATTR_IPADDR_IPV4 or _IPV6).
func nestedAddr(b []byte) netip.Addr {
	var a netip.Addr
	eachAttr(b, func(typ uint16, v []byte) {
		if typ == nl.IPSET_ATTR_IPADDR_IPV4 || typ == nl.IPSET_ATTR_IPADDR_IPV6 {
			a, _ = netip.AddrFromSlice(v)
		}
	})
	return a.Unmap()
}

// eachAttr calls f with the type (without its nested and byte-order flags) and the value of each netlink
// attribute in b, stopping at a malformed one.
func eachAttr(b []byte, f func(typ uint16, v []byte)) {
	for len(b) >= unix.SizeofRtAttr {
		n := int(nl.NativeEndian().Uint16(b[0:2]))
		if n < unix.SizeofRtAttr || n > len(b) {
			return
		}
		f(nl.NativeEndian().Uint16(b[2:4])&nl.NLA_TYPE_MASK, b[unix.SizeofRtAttr:n])
		b = b[min((n+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1), len(b)):]
	}
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// netlinkEntry converts an entry for a hash set type.
func netlinkEntry(typ string, e entry) *netlink.IPSetEntry {
	port, proto := e.port, uint8(e.proto)
	ne := &netlink.IPSetEntry{Port: &port}
	ne.IP = net.IP(e.ip.AsSlice())
	if typ == typeHashIP {
		ne.Port = nil
		return ne
	}
	ne.Protocol = &proto
	switch {
	case e.isNet:
		ne.IP2 = net.IP(e.third.AsSlice())
		ne.CIDR2 = e.bits
	case e.third.IsValid():
		ne.IP2 = net.IP(e.third.AsSlice())
	}
	return ne
}

func (s *kernelSets) addEntry(name, typ string, e entry) error {
	if typ == typeBitmapPort {
		return setErr(bitmapPort(nl.IPSET_CMD_ADD, name, e.port), false)
	}
	return setErr(s.h.IpsetAdd(name, netlinkEntry(typ, e)), false)
}

func (s *kernelSets) delEntry(name, typ string, e entry) error {
	if typ == typeBitmapPort {
		return setErr(bitmapPort(nl.IPSET_CMD_DEL, name, e.port), true)
	}
	return setErr(s.h.IpsetDel(name, netlinkEntry(typ, e)), true)
}

// bitmapPort adds (IPSET_CMD_ADD) or deletes (IPSET_CMD_DEL) a bitmap:port member. The library sends a
// protocol attribute with every port, which bitmap:port refuses (IPSET_ERR_PROTOCOL), so this request is
// built by hand: set name, and a data attribute holding the port alone.
func bitmapPort(cmd int, set string, port uint16) error {
	req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), nl.GetIpsetFlags(cmd)|unix.NLM_F_EXCL)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(set)))
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
	data.AddChild(nl.NewRtAttr(int(nl.IPSET_ATTR_PORT|nl.NLA_F_NET_BYTEORDER), nl.BEUint16Attr(port)))
	data.AddChild(&nl.Uint32Attribute{Type: nl.IPSET_ATTR_LINENO | nl.NLA_F_NET_BYTEORDER, Value: 0})
	req.AddData(data)
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	var errno unix.Errno
	if errors.As(err, &errno) && int(errno) >= nl.IPSET_ERR_PRIVATE {
		return nl.IPSetError(uintptr(errno))
	}
	return err
}

// kernelLinks drives links and addresses over rtnetlink.
type kernelLinks struct {
	h *netlink.Handle
	// index caches link indexes by name: looking a link up costs a request per address otherwise.
	index map[string]int
}

// link returns a link to address by index (cached; fresh when refresh is set).
func (l *kernelLinks) link(name string, refresh bool) (netlink.Link, error) {
	if i, ok := l.index[name]; ok && !refresh {
		return &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: i, Name: name}}, nil
	}
	lk, err := l.h.LinkByName(name)
	if err != nil {
		delete(l.index, name)
		return nil, err
	}
	l.index[name] = lk.Attrs().Index
	return lk, nil
}

// withLink runs f on the link, once more with a fresh lookup if it failed because the link was replaced.
func (l *kernelLinks) withLink(name string, f func(netlink.Link) error) error {
	lk, err := l.link(name, false)
	if err != nil {
		return err
	}
	err = f(lk)
	if errors.Is(err, unix.ENODEV) {
		if lk, err = l.link(name, true); err != nil {
			return err
		}
		err = f(lk)
	}
	return err
}

func nlFamily(f v1.IPFamily) int {
	if f == v1.IPv6Protocol {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func (l *kernelLinks) ensureDummy(name string) error {
	if _, err := l.link(name, true); err == nil {
		return nil
	}
	err := l.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

func (l *kernelLinks) deleteLink(name string) error {
	delete(l.index, name)
	link, err := l.h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return fmt.Errorf("%w: %w", errNotExist, err)
		}
		return err
	}
	return l.h.LinkDel(link)
}

func (l *kernelLinks) addrs(link string, family v1.IPFamily) ([]netip.Addr, error) {
	lk, err := l.h.LinkByName(link)
	if err != nil {
		return nil, err
	}
	return dumpAddrs(family, lk.Attrs().Index, 0)
}

// dumpAddrs lists the addresses of a family over rtnetlink: those of the link with index only, or, when
// only is 0, those of every link but skip. It reads each message's address in place. netlink.AddrList
// builds a netlink.Addr of every address of every link first, and kube-ipvs0 holds one per Service: at
// 10,000 Services each listing left ~19 MB of garbage, and the node's own addresses are polled every few
// seconds.
func dumpAddrs(family v1.IPFamily, only, skip int) ([]netip.Addr, error) {
	fam := nlFamily(family)
	for try := 1; ; try++ {
		var out []netip.Addr
		req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfAddrmsg(fam))
		err := req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWADDR, func(m []byte) bool {
			if len(m) < unix.SizeofIfAddrmsg {
				return true
			}
			msg := nl.DeserializeIfAddrmsg(m)
			idx := int(msg.Index)
			if int(msg.Family) != fam || (only != 0 && idx != only) || (only == 0 && idx == skip) {
				return true
			}
			if a, ok := ifaAddr(m[unix.SizeofIfAddrmsg:]); ok {
				out = append(out, a)
			}
			return true
		})
		if errors.Is(err, nl.ErrDumpInterrupted) && try < 3 {
			continue // the addresses changed during the dump: read them again
		}
		return out, err
	}
}

// ifaAddr returns the address of an RTM_NEWADDR message's attributes: IFA_LOCAL, or IFA_ADDRESS without
// it (they differ on point-to-point links, where IFA_ADDRESS is the peer), as netlink.AddrList does.
func ifaAddr(b []byte) (netip.Addr, bool) {
	var addr, local netip.Addr
	eachAttr(b, func(typ uint16, v []byte) {
		switch typ {
		case unix.IFA_ADDRESS:
			addr, _ = netip.AddrFromSlice(v)
		case unix.IFA_LOCAL:
			local, _ = netip.AddrFromSlice(v)
		}
	})
	if local.IsValid() {
		return local.Unmap(), true
	}
	return addr.Unmap(), addr.IsValid()
}

func hostAddr(a netip.Addr) *netlink.Addr {
	na := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
	if a.Is6() {
		// No duplicate address detection: the link is down, so the address would stay tentative.
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

func (l *kernelLinks) addAddr(link string, a netip.Addr) error {
	err := l.withLink(link, func(lk netlink.Link) error { return l.h.AddrAdd(lk, hostAddr(a)) })
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("%w: %w", errExist, err)
	}
	return err
}

func (l *kernelLinks) delAddr(link string, a netip.Addr) error {
	err := l.withLink(link, func(lk netlink.Link) error { return l.h.AddrDel(lk, hostAddr(a)) })
	if errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("%w: %w", errNotExist, err)
	}
	return err
}

func (l *kernelLinks) localAddrs(family v1.IPFamily, except string) ([]netip.Addr, error) {
	// Without except's index its addresses (the Services') would pass for the node's own.
	lk, err := l.link(except, true)
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", except, err)
	}
	return dumpAddrs(family, 0, lk.Attrs().Index)
}

func (l *kernelLinks) watchAddrs(ctx context.Context, family v1.IPFamily, changed func()) error {
	updates := make(chan netlink.AddrUpdate, 256)
	failed := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	err := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case failed <- err:
			default:
			}
		},
	})
	if err != nil {
		return fmt.Errorf("subscribing to address changes: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return fmt.Errorf("watching address changes: %w", err)
		case u, ok := <-updates:
			if !ok {
				return errors.New("watching address changes: the subscription ended")
			}
			if ip, ok := netip.AddrFromSlice(u.LinkAddress.IP); ok && familyOf(ip.Unmap()) == family {
				changed()
			}
		}
	}
}

// kernelRules writes iptables rules through rules/xtables.
type kernelRules struct{ r *xtables.Runner }

func (k *kernelRules) restore(ctx context.Context, payload []byte) error {
	return k.r.Restore(ctx, payload)
}

func (k *kernelRules) save(ctx context.Context, table string) (string, error) {
	var buf bytes.Buffer
	if err := k.r.Save(ctx, table, &buf); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// kernelVersion returns the running kernel's major and minor version.
func kernelVersion() [2]int {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return [2]int{}
	}
	var v [2]int
	_, _ = fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &v[0], &v[1])
	return v
}
