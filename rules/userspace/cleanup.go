package userspace

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"kube-proxy/rules/xtables"
)

// cleanupKernel is what Cleanup needs from the iptables tools of one backend and family.
type cleanupKernel interface {
	Restore(ctx context.Context, payload []byte) error
	ListChains(ctx context.Context, table string) ([]string, error)
	DeleteRule(table, chain string, rule ...string) error
}

// Cleanup removes mode userspace's jump rules and chains from one backend and family; it leaves
// everything else alone and does nothing where they are absent.
func Cleanup(ctx context.Context, k cleanupKernel, isNotExist func(error) bool) error {
	var errs []error
	for _, j := range JumpRules() {
		if err := k.DeleteRule(j.Table, j.Chain, j.RuleSpec()...); err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("deleting jump %s/%s -> %s: %w", j.Table, j.Chain, j.Target, err))
		}
	}
	for _, table := range []string{"nat", "filter"} {
		existing, err := k.ListChains(ctx, table)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var doomed []string
		for _, c := range Chains()[table] {
			if slices.Contains(existing, c) {
				doomed = append(doomed, c)
			}
		}
		if len(doomed) == 0 {
			continue
		}
		if err := k.Restore(ctx, xtables.DeleteChainsPayload(table, doomed)); err != nil {
			errs = append(errs, fmt.Errorf("deleting chains of table %s: %w", table, err))
		}
	}
	return errors.Join(errs...)
}

// Present reports whether any of our chains exists in a backend and family. It asks for each of our chains
// by name: listing every chain of a table holding another mode's rules for 10,000 Services (mode iptables'
// after its first sync, when this runs) allocated 20 MiB that the daemon's RSS kept.
func Present(k interface {
	ChainExists(table, chain string) (bool, error)
}) (bool, error) {
	for _, table := range []string{"nat", "filter"} {
		for _, c := range Chains()[table] {
			ok, err := k.ChainExists(table, c)
			if err != nil || ok {
				return ok, err
			}
		}
	}
	return false, nil
}
