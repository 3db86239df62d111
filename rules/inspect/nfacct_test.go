package inspect

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/xtables"
)

// TestDiffIPTablesNFAcct: on a node where the daemon wrote its rules with nfacct counters (a NodePort
// counted on 127.0.0.1, the INVALID drop counted), diff finds no drift when it renders with the counters
// the node has, and names exactly the counted rules when the node has none.
func TestDiffIPTablesNFAcct(t *testing.T) {
	cfg := config.Default()
	cfg.ClusterCIDR = "10.244.0.0/16"
	snap := proxytest.Snapshot(v1.IPv4Protocol, proxy.Node{Name: proxytest.NodeName, Known: true},
		proxytest.Port("ns/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, proxytest.NodePort(30080),
			proxytest.Endpoints("10.244.1.2:8080")))
	all := iptables.NFAcct{InvalidDropped: true, LocalhostNodePorts: true}
	written, err := RenderDesired(cfg, []*proxy.Snapshot{snap}, nil, all)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel's view of what the daemon wrote: iptables-save's text, read back as diff reads it.
	ts := written.XT[v1.IPv4Protocol]
	live, err := loadXTables(xtables.BackendNFT, v1.IPv4Protocol, map[string]string{"nat": ts.Save("nat"), "filter": ts.Save("filter")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(live.Unreadable) > 0 {
		t.Fatalf("diff cannot read the daemon's rules: %q", live.Unreadable)
	}
	for _, tt := range []struct {
		name     string
		counters iptables.NFAcct
		want     []string // the drift's rules, "kind table/chain rule-fragment"
	}{
		{name: "the node's counters", counters: all},
		{name: "no nfacct", counters: iptables.NFAcct{}, want: []string{
			"missing filter/KUBE-FORWARD --ctstate INVALID -j DROP",
			"stale filter/KUBE-FORWARD --nfacct-name  ct_state_invalid_dropped_pkts",
			"stale nat/KUBE-NODEPORTS --nfacct-name  localhost_nps_accepted_pkts",
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want, err := RenderDesired(cfg, []*proxy.Snapshot{snap}, nil, tt.counters)
			if err != nil {
				t.Fatal(err)
			}
			drift := DiffIPTables(want.XT[v1.IPv4Protocol], live)
			var unmatched []string
			for _, d := range drift {
				i := slices.IndexFunc(tt.want, func(w string) bool {
					kind, rest, _ := strings.Cut(w, " ")
					obj, frag, _ := strings.Cut(rest, " ")
					return d.Kind == kind && strings.Contains(d.Object, obj) && strings.Contains(d.Detail, frag)
				})
				if i < 0 {
					unmatched = append(unmatched, d.String())
				}
			}
			if len(unmatched) > 0 || len(drift) != len(tt.want) {
				var all []string
				for _, d := range drift {
					all = append(all, d.String())
				}
				t.Errorf("drift:\n%s\nwant:\n%s", strings.Join(all, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
