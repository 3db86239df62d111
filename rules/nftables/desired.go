package nftables

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"kube-proxy/proxy"
)

// Desired returns the table that the dataplane of cfg writes for snap into an empty kernel, as a
// transaction `nft -f` and nftrace load (the dump of knftables' Fake): what `kube-proxy diff` compares
// with the kernel. localAddrs are the node's addresses (NodePorts are served on those inside the
// nodePortAddresses CIDRs). It runs the daemon's own renderer and planner and touches no kernel.
func Desired(cfg Config, snap *proxy.Snapshot, localAddrs []netip.Addr) (string, error) {
	kf := knftables.IPv4Family
	if cfg.Family == v1.IPv6Protocol {
		kf = knftables.IPv6Family
	}
	fake := knftables.NewFake(kf, TableName)
	d := newDataplane(cfg, &knftKernel{nft: fake, fam: familyOf(cfg.Family)}, nil, NewMetrics(nil, false))
	d.localAddrs = func() ([]netip.Addr, error) { return localAddrs, nil }
	if err := d.Apply(context.Background(), snap, true); err != nil {
		return "", fmt.Errorf("rendering the %s table: %w", cfg.Family, err)
	}
	return fake.Dump(), nil
}
