package iptables

import (
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
	"kube-proxy/rules/internal/traceresult"
)

func TestServiceOfComment(t *testing.T) {
	named := proxy.ServicePortName{NamespacedName: nn("web"), Port: "http", Protocol: v1.ProtocolTCP}
	st := newSvcState(named)
	for comment, want := range map[string]string{
		st.name + " cluster IP":                    "default/web:http",
		st.name + " -> 10.244.1.2:8080":            "default/web:http",
		"other traffic to " + st.name + " will be": "",
		"kube-system/dns.v2":                       "kube-system/dns.v2",
		"kubernetes service portals":               "",
		"":                                         "",
	} {
		if got := ServiceOfComment(comment); got != want {
			t.Errorf("ServiceOfComment(%q) = %q, want %q", comment, got, want)
		}
	}
}

// TestDestinationComments: in what the renderer writes, KUBE-SERVICES' rules for a Service's cluster IP,
// external IP and load balancer IP and its jump to KUBE-NODEPORTS have destination comments, only the
// cluster IP's names its Service port as a ClusterIP rule, and the endpoints' rules have neither.
func TestDestinationComments(t *testing.T) {
	snap := proxytest.Snapshot(v1.IPv4Protocol, v4Node("10.0.0.1"),
		proxytest.Port("default/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, proxytest.NodePort(30080),
			proxytest.ExternalIPs("192.0.2.10"), proxytest.LoadBalancerIPs("192.0.2.20"), proxytest.Endpoints("10.244.1.2:8080")))
	payload := string(mustRender(t, NewRenderer(testConfig(v1.IPv4Protocol, clusterCIDR("10.244.0.0/16"))), snap, nil, true))
	commentRE := regexp.MustCompile(`--comment (?:"([^"]*)"|(\S+))`) // quoted, or one word
	seen := map[string]bool{}
	for _, line := range strings.Split(payload, "\n") {
		m, f := commentRE.FindStringSubmatch(line), strings.Fields(line)
		if m == nil || len(f) < 2 {
			continue
		}
		m[1] += m[2]
		chain, dst := f[1], ""
		if i := slices.Index(f, "-d"); i > 0 {
			dst = f[i+1]
		}
		svc, isClusterIP := ClusterIPRuleService(m[1])
		switch {
		case chain == chainServices && slices.Contains([]string{"10.96.0.10", "192.0.2.10", "192.0.2.20"}, dst):
			seen[dst] = true
			if !DestinationComment(m[1]) || isClusterIP != (dst == "10.96.0.10") || isClusterIP && svc != "default/web:http" {
				t.Errorf("%s: DestinationComment %v, ClusterIPRuleService %q, %v", line, DestinationComment(m[1]), svc, isClusterIP)
			}
		case chain == chainServices && f[len(f)-1] == chainNodePorts:
			seen[chainNodePorts] = true
			if !DestinationComment(m[1]) || isClusterIP {
				t.Errorf("%s: DestinationComment false, or a ClusterIP rule", line)
			}
		case strings.HasPrefix(chain, PrefixEndpoint):
			seen[PrefixEndpoint] = true
			if DestinationComment(m[1]) || isClusterIP {
				t.Errorf("%s: an endpoint's rule with a destination comment", line)
			}
		}
	}
	if len(seen) != 5 {
		t.Errorf("found the rules of %v; want the three addresses', the node ports' jump and the endpoint's", seen)
	}
}

