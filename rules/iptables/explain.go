package iptables

import (
	"fmt"
	"regexp"
	"strings"

	"kube-proxy/rules/internal/traceresult"
)

// The endings of the comments of the rules that match a Service port's destinations, after the port's
// name: "ns/name:port cluster IP".
const (
	commentClusterIP      = " cluster IP"
	commentExternalIP     = " external IP"
	commentLoadBalancerIP = " loadbalancer IP"
)

// The endings of the comments of the filter rules that stop a Service port's packets, after the port's
// name: "ns/name:port has no endpoints", "ns/name:port traffic not accepted by KUBE-FW-...".
const (
	commentNoEndpoints      = " has no endpoints"
	commentNoLocalEndpoints = " has no local endpoints"
	commentNotAccepted      = " traffic not accepted by "
)

// serviceCommentRE matches the Service port name ("ns/name" or "ns/name:port", svcState.name) that the
// comments of a Service port's rules begin with: "ns/name:port cluster IP", "ns/name:port -> IP:PORT",
// "ns/name:port has no endpoints", or the name alone.
var serviceCommentRE = regexp.MustCompile(`^([a-z0-9.-]+/[a-z0-9.-]+(?::[a-z0-9-]+)?)`)

// ServiceOfComment returns the Service port a rule's comment names at its start, as the renderer writes
// the comments of a Service port's rules; "" when it names none (the shared rules' comments, such as
// "kubernetes service portals").
func ServiceOfComment(comment string) string {
	if m := serviceCommentRE.FindStringSubmatch(comment); m != nil {
		return m[1]
	}
	return ""
}

// ClusterIPRuleService returns the Service port whose cluster IP a rule matches, from the rule's comment
// ("ns/name:port cluster IP"), and whether the comment is of that kind.
func ClusterIPRuleService(comment string) (string, bool) {
	return strings.CutSuffix(comment, commentClusterIP)
}

// DestinationComment reports whether a rule's comment is that of a rule matching a Service's destination:
// a cluster IP, an external IP, a load balancer IP, or node ports (a comment naming "nodeport", as that of
// KUBE-SERVICES' jump to KUBE-NODEPORTS).
func DestinationComment(comment string) bool {
	return strings.HasSuffix(comment, commentClusterIP) || strings.HasSuffix(comment, commentExternalIP) ||
		strings.HasSuffix(comment, commentLoadBalancerIP) || strings.Contains(comment, "nodeport")
}

// AffinityHit reports whether rule (as iptables-save prints it) is a session affinity check of a
// Service's chain: its recent list's --rcheck, which matches a client sent to that endpoint before.
func AffinityHit(rule string) bool { return strings.Contains(rule, "--rcheck") }

// ExplainStop says why mode iptables' filter rule stopped a packet, from what the renderer writes there;
// "" when the rule is none of those (another mode's).
func ExplainStop(s traceresult.Stop) string {
	if s.Table != "filter" {
		return ""
	}
	switch s.Chain {
	case chainServices, chainExternalServices:
		// A Service port's own drop or reject, named by its comment's ending.
		switch {
		case strings.HasSuffix(s.Comment, commentNoEndpoints):
			return "the Service has no ready endpoints"
		case strings.HasSuffix(s.Comment, commentNoLocalEndpoints):
			return "the Service's traffic policy is Local and no endpoint of it runs on this node"
		}
	case chainProxyFirewall:
		if strings.Contains(s.Comment, commentNotAccepted) {
			return "the source address is not in the Service's loadBalancerSourceRanges"
		}
	case chainForward:
		if s.Verdict == "DROP" { // the only DROP there
			return "conntrack considers the packet INVALID"
		}
	case chainKubeletFirewall:
		return fmt.Sprintf("%s is a loopback address, but the packet comes from elsewhere: with route_localnet on (for NodePorts on localhost), this rule keeps the network out", s.Dst)
	}
	return ""
}
