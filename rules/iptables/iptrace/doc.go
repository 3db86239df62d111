// Package iptrace is a small model of iptables for tests: it parses the iptables-restore subset kube-proxy
// writes, keeps tables like the kernel does (so it can stand in for iptables-restore and iptables in the
// writer's tests, printing state back like iptables-save), and walks a packet through the nat and filter
// tables, following every random branch, to report which endpoints it can reach, whether it is
// masqueraded, or where it is dropped or rejected.
//
// Supported: -s/-d/-i/-o/-p with "!", -m comment, tcp, udp, sctp (--dport, --sport), addrtype
// (--src-type/--dst-type), statistic (--mode random --probability), recent (--set, --rcheck, --update with
// --seconds/--reap), mark (--mark), conntrack (--ctstate), set (--match-set over the ipsets given with
// SetIPSet, on all of a set's dimensions), physdev (--physdev-is-in only), ipvs (--vaddr, --vport,
// --vproto); targets ACCEPT, DROP, REJECT, RETURN, MARK, DNAT, REDIRECT (--to-ports, to the node itself:
// 127.0.0.1 or ::1 for local packets, else the first of Packet.LocalAddrs), MASQUERADE, user chains with
// -j and -g.
// Anything else is an error, so an unexpected rule shape fails a test instead of being ignored.
//
// For IPVS mode, the IPVS virtual servers given with AddVirtualServer take part in the walk where the
// kernel's IPVS hooks sit (see Tables.Trace).
package iptrace
