package ipvs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/cloudflare/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/rules/sysctl"
	"kube-proxy/rules/xtables"
)

// New returns the IPVS-mode dataplane of one IP family. cfg comes from ConfigFrom, runner is the family's
// iptables (IPVS mode still masquerades and filters with iptables: xtables.UsableRunner checks it works),
// cl removes stale conntrack entries after syncs (nil: none) and m holds the metrics both families share
// (NewMetrics; nil: none). Call Usable once before. New connects to IPVS and netlink, sets the sysctls IPVS
// mode needs and the configured IPVS timeouts, and starts the goroutine that removes drained real servers,
// which ends with ctx. Nothing else is written before the first Apply.
func New(ctx context.Context, cfg Config, runner *xtables.Runner, cl cleaner, m *Metrics, opts ...Option) (*Dataplane, error) {
	client, err := ipvs.New()
	if err != nil {
		return nil, fmt.Errorf("connecting to IPVS: %w", err)
	}
	// One handle keeps a socket per netlink family open for the dataplane's life; the zero handle would
	// open and close one per request, which dominates syncs of thousands of objects.
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER)
	if err != nil {
		closeClient(client)
		return nil, fmt.Errorf("opening netlink sockets: %w", err)
	}
	k := kernel{
		ipvs:          &kernelIPVS{c: client},
		sets:          &kernelSets{h: h},
		links:         &kernelLinks{h: h, index: map[string]int{}},
		rules:         &kernelRules{r: runner},
		sysctl:        sysctl.Proc,
		kernelVersion: kernelVersion(),
	}
	d, err := newDataplane(ctx, cfg, k, cl, m, opts...)
	if err != nil {
		closeClient(client)
		h.Close()
		return nil, err
	}
	return d, nil
}

