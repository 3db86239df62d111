package iptrace

import (
	"fmt"
	"net/netip"
	"slices"
)

// VirtualServer is an IPVS virtual server, as the tracer's IPVS step uses it.
type VirtualServer struct {
	Addr     netip.Addr
	Port     uint16
	Protocol string // "tcp", "udp" or "sctp"
	// Persistent is set for a virtual server with persistence (ipvsadm -p, kube-proxy's session
	// affinity): a client IPVS already sent somewhere goes there again (see Packet.Persistence).
	Persistent bool
	Reals      []RealServer
}

// RealServer is one real server of a virtual server.
type RealServer struct {
	Addr netip.AddrPort
	// Weight is the IPVS weight: a real server of weight 0 takes no new connections (it is draining).
	Weight int
}

// String writes the virtual server's key as "tcp/10.96.0.1:80".
func (vs *VirtualServer) String() string {
	return vs.Protocol + "/" + netip.AddrPortFrom(vs.Addr, vs.Port).String()
}

type vsKey struct {
	addr  netip.Addr
	port  uint16
	proto string
}

// AddVirtualServer gives the tracer an IPVS virtual server with its real servers, replacing one with the
// same address, port and protocol. Trace then sends packets that reach IPVS for it to its real servers
// (see Trace).
func (ts *Tables) AddVirtualServer(vs VirtualServer) error {
	if _, ok := protoNumbers[vs.Protocol]; !ok {
		return fmt.Errorf("virtual server %s: protocol %q not supported by iptrace", vs.String(), vs.Protocol)
	}
	if !vs.Addr.IsValid() || vs.Addr.Is6() != ts.ipv6 {
		return fmt.Errorf("virtual server %s: not an address of this family", vs.String())
	}
	for _, r := range vs.Reals {
		if !r.Addr.IsValid() || r.Weight < 0 {
			return fmt.Errorf("virtual server %s: bad real server %s weight %d", vs.String(), r.Addr, r.Weight)
		}
	}
	vs.Reals = slices.Clone(vs.Reals)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.vss == nil {
		ts.vss = map[vsKey]*VirtualServer{}
	}
	ts.vss[vsKey{vs.Addr, vs.Port, vs.Protocol}] = &vs
	return nil
}

// ClearVirtualServers forgets every virtual server given to AddVirtualServer.
func (ts *Tables) ClearVirtualServers() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.vss = nil
}

// ipvsStep is IPVS's look-up of a packet that reached it (LOCAL_IN for arriving packets, LOCAL_OUT for
// the node's own): without a virtual server for its destination the packet goes on untouched (hit
// false); with one, a branch per real server that takes new connections, each with its share of the
// weights (the long-run share of IPVS's weighted schedulers), DNATed to it; a client with a persistence
// template for a persistent virtual server goes to that real server only. A virtual server without a
// real server to take the connection answers it with ICMP port unreachable, which is a REJECT.
func (tr *tracer) ipvsStep(st state) (brs []branch, hit bool) {
	vs := tr.ts.vss[vsKey{st.dst, st.dport, tr.pkt.Protocol}]
	if vs == nil {
		return []branch{{st, vAccept}}, false
	}
	name := vs.String()
	st.path = append(slices.Clip(st.path), "ipvs/"+name)
	st.ipvs = vs
	send := func(st state, r RealServer, p float64) branch {
		st.dst, st.dport, st.dnat = r.Addr.Addr(), r.Addr.Port(), r.Addr.String()
		st.prob *= p
		if vs.Persistent {
			st.addRecent([]string{"ipvs/" + name})
		}
		return branch{st, vAccept}
	}
	if vs.Persistent {
		if to, ok := tr.pkt.Persistence[name]; ok {
			for _, r := range vs.Reals {
				if r.Addr == to && r.Weight > 0 {
					return []branch{send(st.fork(), r, 1)}, true
				}
			}
		}
	}
	total := 0
	for _, r := range vs.Reals {
		total += r.Weight
	}
	if total == 0 {
		return []branch{{st, vReject}}, true
	}
	for _, r := range vs.Reals {
		if r.Weight > 0 {
			brs = append(brs, send(st.fork(), r, float64(r.Weight)/float64(total)))
		}
	}
	return brs, true
}

// matchIPVS reports whether a packet IPVS handled came through the virtual server an ipvs match names.
func matchIPVS(m *Match, st *state) bool {
	if st.ipvs == nil {
		return false
	}
	vs := st.ipvs
	if m.VProto != 0 && (protoNumbers[vs.Protocol] == m.VProto) == m.Not["--vproto"] {
		return false
	}
	if m.VAddr.IsValid() && m.VAddr.Contains(vs.Addr) == m.Not["--vaddr"] {
		return false
	}
	if m.VPort != 0 && (vs.Port == m.VPort) == m.Not["--vport"] {
		return false
	}
	return true
}
