package inspect

import (
	"maps"
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/proxy/proxytest"
	"kube-proxy/rules"
	"kube-proxy/rules/iptables"
)

// TestInspectorsCoverEveryMode: inspect knows exactly the modes the daemon builds, so a new mode cannot
// be left out of diff, doctor and trace.
func TestInspectorsCoverEveryMode(t *testing.T) {
	got := slices.Sorted(maps.Keys(inspectors))
	if want := rules.Modes(); !slices.Equal(got, want) {
		t.Fatalf("inspect's modes %q, the daemon's %q", got, want)
	}
	for m, ins := range inspectors {
		if ins.render == nil || ins.prereqs == nil {
			t.Errorf("mode %s: no render or no prerequisites", m)
		}
	}
}

// TestPrereqsForDefault: an empty mode (iptables, the default) and a mode this kube-proxy does not run
// get mode iptables' checks, as doctor always gave them; the others their own.
func TestPrereqsForDefault(t *testing.T) {
	ptr := func(f func(*config.KubeProxyConfiguration) []Finding) uintptr { return reflect.ValueOf(f).Pointer() }
	ipt := ptr(inspectors[config.ModeIPTables].prereqs)
	for _, m := range []config.ProxyMode{"", config.ModeKernelspace, "bogus", config.ModeIPTables, config.ModeUserspace} {
		if got := ptr(prereqsFor(m)); got != ipt {
			t.Errorf("mode %q: not mode iptables' prerequisites", m)
		}
	}
	for _, m := range []config.ProxyMode{config.ModeIPVS, config.ModeNFTables} {
		if ptr(prereqsFor(m)) == ipt {
			t.Errorf("mode %q: mode iptables' prerequisites, not its own", m)
		}
	}
}

// TestRenderDesiredRefuses: modes diff cannot render keep their messages.
func TestRenderDesiredRefuses(t *testing.T) {
	snap := proxytest.Snapshot(v1.IPv4Protocol, proxy.Node{Name: proxytest.NodeName, Known: true})
	for mode, want := range map[config.ProxyMode]string{
		config.ModeUserspace:   "diff cannot render mode userspace: its rules name the listener ports the running daemon chose; `kube-proxy trace` checks them",
		config.ModeKernelspace: "diff does not render mode kernelspace",
	} {
		cfg := config.Default()
		cfg.Mode = mode
		if _, err := RenderDesired(cfg, []*proxy.Snapshot{snap}, nil, iptables.NFAcct{}); err == nil || err.Error() != want {
			t.Errorf("mode %s: error %v, want %q", mode, err, want)
		}
	}
}
