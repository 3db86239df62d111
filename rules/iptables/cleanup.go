package iptables

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"kube-proxy/rules/xtables"
)

// cleanupKernel is what Cleanup needs beyond kernel.
type cleanupKernel interface {
	kernel
	DeleteRule(table, chain string, rule ...string) error
}

// cleanupChains are the chains mode iptables creates besides the per-Service ones, per table. Kubelet's
// KUBE-FIREWALL, which we only duplicate, is not among them: like upstream, cleanup leaves it and its jumps,
// since removing it would drop kubelet's protection against martian packets to 127.0.0.0/8.
var cleanupChains = map[string][]string{
	"nat":    {chainServices, chainNodePorts, chainPostrouting, chainMarkMasq, chainCanary},
	"filter": {chainServices, chainExternalServices, chainForward, chainNodePorts, chainProxyFirewall, chainCanary},
	"mangle": {chainCanary},
}

// Cleanup removes every jump rule and chain that mode iptables (ours or upstream's) creates from one
// backend and family: the jumps from built-in chains first, then our chains are flushed and deleted in one
// iptables-restore per table. Rules and chains of others are left alone, kubelet's KUBE-FIREWALL included.
func Cleanup(ctx context.Context, k cleanupKernel) error {
	var errs []error
	for _, j := range JumpRules(Config{}) {
		if j.Target == chainKubeletFirewall {
			continue
		}
		if err := k.DeleteRule(j.Table, j.Chain, j.RuleSpec()...); err != nil && !xtables.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("deleting jump %s/%s -> %s: %w", j.Table, j.Chain, j.Target, err))
		}
	}
	for _, table := range []string{"nat", "filter", "mangle"} {
		existing, err := k.ListChains(ctx, table)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var doomed []string
		for _, c := range existing {
			if slices.Contains(cleanupChains[table], c) || (table == "nat" && isServiceChain(c)) {
				doomed = append(doomed, c)
			}
		}
		if len(doomed) == 0 {
			continue
		}
		slices.Sort(doomed)
		if err := k.Restore(ctx, xtables.DeleteChainsPayload(table, doomed)); err != nil {
			errs = append(errs, fmt.Errorf("deleting chains of table %s: %w", table, err))
		}
	}
	return errors.Join(errs...)
}