// TestAffinityHit: of a Service's rules with session affinity, the KUBE-SVC chain's checks of the
// endpoints' recent lists are affinity hits, and the KUBE-SEP chain's recording of the client is not.
func TestAffinityHit(t *testing.T) {
	snap := proxytest.Snapshot(v1.IPv4Protocol, v4Node("10.0.0.1"),
		proxytest.Port("default/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, proxytest.Affinity(10800),
			proxytest.Endpoints("10.244.1.2:8080", "10.244.1.3:8080")))
	payload := string(mustRender(t, NewRenderer(testConfig(v1.IPv4Protocol, clusterCIDR("10.244.0.0/16"))), snap, nil, true))
	hits, recorded := 0, 0
	for _, line := range strings.Split(payload, "\n") {
		switch {
		case !strings.Contains(line, "-m recent"):
			if AffinityHit(line) {
				t.Errorf("AffinityHit(%s) without a recent list", line)
			}
		case strings.HasPrefix(line, "-A "+PrefixService):
			hits++
			if !AffinityHit(line) {
				t.Errorf("AffinityHit(%s) = false", line)
			}
		case strings.HasPrefix(line, "-A "+PrefixEndpoint):
			recorded++
			if AffinityHit(line) {
				t.Errorf("AffinityHit(%s) = true for recording the client", line)
			}
		}
	}
	if hits != 2 || recorded != 2 {
		t.Errorf("%d affinity checks and %d recordings, want 2 and 2", hits, recorded)
	}
}

// TestExplainStopCoversEveryStop: every rule of the filter table that drops or rejects, in what the
// renderer writes for Services of every kind of stop, is explained by ExplainStop; none of the nat table.
func TestExplainStopCoversEveryStop(t *testing.T) {
	snap := proxytest.Snapshot(v1.IPv4Protocol, v4Node("10.0.0.1"),
		proxytest.Port("default/empty", "http", v1.ProtocolTCP, "10.96.0.10", 80, proxytest.NodePort(30080), proxytest.ExternalIPs("192.0.2.10")),
		proxytest.Port("default/remote", "", v1.ProtocolTCP, "10.96.0.11", 80, proxytest.NodePort(30081), proxytest.ExternalLocal(31081),
			proxytest.InternalLocal, proxytest.Endpoints("10.244.2.6:8080")),
		proxytest.Port("default/fw", "", v1.ProtocolTCP, "10.96.0.12", 80, proxytest.LoadBalancerIPs("192.0.2.20"),
			proxytest.SourceRanges("198.51.100.0/24"), proxytest.Endpoints("10.244.1.2:8080")))
	cfg := configFrom(func(*config.KubeProxyConfiguration) {})
	payload := string(mustRender(t, NewRenderer(cfg), snap, nil, true))
	commentRE := regexp.MustCompile(`--comment (?:"([^"]*)"|(\S+))`)
	table, stops := "", map[string]int{}
	for _, line := range strings.Split(payload, "\n") {
		if t, ok := strings.CutPrefix(line, "*"); ok {
			table = t
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" || !strings.Contains(line, "-j DROP") && !strings.Contains(line, "-j REJECT") {
			continue
		}
		s := traceresult.Stop{Table: table, Chain: f[1], Rule: line, Verdict: "DROP", Dst: netip.MustParseAddr("127.0.0.1"), Protocol: "tcp", Port: 80}
		if strings.Contains(line, "-j REJECT") {
			s.Verdict = "REJECT"
		}
		if m := commentRE.FindStringSubmatch(line); m != nil {
			s.Comment = m[1] + m[2]
		}
		why := ExplainStop(s)
		if table == "filter" && why == "" || table != "filter" && why != "" {
			t.Errorf("%s: %s explained as %q", table, line, why)
		}
		stops[s.Chain]++
	}
	// KUBE-SERVICES: the empty Service's ClusterIP, the remote-only one's. KUBE-EXTERNAL-SERVICES: the
	// empty one's NodePort and externalIP, the remote-only one's NodePort. The firewall's load balancer
	// IP, the ctstate INVALID drop and the localhost anti-martian rule.
	want := map[string]int{chainServices: 2, chainExternalServices: 3, chainProxyFirewall: 1, chainForward: 1, chainKubeletFirewall: 1}
	if !maps.Equal(stops, want) {
		t.Errorf("stops per chain %v, want %v:\n%s", stops, want, payload)
	}
}
