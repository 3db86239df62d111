package inspect

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/internal/tracecases"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/iptables/iptrace"
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/xtables"
)

var update = flag.Bool("update", false, "rewrite testdata/reasons.golden")

// TestReasonsOfTheCaseTable traces the table of truth every mode shares (rules/internal/tracecases)
// through what each mode with a renderer writes, as `kube-proxy trace` would, and compares every outcome
// and its reason with testdata/reasons.golden (`go test -run TestReasonsOfTheCaseTable -update` rewrites
// it). Every packet a mode stops must be explained by that mode, never by the catch-all.
func TestReasonsOfTheCaseTable(t *testing.T) {
	snap := tracecases.Snapshot()
	var out strings.Builder
	for _, mode := range []config.ProxyMode{config.ModeIPTables, config.ModeIPVS, config.ModeNFTables} {
		live, err := liveOfCaseTable(mode, snap)
		if err != nil {
			t.Fatalf("mode %s: %v", mode, err)
		}
		fmt.Fprintf(&out, "# mode %s\n", mode)
		for _, c := range tracecases.Cases() {
			if c.From.StickyTo != "" {
				continue // the tracer reads a client's affinity from the kernel: not modelled here
			}
			dst := netip.MustParseAddrPort(c.Dst)
			pkt := Packet{Src: c.From.Src, Dst: dst.Addr(), Protocol: c.Proto, Port: dst.Port(), In: c.From.In, Local: c.From.In == ""}
			if pkt.Local && !pkt.Src.IsLoopback() && slices.Contains(live.localAddrsFor(""), pkt.Dst) {
				pkt.Src = pkt.Dst // the node's own connection to its own address leaves from that address
			}
			walks, err := live.Trace(pkt)
			if err != nil {
				t.Fatalf("mode %s: %s: %v", mode, pkt, err)
			}
			if len(walks) != 1 {
				t.Fatalf("mode %s: %s: %d walks, want 1", mode, pkt, len(walks))
			}
			fmt.Fprintf(&out, "%s (%s)\n", pkt, c.From.Name)
			for _, o := range walks[0].Outcomes {
				if o.Verdict != "ACCEPT" && strings.HasPrefix(o.Reason, catchAllStop) {
					t.Errorf("mode %s: %s: %s by %q explained by the catch-all %q", mode, pkt, o.Verdict, last(o.Rules), o.Reason)
				}
				fmt.Fprintf(&out, "\t%s %s: %s\n", o.Verdict, o.Endpoint, o.Reason)
			}
		}
	}
	const golden = "testdata/reasons.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), out.String()); diff != "" {
		t.Errorf("reasons differ from %s (-want +got; rewrite it with -update when the change is meant):\n%s", golden, diff)
	}
}

func last(rules []string) string {
	if len(rules) == 0 {
		return ""
	}
	return rules[len(rules)-1]
}

// liveOfCaseTable renders snap as mode's daemon would on the case table's node and returns it as the
// live state trace reads: the rules, and for mode ipvs its virtual servers and kube-ipvs0's addresses.
func liveOfCaseTable(mode config.ProxyMode, snap *proxy.Snapshot) (*Live, error) {
	cfg := config.Default()
	cfg.Mode = mode
	cfg.ClusterCIDR = tracecases.ClusterCIDR
	nodeIP := netip.MustParseAddr(tracecases.NodeIP)
	d, err := RenderDesired(cfg, []*proxy.Snapshot{snap}, []netip.Addr{nodeIP}, iptables.NFAcct{})
	if err != nil {
		return nil, err
	}
	live := &Live{Addrs: []netip.Addr{nodeIP}}
	if mode == config.ModeNFTables {
		live.NFT, live.NFTText, live.NFTFamilies = d.NFT, d.NFTText, []v1.IPFamily{v1.IPv4Protocol}
		return live, nil
	}
	ts := d.XT[v1.IPv4Protocol]
	if want := d.IPVS[v1.IPv4Protocol]; want != nil {
		live.Addrs = append(live.Addrs, want.Binds...)
		for _, vs := range want.VirtualServers {
			s, err := tracerServer(vs)
			if err != nil {
				return nil, err
			}
			if err := ts.AddVirtualServer(s); err != nil {
				return nil, err
			}
		}
	}
	x := &XTables{Backend: xtables.BackendNFT, Family: v1.IPv4Protocol, Tables: ts}
	for _, table := range tracedTables {
		x.Chains += len(ts.Chains(table))
	}
	if want := d.IPVS[v1.IPv4Protocol]; want != nil {
		x.VirtualServers = len(want.VirtualServers)
	}
	live.XTables = []*XTables{x}
	return live, nil
}

