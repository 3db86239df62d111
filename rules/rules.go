package rules

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/conntrack"
	"kube-proxy/rules/engine"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/nftables"
	"kube-proxy/rules/xtables"
)

// modeSpec is what rules knows of one mode: how it is built, and which kind of rules it writes.
type modeSpec struct {
	// build sets the mode up: one dataplane per IP family the node can program, primary family first.
	build func(ctx context.Context, cfg *config.KubeProxyConfiguration, nodeName string, reg prometheus.Registerer, sockets engine.Sockets) ([]proxy.FamilyDataplane, error)
	// writes is the kind of rules the mode writes, which the other modes remove.
	writes *ruleKind
}

// modes is every mode this kube-proxy runs. rules.New, Cleanup and the removal of the other modes' rules
// use it; nothing else in this package names a mode.
var modes = map[config.ProxyMode]modeSpec{
	config.ModeIPTables:  {build: newIPTables, writes: xtablesRules},
	config.ModeIPVS:      {build: newIPVS, writes: xtablesRules},
	config.ModeNFTables:  {build: newNFTables, writes: nftablesRules},
	config.ModeUserspace: {build: newUserspace, writes: userspaceRules},
}

// Modes lists the modes this kube-proxy runs, sorted by name: the keys of its registry, for the other
// per-mode tables (rules/inspect's) to check themselves against.
func Modes() []config.ProxyMode {
	return slices.Sorted(maps.Keys(modes))
}

// The kinds of rules the modes write. Modes iptables and ipvs share one: neither removes the other's
// after its first sync (as upstream, which cleans up only between nftables and the other two).
var (
	xtablesRules   = &ruleKind{name: "iptables, IPVS", cleanup: cleanupXtables}
	nftablesRules  = &ruleKind{name: "nftables", cleanup: nftables.Cleanup}
	userspaceRules = &ruleKind{name: "userspace", cleanup: cleanupUserspace}
)

// ruleKind is a kind of rules and the cleanup that removes them from every backend and family.
type ruleKind struct {
	name    string // for the log
	cleanup func(ctx context.Context) error
}

// ruleKinds lists the kinds of rules in the order Cleanup removes them.
var ruleKinds = []*ruleKind{xtablesRules, nftablesRules, userspaceRules}

// Mode is the configured mode, built for every IP family the node can program.
type Mode struct {
	// Dataplanes holds one dataplane per family, primary family first.
	Dataplanes []proxy.FamilyDataplane
	// others are the kinds of rules the other modes write.
	others  []*ruleKind
	sockets Sockets
}

// New builds the dataplanes for cfg.Mode, one per IP family the node can program, primary family first.
//
// sockets (nil: none) is the service manager's store of listening sockets: mode userspace's proxy engines
// take up the listeners an earlier process stored there and store the ones they open.
//
// On reg go the mode's metrics, as upstream registers them per mode.
func New(ctx context.Context, cfg *config.KubeProxyConfiguration, nodeName string, reg prometheus.Registerer, sockets Sockets) (*Mode, error) {
	spec, ok := modes[cfg.EffectiveMode()]
	if !ok {
		return nil, fmt.Errorf("mode %q is not supported by this kube-proxy (use iptables, ipvs, nftables or userspace)", cfg.Mode)
	}
	if err := conntrack.SetSysctls(cfg.Conntrack); err != nil {
		klog.ErrorS(err, "Could not apply the conntrack settings; continuing with the kernel's")
	}
	var es engine.Sockets
	if sockets != nil {
		es = sockets
	}
	dps, err := spec.build(ctx, cfg, nodeName, reg, es)
	if err != nil {
		return nil, err
	}
	return &Mode{Dataplanes: dps, others: spec.others(), sockets: sockets}, nil
}

// others returns the kinds of rules the mode does not write, which it removes once it is ready.
func (s modeSpec) others() []*ruleKind {
	var out []*ruleKind
	for _, k := range ruleKinds {
		if k != s.writes {
			out = append(out, k)
		}
	}
	return out
}

// AfterReady removes what the other modes left on the node (theirs or upstream's), and releases the stored
// sockets no one took; call it once every family has synced (proxy.Proxy.Ready). Mode nftables removes the
// iptables, IPVS and userspace rules, modes iptables and ipvs the nftables tables and mode userspace's
// capture chains, mode userspace the other three modes' rules. Upstream removes them before its first
// sync; waiting for ours means Services keep working through a switch (the first NAT rule a connection
// meets wins, so both sets of rules may coexist).
func (m *Mode) AfterReady(ctx context.Context) {
	if m.sockets != nil {
		m.sockets.ReleaseUnclaimed()
	}
	start := time.Now()
	names := make([]string, len(m.others))
	var errs []error
	for i, k := range m.others {
		names[i] = k.name
		errs = append(errs, k.cleanup(ctx))
	}
	what := strings.Join(names, " and ") + " modes' rules"
	if err := errors.Join(errs...); err != nil {
		klog.ErrorS(err, "Could not remove what other modes left", "what", what)
		return
	}
	klog.V(2).InfoS("Removed what other modes left, if anything", "what", what, "elapsed", time.Since(start))
}

// Sockets is the service manager's store of listening sockets (systemd.FDStore).
type Sockets interface {
	engine.Sockets
	// ReleaseUnclaimed drops from the store, and closes, what an earlier process stored and no one took.
	ReleaseUnclaimed() []string
}

// Cleanup removes every chain, rule, IPVS service, ipset, dummy link and nftables table this daemon or
// upstream kube-proxy created, in every iptables backend and IP family present.
func Cleanup(ctx context.Context) error {
	var errs []error
	for _, k := range ruleKinds {
		errs = append(errs, k.cleanup(ctx))
	}
	return errors.Join(errs...)
}

// cleanupXtables removes what modes iptables and ipvs write: iptables rules in both backends and
// families, IPVS services, ipsets and the dummy link.
func cleanupXtables(ctx context.Context) error {
	var errs []error
	// Mode ipvs first: its chains jump to KUBE-MARK-MASQ, which mode iptables' cleanup deletes (and the
	// IPVS cleanup leaves a chain still in use for it).
	if err := ipvs.Cleanup(ctx); err != nil {
		errs = append(errs, fmt.Errorf("ipvs: %w", err))
	}
	// Mode iptables always has rules in nat.
	skipped := func(backend xtables.Backend, family v1.IPFamily, why string) {
		klog.V(2).InfoS("Nothing to clean", "backend", backend, "ipFamily", family, "reason", why)
	}
	for _, runner := range xtables.RunnersWithNAT(skipped) {
		if err := iptables.Cleanup(ctx, runner); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", runner.Backend, runner.Family, err))
			continue
		}
		klog.InfoS("Removed iptables-mode rules", "backend", runner.Backend, "ipFamily", runner.Family)
	}
	return errors.Join(errs...)
}
