package rules

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kube-proxy/config"
)

// TestModesRemoveTheOthers: every mode removes, once ready, the rules of the modes that write another kind
// (upstream's rule between nftables and iptables/ipvs, and mode userspace's capture chains), never its own.
func TestModesRemoveTheOthers(t *testing.T) {
	want := map[config.ProxyMode][]*ruleKind{
		config.ModeIPTables:  {nftablesRules, userspaceRules},
		config.ModeIPVS:      {nftablesRules, userspaceRules},
		config.ModeNFTables:  {xtablesRules, userspaceRules},
		config.ModeUserspace: {xtablesRules, nftablesRules},
	}
	if len(modes) != len(want) {
		t.Errorf("%d modes registered, want %d", len(modes), len(want))
	}
	for mode, w := range want {
		spec, ok := modes[mode]
		if !ok {
			t.Errorf("mode %s is not registered", mode)
			continue
		}
		if got := spec.others(); !slices.Equal(got, w) {
			t.Errorf("mode %s removes %s, want %s", mode, kindNames(got), kindNames(w))
		}
	}
}

// TestNewRefusesUnknownModes: a mode without a registry entry (Windows' kernelspace) is an error naming it,
// before anything touches the kernel.
func TestNewRefusesUnknownModes(t *testing.T) {
	cfg := &config.KubeProxyConfiguration{Mode: config.ModeKernelspace}
	_, err := New(context.Background(), cfg, "node", prometheus.NewRegistry(), nil)
	if err == nil || !strings.Contains(err.Error(), `mode "kernelspace" is not supported`) {
		t.Fatalf("New(kernelspace) = %v, want an error naming the mode", err)
	}
}

func kindNames(kinds []*ruleKind) []string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.name
	}
	return names
}
