package model

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"kube-proxy/proxy"
)

// familyView is what one family's snapshot says, in a form the test computes independently (see expect)
// and compares with go-cmp: plain strings and numbers, nothing shared with proxy/.
type familyView struct {
	Node nodeView
	// Ports maps "ns/name:port/PROTO" (":port" only for named ports) to the port's state.
	Ports map[string]portView
}

type nodeView struct {
	Known    bool
	IPs      []string
	PodCIDRs []string
	Zone     string
}

type portView struct {
	ClusterIP           string
	Port                int32
	NodePort            int32
	ExternalIPs         []string
	LoadBalancerIPs     []string
	SourceRanges        []string
	StickySeconds       int32
	ExternalLocal       bool
	InternalLocal       bool
	HealthCheckNodePort int32
	TrafficDistribution string
	// Endpoints in the order the snapshot lists them (it must be by "ip:port" string).
	Endpoints []endpointView
	// UsesCluster and UsesLocal say whether the snapshot carries a Cluster / Local endpoint list at all;
	// Cluster and Local are the "ip:port" of the endpoints in them.
	UsesCluster bool
	Cluster     []string
	UsesLocal   bool
	Local       []string
	HasAny      bool
}

type endpointView struct {
	Addr        string
	Ready       bool
	Serving     bool
	Terminating bool
	Local       bool
	Node        string
	Zone        string
	ZoneHints   []string
	NodeHints   []string
}

// portKey renders a port's key the way familyView uses it.
func portKey(ns, name, port, protocol string) string {
	k := ns + "/" + name
	if port != "" {
		k += ":" + port
	}
	return k + "/" + protocol
}

// viewOf converts a snapshot into a familyView. Inconsistencies inside the snapshot itself (a map key that
// is not the port's name) are returned as problems.
func viewOf(snap *proxy.Snapshot) (familyView, []string) {
	var problems []string
	v := familyView{
		Node:  nodeView{Known: snap.Node.Known, Zone: snap.Node.Zone},
		Ports: make(map[string]portView, len(snap.Services)),
	}
	for _, ip := range snap.Node.IPs {
		v.Node.IPs = append(v.Node.IPs, ip.String())
	}
	for _, p := range snap.Node.PodCIDRs {
		v.Node.PodCIDRs = append(v.Node.PodCIDRs, p.String())
	}
	for name, sp := range snap.Services {
		if sp.Name != name || sp.Protocol != name.Protocol {
			problems = append(problems, fmt.Sprintf("snapshot key %v holds port %v/%s", name, sp.Name, sp.Protocol))
		}
		key := portKey(name.Namespace, name.Name, name.Port, string(name.Protocol))
		v.Ports[key] = portViewOf(sp)
	}
	return v, problems
}

func portViewOf(sp *proxy.ServicePort) portView {
	pv := portView{
		ClusterIP:           sp.ClusterIP.String(),
		Port:                sp.Port,
		NodePort:            sp.NodePort,
		StickySeconds:       sp.StickyMaxAgeSeconds,
		ExternalLocal:       sp.ExternalPolicyLocal,
		InternalLocal:       sp.InternalPolicyLocal,
		HealthCheckNodePort: sp.HealthCheckNodePort,
		TrafficDistribution: sp.TrafficDistribution,
		UsesCluster:         sp.ClusterEndpoints != nil,
		UsesLocal:           sp.LocalEndpoints != nil,
		HasAny:              sp.HasAnyEndpoints,
	}
	for _, ip := range sp.ExternalIPs {
		pv.ExternalIPs = append(pv.ExternalIPs, ip.String())
	}
	for _, ip := range sp.LoadBalancerIPs {
		pv.LoadBalancerIPs = append(pv.LoadBalancerIPs, ip.String())
	}
	for _, p := range sp.LoadBalancerSourceRanges {
		pv.SourceRanges = append(pv.SourceRanges, p.String())
	}
	for _, e := range sp.Endpoints {
		pv.Endpoints = append(pv.Endpoints, endpointView{
			Addr: e.Addr, Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating, Local: e.IsLocal,
			Node: e.NodeName, Zone: e.Zone, ZoneHints: slices.Clone(e.ZoneHints()), NodeHints: slices.Clone(e.NodeHints()),
		})
	}
	for _, e := range sp.ClusterEndpoints {
		pv.Cluster = append(pv.Cluster, e.Addr)
	}
	for _, e := range sp.LocalEndpoints {
		pv.Local = append(pv.Local, e.Addr)
	}
	return pv
}

// diffViews returns a readable difference between the expected and the observed view ("" when equal).
// nil and empty lists are the same; everything else, order included, must match.
func diffViews(want, got familyView) string {
	return cmp.Diff(want, got, cmpopts.EquateEmpty())
}

// summarize shortens a long diff for a failure message.
func summarize(diff string, maxLines int) string {
	lines := strings.Split(diff, "\n")
	if len(lines) <= maxLines {
		return diff
	}
	return strings.Join(lines[:maxLines], "\n") + fmt.Sprintf("\n... (%d more lines)", len(lines)-maxLines)
}
