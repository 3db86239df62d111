package userspace

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/rules/engine"
	"kube-proxy/rules/internal/tracecases"
	"kube-proxy/rules/iptables/iptrace"
)

// jumpPayload writes JumpRules as the dataplane ensures them: each inserted at the top of its chain.
func jumpPayload() []byte {
	var b strings.Builder
	for _, table := range []string{"filter", "nat"} {
		b.WriteString("*" + table + "\n")
		for _, j := range JumpRules() {
			if j.Table != table {
				continue
			}
			b.WriteString("-I " + j.Chain + " 1")
			for _, a := range j.RuleSpec() {
				if strings.Contains(a, " ") {
					a = `"` + a + `"`
				}
				b.WriteString(" " + a)
			}
			b.WriteString("\n")
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}

// TestTraceCases runs the table of truth every mode shares (rules/internal/tracecases) through mode
// userspace's capture rules, with iptrace: a packet REDIRECTed to a listener reaches that listener's
// endpoints (the engine then picks one; its choice is tested in package engine). The expectations are
// mode iptables' with three differences by design, checked here rather than ignored:
//   - masquerading: the engine always connects from the node, so every endpoint sees the node; the rules
//     masquerade nothing, which the trace shows;
//   - SCTP is not proxied: its Service addresses are left alone;
//   - session affinity lives in the engine, not in the rules: a known client's packet reaches the
//     listener of all endpoints.
func TestTraceCases(t *testing.T) {
	snap := tracecases.Snapshot()
	c := config.Default()
	c.Mode, c.ClusterCIDR = config.ModeUserspace, tracecases.ClusterCIDR
	cfg, err := ConfigFrom(c, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	ports := fakePorts(snap)
	targets := Targets(snap)
	byPort := map[uint16]engine.Target{}
	for k, p := range ports {
		byPort[p] = targets[k]
	}
	ts := iptrace.New(false)
	if err := ts.Restore(Render(cfg, snap, func(k engine.Key) uint16 { return ports[k] }), iptrace.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatalf("payload: %v", err)
	}
	if err := ts.Restore(jumpPayload(), iptrace.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatalf("jump rules: %v", err)
	}
	local := []netip.Addr{netip.MustParseAddr(tracecases.NodeIP)}
	for _, tc := range tracecases.Cases() {
		want := tc.Want
		if d, ok := tc.Differ[tracecases.IPTables]; ok {
			want = d.Want
		}
		switch {
		case tc.Proto == "sctp":
			want = tracecases.Untouched
		case tc.From.StickyTo != "":
			want = tracecases.Reach(false, tracecases.LocalEP, tracecases.RemoteEP)
		}
		want.Masq = false
		t.Run(fmt.Sprintf("%s->%s/%s", tc.From.Name, tc.Dst, tc.Proto), func(t *testing.T) {
			dst := netip.MustParseAddrPort(tc.Dst)
			res, err := ts.Trace(iptrace.Packet{Src: tc.From.Src, Dst: dst.Addr(), DPort: dst.Port(), Protocol: tc.Proto,
				InIface: tc.From.In, Local: tc.From.In == "", LocalAddrs: local})
			if err != nil {
				t.Fatal(err)
			}
			masq, _ := res.Masquerade()
			got := tracecases.Outcome{Masq: masq, Verdicts: res.Verdicts()}
			for _, e := range res.Endpoints() {
				to := netip.MustParseAddrPort(e)
				target, ok := byPort[to.Port()]
				if !ok || !(to.Addr().IsLoopback() || local[0] == to.Addr()) {
					t.Fatalf("redirected to %s, which is no listener of the node:\n%s", e, res)
				}
				for _, ep := range target.Endpoints {
					got.Endpoints = append(got.Endpoints, ep.String())
				}
			}
			slices.Sort(got.Endpoints)
			got.Endpoints = slices.Compact(got.Endpoints)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\ntrace:\n%s", diff, res)
			}
		})
	}
}
