package conntrack

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
)

// Protocol numbers of the protocols cleaned up.
const (
	protoUDP  = 17
	protoSCTP = 132
)

// Flow is the part of a conntrack entry the decision needs: the original destination (the Service address a
// client sent to) and the reply source (where the packets really went, after DNAT).
type Flow struct {
	Protocol uint8
	OrigDst  netip.AddrPort
	ReplySrc netip.AddrPort
}

type svcKey struct {
	proto uint8
	dst   netip.AddrPort
}

type nodePortKey struct {
	proto uint8
	port  uint16
}

// Stale decides which flows are stale for one snapshot.
type Stale struct {
	byServiceIP map[svcKey]map[netip.AddrPort]struct{}
	byNodePort  map[nodePortKey]map[netip.AddrPort]struct{}
}

func protoNumber(p v1.Protocol) uint8 {
	switch p {
	case v1.ProtocolUDP:
		return protoUDP
	case v1.ProtocolSCTP:
		return protoSCTP
	}
	return 0
}

// NewStale indexes the UDP and SCTP Service ports of snap with the endpoints that are serving.
func NewStale(snap *proxy.Snapshot) *Stale {
	s := &Stale{byServiceIP: map[svcKey]map[netip.AddrPort]struct{}{}, byNodePort: map[nodePortKey]map[netip.AddrPort]struct{}{}}
	for _, sp := range snap.Services {
		proto := protoNumber(sp.Protocol)
		if proto == 0 {
			continue
		}
		serving := map[netip.AddrPort]struct{}{}
		for _, e := range sp.Endpoints {
			if e.Serving {
				serving[netip.AddrPortFrom(e.IP, uint16(e.Port))] = struct{}{}
			}
		}
		port := uint16(sp.Port)
		s.byServiceIP[svcKey{proto, netip.AddrPortFrom(sp.ClusterIP, port)}] = serving
		for _, ip := range sp.ExternalIPs {
			s.byServiceIP[svcKey{proto, netip.AddrPortFrom(ip, port)}] = serving
		}
		for _, ip := range sp.LoadBalancerIPs {
			s.byServiceIP[svcKey{proto, netip.AddrPortFrom(ip, port)}] = serving
		}
		if sp.NodePort != 0 && len(serving) > 0 {
			s.byNodePort[nodePortKey{proto, uint16(sp.NodePort)}] = serving
		}
	}
	return s
}

// Empty reports that the snapshot has no UDP or SCTP Service, so nothing can be stale.
func (s *Stale) Empty() bool { return len(s.byServiceIP) == 0 }

// IsStale reports whether a flow addressed to a Service goes somewhere other than a serving endpoint: a
// removed or non-serving endpoint, or the Service address itself (no DNAT happened because the Service had
// no endpoints when the flow began). Flows to NodePorts count only when the NodePort has endpoints.
func (s *Stale) IsStale(f Flow) bool {
	if eps, ok := s.byServiceIP[svcKey{f.Protocol, f.OrigDst}]; ok {
		_, serving := eps[f.ReplySrc]
		return !serving
	}
	if eps, ok := s.byNodePort[nodePortKey{f.Protocol, f.OrigDst.Port()}]; ok {
		_, serving := eps[f.ReplySrc]
		return !serving
	}
	return false
}

// Affected reports whether any of the changed Service ports is UDP or SCTP, i.e. whether a cleanup may
// find anything after a partial sync that changed them.
func Affected(changed []proxy.ServicePortName) bool {
	for _, n := range changed {
		if protoNumber(n.Protocol) != 0 {
			return true
		}
	}
	return false
}