// Usable checks that this node's kernel can run IPVS mode with the given scheduler, loading modules as
// needed (the kernel loads them on demand when modprobe is available), and names what is missing:
// IPVS itself (ip_vs), the scheduler (ip_vs_<scheduler>), ipsets (ip_set and the ip_set_* types), the
// dummy link (dummy).
func Usable(scheduler string) error {
	if scheduler == "" {
		scheduler = "rr"
	}
	var missing []string
	c, err := ipvs.New()
	if err != nil {
		return fmt.Errorf("IPVS is not usable: the kernel has no IPVS (module ip_vs%s): %w", moduleHint("ip_vs"), err)
	}
	defer closeClient(c)
	if err := probeScheduler(&kernelIPVS{c: c}, scheduler); err != nil {
		missing = append(missing, fmt.Sprintf("scheduler %s (module ip_vs_%s%s): %v", scheduler, scheduler, moduleHint("ip_vs_"+scheduler), err))
	}
	h := &netlink.Handle{}
	if _, _, err := h.IpsetProtocol(); err != nil {
		missing = append(missing, fmt.Sprintf("ipsets (module ip_set%s): %v", moduleHint("ip_set"), err))
	} else {
		sets := &kernelSets{h: h}
		for _, t := range []struct{ typ, module string }{
			{typeHashIP, "ip_set_hash_ip"}, {typeHashIPPort, "ip_set_hash_ipport"}, {typeHashIPPortIP, "ip_set_hash_ipportip"},
			{typeHashIPPortNet, "ip_set_hash_ipportnet"}, {typeBitmapPort, "ip_set_bitmap_port"},
		} {
			const probe = "KUBE-PROXY-PROBE"
			_ = sets.destroySet(probe)
			if err := sets.createSet(probe, t.typ, v1.IPv4Protocol); err != nil {
				missing = append(missing, fmt.Sprintf("ipset type %s (module %s%s): %v", t.typ, t.module, moduleHint(t.module), err))
				continue
			}
			_ = sets.destroySet(probe)
		}
	}
	if _, err := netlink.LinkByName(DummyLink); err != nil {
		if _, err := os.Stat("/sys/module/dummy"); err != nil && moduleHint("dummy") != "" {
			missing = append(missing, "dummy links (module dummy"+moduleHint("dummy")+")")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("IPVS mode is not usable, missing: %s", strings.Join(missing, "; "))
	}
	return nil
}

// closeClient closes an IPVS client's netlink socket (the library's interface has no Close).
func closeClient(c ipvs.Client) {
	if cl, ok := c.(io.Closer); ok {
		_ = cl.Close()
	}
}

// moduleHint says when a module is absent from this kernel's module directory (when it can tell); it
// returns "" when the module is there or nothing can be said.
func moduleHint(module string) string {
	release := unameRelease()
	if release == "" {
		return ""
	}
	dir := "/lib/modules/" + release
	found, read := false, false
	for _, f := range []string{"modules.dep", "modules.builtin"} {
		b, err := os.ReadFile(dir + "/" + f)
		if err != nil {
			continue
		}
		read = true
		for _, line := range strings.Split(string(b), "\n") {
			if i := strings.IndexByte(line, ':'); i >= 0 {
				line = line[:i]
			}
			if j := strings.LastIndexByte(line, '/'); j >= 0 {
				line = line[j+1:]
			}
			if k := strings.Index(line, ".ko"); k >= 0 {
				line = line[:k]
			}
			if strings.ReplaceAll(line, "-", "_") == module {
				found = true
			}
		}
	}
	switch {
	case found:
		return ""
	case read:
		return ", not in " + dir
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return "; " + dir + " does not exist"
	}
	return ""
}

func unameRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Cleanup removes what IPVS mode (ours or upstream's) leaves in the kernel: every IPVS virtual server, the
// kube-ipvs0 link, the IPVS-mode iptables rules and chains of both families in every iptables backend
// present, and the ipsets of both families. It does nothing to IPVS when the kernel has no IPVS.
func Cleanup(ctx context.Context) error {
	var errs []error
	if c, err := ipvs.New(); err == nil {
		defer closeClient(c)
		h := &kernelIPVS{c: c}
		list, err := h.services()
		if err != nil {
			errs = append(errs, fmt.Errorf("listing IPVS services: %w", err))
		}
		for _, s := range list {
			if err := h.removeService(s.key); err != nil && !isNotExist(err) {
				errs = append(errs, fmt.Errorf("removing IPVS service %s: %w", s.key, err))
			}
		}
	}
	links := &kernelLinks{h: &netlink.Handle{}, index: map[string]int{}}
	if err := links.deleteLink(DummyLink); err != nil && !isNotExist(err) {
		errs = append(errs, fmt.Errorf("deleting %s: %w", DummyLink, err))
	}
	for _, b := range xtables.Backends {
		for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			if !xtables.Available(b, f) || !xtables.HasTable(b, f, "") {
				continue
			}
			r, err := xtables.NewRunner(b, f)
			if err != nil {
				continue
			}
			errs = append(errs, cleanupRules(ctx, &kernelRules{r: r}, r)...)
		}
	}
	// Sets last: the kernel refuses to destroy a set that a rule still refers to.
	sets := &kernelSets{h: &netlink.Handle{}}
	if _, _, err := sets.h.IpsetProtocol(); err == nil {
		for _, name := range allSetNames() {
			if err := sets.destroySet(name); err != nil && !isNotExist(err) {
				errs = append(errs, fmt.Errorf("destroying ipset %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// cleanupRules deletes the jump rules, then flushes and deletes the IPVS-mode chains of one runner. It
// reads each table once with iptables-save and touches only what is there.
func cleanupRules(ctx context.Context, k *kernelRules, r *xtables.Runner) []error {
	var errs []error
	var buf bytes.Buffer
	for _, table := range []string{"nat", "filter"} {
		if !xtables.HasTable(r.Backend, r.Family, table) {
			continue // saving an absent legacy table would create it
		}
		if err := r.Save(ctx, table, &buf); err != nil {
			continue // the table does not exist in this backend
		}
		save := buf.String()
		for _, j := range jumpRules {
			if j.Table == table && hasJump(save, j) {
				if err := r.DeleteRule(j.Table, j.Chain, j.RuleSpec()...); err != nil && !xtables.IsNotExist(err) {
					errs = append(errs, fmt.Errorf("%s: deleting the jump from %s/%s: %w", r.Backend, j.Table, j.Chain, err))
				}
			}
		}
		chains := xtables.Chains(buf.Bytes())
		var present []string
		for _, c := range ownChains {
			if c.table == table && slices.Contains(chains, c.chain) {
				present = append(present, c.chain)
			}
		}
		if len(present) == 0 {
			continue
		}
		// Flush them all at once (which also drops the jumps between them), then delete them: all at once
		// when possible, else one by one, leaving a chain still in use (KUBE-MARK-MASQ by iptables-mode
		// chains, say) for the iptables mode's cleanup.
		if err := k.restore(ctx, xtables.FlushChainsPayload(table, present)); err != nil {
			errs = append(errs, fmt.Errorf("%s: flushing the IPVS-mode %s chains: %w", r.Backend, table, err))
			continue
		}
		if err := k.restore(ctx, xtables.DeleteChainsPayload(table, present)); err == nil {
			continue
		}
		for _, c := range present {
			if err := k.restore(ctx, xtables.DeleteChainsPayload(table, []string{c})); err != nil {
				klog.V(2).InfoS("IPVS-mode chain left in place", "backend", r.Backend, "family", r.Family, "table", table, "chain", c, "err", err)
			}
		}
	}
	return errs
}
