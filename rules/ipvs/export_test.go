package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRenderDesiredIsTheDataplanes: what kube-proxy diff compares with the kernel is what the planner plans and
// the renderer writes, for every golden case.
func TestRenderDesiredIsTheDataplanes(t *testing.T) {
	for _, c := range renderCases() {
		t.Run(c.name, func(t *testing.T) {
			var addrs []netip.Addr
			for _, a := range c.addrs {
				addrs = append(addrs, netip.MustParseAddr(a))
			}
			got := RenderDesired(c.cfg, c.snap, addrs)
			d := &Dataplane{cfg: c.cfg}
			d.en = newEnv(&d.cfg, &c.snap.Node, addrs)
			want := stateOf(&d.cfg, d.render(c.snap))

			var vs []string
			for _, v := range got.VirtualServers {
				line := v.Key + " " + v.Scheduler
				if v.Timeout > 0 {
					line += fmt.Sprintf(" persistent %d", v.Timeout)
				}
				if v.Flags != 0 {
					line += fmt.Sprintf(" flags %#x", v.Flags)
				}
				vs = append(vs, line)
				for _, r := range v.Reals {
					vs = append(vs, "  -> "+r+" weight 1")
				}
			}
			if diff := cmp.Diff(want.vs, vs); diff != "" {
				t.Errorf("virtual servers (-dataplane +RenderDesired):\n%s", diff)
			}
			var binds []string
			for _, a := range got.Binds {
				binds = append(binds, a.String())
			}
			if diff := cmp.Diff(want.binds, binds); diff != "" {
				t.Errorf("binds (-dataplane +RenderDesired):\n%s", diff)
			}
			sets := map[string][]string{}
			for _, s := range got.Sets {
				if len(s.Members) > 0 {
					sets[s.Name] = s.Members
				}
			}
			for n := range want.sets {
				slices.Sort(want.sets[n])
			}
			if diff := cmp.Diff(want.sets, sets); diff != "" {
				t.Errorf("sets (-dataplane +RenderDesired):\n%s", diff)
			}
			if !strings.Contains(renderCaseText(c), "# iptables-restore\n"+string(got.Rules)) {
				t.Errorf("rules differ from the renderer's:\n%s", got.Rules)
			}
			if !strings.Contains(string(got.Jumps), "-I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES") {
				t.Errorf("jumps lack PREROUTING's:\n%s", got.Jumps)
			}
		})
	}
}
