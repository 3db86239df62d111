package rules

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// Mode is the configured mode, built for every IP family the node can program.
type Mode struct {
	// Dataplanes holds one dataplane per family, primary family first.
	Dataplanes []proxy.FamilyDataplane
	// what names what cleanOthers removes, for the log.
	what        string
	cleanOthers func(ctx context.Context) error
	sockets     Sockets
}

// New builds the dataplanes for cfg.Mode, one per IP family the node can program, primary family first.
//
// sockets (nil: none) is the service manager's store of listening sockets: mode userspace's proxy engines
// take up the listeners an earlier process stored there and store the ones they open.
//
// On reg go the mode's metrics, as upstream registers them per mode, and kubernetes_feature_enabled, which
// upstream's feature gate registers in every mode.
func New(ctx context.Context, cfg *config.KubeProxyConfiguration, nodeName string, reg prometheus.Registerer, sockets Sockets) (*Mode, error) {
	proxy.RegisterFeatureGates(reg, cfg)
	if err := conntrack.SetSysctls(cfg.Conntrack); err != nil {
		klog.ErrorS(err, "Could not apply the conntrack settings; continuing with the kernel's")
	}
	m := &Mode{
		cleanOthers: func(ctx context.Context) error { return errors.Join(nftables.Cleanup(ctx), cleanupUserspace(ctx)) },
		what:        "nftables and userspace modes' rules",
		sockets:     sockets,
	}
	var err error
	switch cfg.EffectiveMode() {
	case config.ModeIPTables:
		m.Dataplanes, err = newIPTables(ctx, cfg, reg)
	case config.ModeIPVS:
		m.Dataplanes, err = newIPVS(ctx, cfg, nodeName, reg)
	case config.ModeNFTables:
		m.Dataplanes, err = newNFTables(cfg, reg)
		m.cleanOthers = func(ctx context.Context) error { return errors.Join(cleanupXtables(ctx), cleanupUserspace(ctx)) }
		m.what = "iptables, IPVS and userspace modes' rules"
	case config.ModeUserspace:
		var es engine.Sockets
		if sockets != nil {
			es = sockets
		}
		m.Dataplanes, err = newUserspace(ctx, cfg, nodeName, reg, es)
		m.cleanOthers = func(ctx context.Context) error { return errors.Join(cleanupXtables(ctx), nftables.Cleanup(ctx)) }
		m.what = "iptables, IPVS and nftables modes' rules"
	default:
		return nil, fmt.Errorf("mode %q is not supported by this kube-proxy (use iptables, ipvs, nftables or userspace)", cfg.Mode)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
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
	if err := m.cleanOthers(ctx); err != nil {
		klog.ErrorS(err, "Could not remove what other modes left", "what", m.what)
		return
	}
	klog.V(2).InfoS("Removed what other modes left, if anything", "what", m.what, "elapsed", time.Since(start))
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
