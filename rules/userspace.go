package rules

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/engine"
	"kube-proxy/rules/userspace"
	"kube-proxy/rules/xtables"
)

// newUserspace sets up mode userspace: the backend the node already uses for the capture rules, and per
// family whose tools work a proxy engine and its dataplane, whose listeners are handed over to the next
// process through sockets (nil: not). Once every family has synced, Mode.AfterReady removes the other
// modes' rules.
func newUserspace(ctx context.Context, cfg *config.KubeProxyConfiguration, _ string, reg prometheus.Registerer, sockets engine.Sockets) ([]proxy.FamilyDataplane, error) {
	backend, why, err := xtables.Detect(ctx)
	if err != nil {
		return nil, err
	}
	klog.InfoS("Using iptables backend for the userspace proxy's capture rules", "backend", backend, "reason", why)
	metrics := engine.NewMetrics(reg)
	opts := userspace.EngineOptions(cfg)
	// Listeners survive restarts through the service manager's store, when there is one.
	opts.Sockets = sockets
	return perFamily(cfg, backend, func(family v1.IPFamily, runner *xtables.Runner) (proxy.Dataplane, error) {
		ucfg, err := userspace.ConfigFrom(cfg, family)
		if err != nil {
			return nil, err
		}
		e := engine.New(family, netip.Addr{}, opts, metrics)
		klog.InfoS("Userspace proxy engine", "ipFamily", family, "udpIdleTimeout", e.Options().UDPIdleTimeout,
			"tcpIdleTimeout", e.Options().IdleTimeout, "descriptorBudget", e.Options().Budget.Max(), "maxConnectionsPerServicePort", e.Options().MaxConnsPerListener)
		return userspace.NewDataplane(ucfg, runner, e, userspace.FlowCleaner{Family: family}), nil
	})
}

// cleanupUserspace removes mode userspace's capture rules from every backend and family where they are.
func cleanupUserspace(ctx context.Context) error {
	var errs []error
	for _, runner := range xtables.RunnersWithNAT(nil) {
		backend, family := runner.Backend, runner.Family
		if ok, err := userspace.Present(runner); err != nil || !ok {
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", backend, family, err))
			}
			continue
		}
		if err := userspace.Cleanup(ctx, runner, xtables.IsNotExist); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", backend, family, err))
			continue
		}
		klog.InfoS("Removed userspace-mode rules", "backend", backend, "ipFamily", family)
	}
	return errors.Join(errs...)
}
