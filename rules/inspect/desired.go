package inspect

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/iptables"
	"kube-proxy/rules/iptables/iptrace"
	"kube-proxy/rules/ipvs"
	"kube-proxy/rules/nftables/nftrace"
)

// Desired is what the daemon would write for the API's current state, rendered by its own code into the
// tracers' models (never into the kernel).
type Desired struct {
	Mode config.ProxyMode
	// XT holds mode iptables' rules per family.
	XT map[v1.IPFamily]*iptrace.Tables
	// NFT holds mode nftables' tables (both families); NFTText the transactions per family.
	NFT     *nftrace.Tables
	NFTText map[v1.IPFamily]string
	// IPVS holds mode ipvs' state per family; its iptables rules are in XT.
	IPVS map[v1.IPFamily]*ipvs.Desired
}

// RenderDesired renders snaps (one per family) as the daemon of cfg would write them into an empty node
// whose addresses are addrs (kube-ipvs0's excepted) and whose nfacct counters are counters.
func RenderDesired(cfg *config.KubeProxyConfiguration, snaps []*proxy.Snapshot, addrs []netip.Addr, counters iptables.NFAcct) (*Desired, error) {
	d := &Desired{Mode: cfg.EffectiveMode(), XT: map[v1.IPFamily]*iptrace.Tables{}, NFT: nftrace.New(), NFTText: map[v1.IPFamily]string{},
		IPVS: map[v1.IPFamily]*ipvs.Desired{}}
	ins, known := inspectors[d.Mode]
	for _, snap := range snaps {
		if !known {
			return nil, fmt.Errorf("diff does not render mode %s", d.Mode)
		}
		if err := ins.render(d, cfg, snap, addrs, counters); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// renderIPTables builds, in a tracer model, what mode iptables writes into an empty node: the chains
// built-in chains jump to with their jump rules, then a full render restored with --noflush.
func renderIPTables(cfg *config.KubeProxyConfiguration, snap *proxy.Snapshot, counters iptables.NFAcct) (*iptrace.Tables, error) {
	icfg, err := iptables.ConfigFrom(cfg, snap.Family)
	if err != nil {
		return nil, err
	}
	icfg.NFAcct = counters
	ts := iptrace.New(snap.Family == v1.IPv6Protocol)
	for _, c := range iptables.CanaryChains() {
		if c.Table != "mangle" { // the tracer keeps nat and filter
			if _, err := ts.Run("-t", c.Table, "-N", c.Chain); err != nil && !isExists(err) {
				return nil, err
			}
		}
	}
	for _, j := range iptables.JumpRules(icfg) {
		if _, err := ts.Run("-t", j.Table, "-N", j.Target); err != nil && !isExists(err) {
			return nil, err
		}
		if _, err := ts.Run(append([]string{"-t", j.Table, "-I", j.Chain}, j.RuleSpec()...)...); err != nil {
			return nil, fmt.Errorf("jump rule %s/%s: %w", j.Table, j.Chain, err)
		}
	}
	res, err := iptables.NewRenderer(icfg).Render(snap, nil, true, nil)
	if err != nil {
		return nil, fmt.Errorf("rendering %s rules: %w", snap.Family, err)
	}
	if err := ts.Restore(res.Payload, iptrace.RestoreOptions{NoFlush: true}); err != nil {
		return nil, fmt.Errorf("loading the rendered %s rules: %w", snap.Family, err)
	}
	return ts, nil
}

func isExists(err error) bool {
	return err != nil && (contains(err.Error(), "already exists") || contains(err.Error(), "Chain already"))
}

// Families returns the families Desired has rules for.
func (d *Desired) Families() []v1.IPFamily {
	var out []v1.IPFamily
	for _, f := range families {
		if d.XT[f] != nil || d.NFTText[f] != "" {
			out = append(out, f)
		}
	}
	return out
}

// apiState lists the API's state for the node, in the families the configuration runs.
func apiState(ctx context.Context, env *Env) (*proxy.APIState, error) {
	client, err := env.client()
	if err != nil {
		return nil, err
	}
	return proxy.ListAPIState(ctx, client, env.Config, env.NodeName, proxy.Families(env.Config))
}
