package rules

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/conntrack"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/nftables"
	"kube-proxy/rules/userspace/engine"
	"kube-proxy/rules/xtables"
)

// New builds the dataplanes for cfg.Mode, one per IP family the node can program, primary family first.
// Once every family has been synced, what the other modes left on the node is removed (theirs or
// upstream's): mode nftables removes the iptables, IPVS and userspace rules, modes iptables and ipvs the
// nftables tables and mode userspace's capture chains, mode userspace the other three modes' rules.
// Upstream removes them before its first sync; waiting for ours means Services keep working through a
// switch (the first NAT rule a connection meets wins, so both sets of rules may coexist).
//
// sockets (nil: none) is the service manager's store of listening sockets: mode userspace's proxy engines
// take up the listeners an earlier process stored there and store the ones they open; after the first
// sync of every family, in any mode, what no one took is released.
//
// On reg go the mode's metrics, as upstream registers them per mode, and kubernetes_feature_enabled, which
// upstream's feature gate registers in every mode.
func New(ctx context.Context, cfg *config.KubeProxyConfiguration, nodeName string, reg prometheus.Registerer, sockets Sockets) ([]proxy.FamilyDataplane, error) {
	proxy.RegisterFeatureGates(reg, cfg)
	if err := conntrack.SetSysctls(cfg.Conntrack); err != nil {
		klog.ErrorS(err, "Could not apply the conntrack settings; continuing with the kernel's")
	}
	var (
		dps    []proxy.FamilyDataplane
		err    error
		others = func(ctx context.Context) error { return errors.Join(nftables.Cleanup(ctx), cleanupUserspace(ctx)) }
		what   = "nftables and userspace modes' rules"
	)
	switch cfg.Mode {
	case config.ModeIPTables, "":
		dps, err = newIPTables(ctx, cfg, reg)
	case config.ModeIPVS:
		dps, err = newIPVS(ctx, cfg, nodeName, reg)
	case config.ModeNFTables:
		dps, err = newNFTables(cfg, reg)
		others = func(ctx context.Context) error { return errors.Join(cleanupXtables(ctx), cleanupUserspace(ctx)) }
		what = "iptables, IPVS and userspace modes' rules"
	case config.ModeUserspace:
		var es engine.Sockets
		if sockets != nil {
			es = sockets
		}
		dps, err = newUserspace(ctx, cfg, nodeName, reg, es)
		others = func(ctx context.Context) error { return errors.Join(cleanupXtables(ctx), nftables.Cleanup(ctx)) }
		what = "iptables, IPVS and nftables modes' rules"
	default:
		return nil, fmt.Errorf("mode %q is not supported by this kube-proxy (use iptables, ipvs, nftables or userspace)", cfg.Mode)
	}
	if err != nil {
		return nil, err
	}
	if sockets != nil {
		clean := others
		others = func(ctx context.Context) error {
			sockets.ReleaseUnclaimed()
			return clean(ctx)
		}
	}
	return afterFirstSync(ctx, dps, what, others), nil
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
	return errors.Join(cleanupXtables(ctx), nftables.Cleanup(ctx), cleanupUserspace(ctx))
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
	for _, backend := range []xtables.Backend{xtables.BackendNFT, xtables.BackendLegacy} {
		for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			// Mode iptables always has rules in nat; probing a legacy table that does not exist would create it.
			if !xtables.HasTable(backend, family, "nat") {
				klog.V(2).InfoS("Nothing to clean", "backend", backend, "ipFamily", family, "reason", "no nat table")
				continue
			}
			runner, err := xtables.UsableRunner(backend, family)
			if err != nil {
				klog.V(2).InfoS("Nothing to clean", "backend", backend, "ipFamily", family, "reason", err.Error())
				continue
			}
			if err := iptables.Cleanup(ctx, runner); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", backend, family, err))
				continue
			}
			klog.InfoS("Removed iptables-mode rules", "backend", backend, "ipFamily", family)
		}
	}
	return errors.Join(errs...)
}