// tracerServer turns a desired virtual server ("tcp/10.96.0.10:80", reals "ip:port") into the tracer's.
func tracerServer(vs ipvs.DesiredVirtualServer) (iptrace.VirtualServer, error) {
	proto, addr, ok := strings.Cut(vs.Key, "/")
	ap, err := netip.ParseAddrPort(addr)
	if !ok || err != nil {
		return iptrace.VirtualServer{}, fmt.Errorf("virtual server key %q", vs.Key)
	}
	out := iptrace.VirtualServer{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto, Persistent: vs.Timeout > 0}
	for _, r := range vs.Reals {
		rp, err := netip.ParseAddrPort(r)
		if err != nil {
			return out, fmt.Errorf("real server %q of %s", r, vs.Key)
		}
		out.Reals = append(out.Reals, iptrace.RealServer{Addr: rp, Weight: 1})
	}
	return out, nil
}

// TestServiceFromRules: with the API out of reach, trace finds a Service port's cluster IP in the rules
// of modes iptables and nftables (an internalTrafficPolicy Local one's too), and lists the Service
// addresses near a packet that met no Service rule.
func TestServiceFromRules(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	snap := tracecases.Snapshot()
	env := &Env{Config: config.Default()}
	for _, mode := range []config.ProxyMode{config.ModeIPTables, config.ModeNFTables} {
		live, err := liveOfCaseTable(mode, snap)
		if err != nil {
			t.Fatal(err)
		}
		for ref, want := range map[string]string{"t/cluster": "tcp 10.96.1.1:80", "t/itp": "udp 10.96.1.5:53", "t/local": "tcp 10.96.1.3:80"} {
			addr, port, proto, err := resolveService(context.Background(), env, live, ref)
			if got := fmt.Sprintf("%s %s", proto, netip.AddrPortFrom(addr, port)); err != nil || got != want {
				t.Errorf("mode %s: %s resolved to %s (%v), want %s", mode, ref, got, err, want)
			}
		}
		if _, _, _, err := resolveService(context.Background(), env, live, "t/none"); err == nil {
			t.Errorf("mode %s: a Service without rules resolved", mode)
		}
		walks, err := live.Trace(Packet{Src: tracecases.FromPod.Src, Dst: netip.MustParseAddr("10.96.1.1"), Protocol: "tcp", Port: 81, In: "veth7"})
		if err != nil {
			t.Fatal(err)
		}
		if mode == config.ModeNFTables {
			continue // rejected (cluster-ips-check): nothing to list
		}
		if n := walks[0].Nearest; len(n) == 0 || !strings.HasPrefix(n[0], "tcp 10.96.1.1:80 (t/cluster cluster IP)") {
			t.Errorf("mode %s: nearest %q", mode, n)
		}
	}
	live, err := liveOfCaseTable(config.ModeNFTables, snap)
	if err != nil {
		t.Fatal(err)
	}
	n := nearestNFT(live, Packet{Dst: netip.MustParseAddr("10.96.1.1"), Protocol: "tcp", Port: 81})
	if len(n) != 1 || !strings.HasPrefix(n[0], "tcp 10.96.1.1:80 (service-") {
		t.Errorf("nearest in mode nftables %q", n)
	}
}
