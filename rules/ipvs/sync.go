package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/klog/v2"

	"kube-proxy/proxy"
	"kube-proxy/rules/xtables"
)

// The sync: a full one reads the kernel and repairs every difference, a partial one writes what the
// changed Service ports changed. Both go in the same order: sets (the rules refer to them), addresses on
// kube-ipvs0 (IPVS serves only local addresses), virtual servers, addresses no longer wanted, iptables.

// syncFull reads the kernel state and makes it match the desired state of snap.
func (d *Dataplane) syncFull(ctx context.Context, snap *proxy.Snapshot) error {
	if err := d.renderFull(snap); err != nil {
		return err
	}
	have := newModel()
	d.have = have
	var errs []error
	d.phases.done("render")

	// Sets first: the rules restored below refer to them.
	for id := setID(0); id < numSets; id++ {
		if err := d.syncSet(id); err != nil {
			errs = append(errs, err)
		}
	}
	d.phases.done("ipsets")

	binds, err := d.bindAddrs(have)
	errs = append(errs, err...)
	d.phases.done("addresses")

	if err := d.syncAllVS(have); err != nil {
		errs = append(errs, err)
		if errors.Is(err, errListing) {
			return errors.Join(errs...)
		}
	}
	d.phases.done("ipvs")

	errs = append(errs, d.syncBinds(binds, false)...)
	d.phases.done("unbind")

	if err := d.syncRules(ctx, &snap.Node, true); err != nil {
		errs = append(errs, err)
	}
	d.phases.done("iptables")
	return errors.Join(errs...)
}

// renderFull reads the node's addresses (ensuring kube-ipvs0 exists, so they can be told from the Service
// addresses on it) and brings the desired state up to snap. A port's desired state depends only on the port, the
// configuration, the node and its addresses: when those three are as the desired state was rendered with, only the
// ports that changed since are rendered again (a periodic resync of 10,000 unchanged Services then costs
// the kernel's reading, not a new rendering); otherwise every port is.
func (d *Dataplane) renderFull(snap *proxy.Snapshot) error {
	if err := d.k.links.ensureDummy(DummyLink); err != nil {
		return fmt.Errorf("creating the %s link: %w", DummyLink, err)
	}
	addrs, err := d.k.links.localAddrs(d.family, DummyLink)
	if err != nil {
		return fmt.Errorf("listing the node's addresses: %w", err)
	}
	en := newEnv(&d.cfg, &snap.Node, addrs)
	if d.want == nil || d.rendered == nil || d.rerender || !d.rendered.Node.Equal(&snap.Node) || !d.en.equal(&en) {
		d.en = en
		d.want = d.render(snap)
	} else {
		d.rerenderChanged(snap, nil)
	}
	d.rendered, d.rerender = snap, false
	return nil
}

// rerenderChanged renders again the ports that changed between the snapshot the desired state was rendered from and snap,
// recording in t (which may be nil) what that touched.
func (d *Dataplane) rerenderChanged(snap *proxy.Snapshot, t *touched) {
	if snap == d.rendered {
		return
	}
	for _, name := range snap.Changes(d.rendered) {
		var p *portDesired
		if sp := snap.Services[name]; sp != nil {
			p = renderPort(&d.cfg, &d.en, &snap.Node, sp)
		}
		d.want.set(name, p, t)
	}
	d.rendered = snap
}

// bindAddrs reads the addresses on kube-ipvs0 into have and adds the wanted ones that are missing. It
// returns every address either wanted or bound, sorted, for the removal of the unwanted ones once the
// virtual servers are written.
func (d *Dataplane) bindAddrs(have *model) ([]netip.Addr, []error) {
	var errs []error
	bound, err := d.k.links.addrs(DummyLink, d.family)
	if err != nil {
		errs = append(errs, fmt.Errorf("listing the addresses of %s: %w", DummyLink, err))
	}
	for _, a := range bound {
		have.binds[a] = true
	}
	keys := make([]netip.Addr, 0, len(d.want.binds)+len(bound))
	for a := range d.want.binds {
		keys = append(keys, a)
	}
	keys = append(keys, bound...)
	slices.SortFunc(keys, netip.Addr.Compare)
	keys = slices.Compact(keys)
	return keys, append(errs, d.syncBinds(keys, true)...)
}

// errListing marks a failure to list the virtual servers: nothing after it can be compared.
var errListing = errors.New("listing IPVS services")

// syncAllVS reads every virtual server of the family with its real servers into have and makes them
// match the desired state: wanted ones are repaired as they are read, then the unwanted ones (but those in the
// excluded CIDRs) are removed and the missing ones created.
func (d *Dataplane) syncAllVS(have *model) error {
	list, err := d.k.ipvs.services()
	if err != nil {
		return fmt.Errorf("%w: %w", errListing, err)
	}
	// All real servers in one read when the kernel offers it: one request per virtual server is what makes
	// full syncs of thousands of Services slow.
	all, err := d.k.ipvs.allReals()
	if err != nil {
		klog.V(2).InfoS("Listing all IPVS real servers at once failed; listing them per virtual server", "err", err)
		all = nil
	}
	var errs []error
	var rest []vsKey
	for _, kv := range list {
		if familyOf(kv.key.Addr()) != d.family {
			continue
		}
		if d.want.vs(kv.key) == nil && d.cfg.excluded(kv.key.Addr()) {
			continue // someone else's, left alone
		}
		m := &modelVS{kernelVS: kv}
		if d.want.vs(kv.key) == nil {
			have.vs[kv.key] = m
			rest = append(rest, kv.key)
			continue
		}
		rs, err := all[kv.key], error(nil)
		if all == nil {
			rs, err = d.k.ipvs.reals(kv.key)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("listing the real servers of %s: %w", kv.key, err))
			continue
		}
		m.reals = realWeightsOf(rs)
		if err := d.syncVS(kv.key, m, rs); err != nil {
			errs = append(errs, err)
		}
	}
	for k := range d.want.claims {
		if _, ok := have.vs[k]; !ok {
			rest = append(rest, k)
		}
	}
	slices.SortFunc(rest, vsKey.compare)
	for _, k := range rest {
		if err := d.syncVS(k, nil, nil); err != nil {
			errs = append(errs, err)
		}
	}
	for k := range d.draining {
		if _, ok := have.vs[k]; !ok {
			delete(d.draining, k)
		}
	}
	return errors.Join(errs...)
}

// syncPartial renders again the changed Service ports and writes what they changed.
func (d *Dataplane) syncPartial(ctx context.Context, snap *proxy.Snapshot) error {
	t := newTouched()
	d.rerenderChanged(snap, t)
	var errs []error
	for id := setID(0); id < numSets; id++ {
		for _, e := range sortedKeys(t.sets[id], entry.compare) {
			if err := d.syncEntry(id, e, t.sets[id][e]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	binds := sortedKeys(t.binds, netip.Addr.Compare)
	errs = append(errs, d.syncBinds(binds, true)...)
	for _, k := range sortedKeys(t.vs, vsKey.compare) {
		if err := d.syncVS(k, nil, nil); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, d.syncBinds(binds, false)...)
	if err := d.syncRules(ctx, &snap.Node, false); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sortedKeys returns the keys of a map, sorted.
func sortedKeys[K comparable, V any](m map[K]V, cmp func(a, b K) int) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, cmp)
	return out
}

// syncSet makes one set exist and hold what the desired state wants (full syncs).
func (d *Dataplane) syncSet(id setID) error {
	name, typ := setName(id, d.family), setDefs[id].typ
	cur, err := d.k.sets.listSet(name)
	if isNotExist(err) {
		if err := d.k.sets.createSet(name, typ, d.family); err != nil && !isExist(err) {
			return fmt.Errorf("creating ipset %s: %w", name, err)
		}
		cur, err = nil, nil
	}
	if err != nil {
		return fmt.Errorf("listing ipset %s: %w", name, err)
	}
	var errs []error
	in := make(map[entry]struct{}, len(cur))
	for _, e := range cur {
		in[e] = struct{}{}
		if d.want.sets[id][e] == 0 {
			errs = append(errs, d.syncEntry(id, e, true))
		}
	}
	var missing []entry
	for e := range d.want.sets[id] {
		if _, ok := in[e]; !ok {
			missing = append(missing, e)
		}
	}
	slices.SortFunc(missing, entry.compare)
	for _, e := range missing {
		errs = append(errs, d.syncEntry(id, e, false))
	}
	return errors.Join(errs...)
}

// syncEntry adds or deletes one set member, which the kernel holds if have, so the kernel matches the desired state.
func (d *Dataplane) syncEntry(id setID, e entry, have bool) error {
	name, typ := setName(id, d.family), setDefs[id].typ
	want := d.want.sets[id][e] > 0
	switch {
	case want && !have:
		if err := d.k.sets.addEntry(name, typ, e); err != nil && !isExist(err) {
			return fmt.Errorf("adding %s to ipset %s: %w", e, name, err)
		}
	case !want && have:
		if err := d.k.sets.delEntry(name, typ, e); err != nil && !isNotExist(err) {
			return fmt.Errorf("deleting %s from ipset %s: %w", e, name, err)
		}
	}
	return nil
}

// syncBinds adds (add true) or removes (add false) addresses of kube-ipvs0 so they match the desired state.
// Addresses are added before the virtual servers are written and removed after.
func (d *Dataplane) syncBinds(addrs []netip.Addr, add bool) []error {
	var errs []error
	for _, a := range addrs {
		want, have := d.want.binds[a] > 0, d.have.binds[a]
		switch {
		case add && want && !have:
			if err := d.k.links.addAddr(DummyLink, a); err != nil && !isExist(err) {
				errs = append(errs, fmt.Errorf("adding %s to %s: %w", a, DummyLink, err))
				continue
			}
			d.have.binds[a] = true
		case !add && !want && have:
			if err := d.k.links.delAddr(DummyLink, a); err != nil && !isNotExist(err) {
				errs = append(errs, fmt.Errorf("removing %s from %s: %w", a, DummyLink, err))
				continue
			}
			delete(d.have.binds, a)
		}
	}
	return errs
}

// syncVS makes one virtual server and its real servers match the desired state: the virtual server itself, then
// the wanted real servers, then the unwanted ones (drained or removed). have is the kernel's state when it
// was just read (full syncs), else nil to use the model; fresh are its real servers as just read, with
// their connection counts (nil: read them if a removal needs them).
func (d *Dataplane) syncVS(k vsKey, have *modelVS, fresh []kernelReal) error {
	if have != nil {
		d.have.vs[k] = have
	}
	have = d.have.vs[k]
	want := d.want.vs(k)
	if want == nil {
		if have == nil {
			return nil
		}
		if err := d.k.ipvs.removeService(k); err != nil && !isNotExist(err) {
			return fmt.Errorf("removing IPVS service %s: %w", k, err)
		}
		delete(d.have.vs, k)
		delete(d.draining, k)
		return nil
	}
	have, fresh, err := d.ensureService(k, want, have, fresh)
	if err != nil {
		return err
	}
	errs := d.addReals(k, want, have)
	errs = append(errs, d.removeReals(k, want, have, fresh)...)
	return errors.Join(errs...)
}

// ensureService creates the virtual server, takes over one created behind our back, or updates its
// settings, so that it is as wanted. It returns its model and, when it read them, its real servers.
func (d *Dataplane) ensureService(k vsKey, want *virtualServer, have *modelVS, fresh []kernelReal) (*modelVS, []kernelReal, error) {
	kv := kernelVS{key: k, scheduler: want.scheduler, flags: want.flags, timeout: want.timeout}
	switch {
	case have == nil:
		err := d.k.ipvs.createService(kv)
		if isExist(err) {
			// Created behind our back since the last full sync: take it over.
			err = d.k.ipvs.updateService(kv)
			if err == nil {
				if fresh, err = d.k.ipvs.reals(k); err != nil {
					return nil, nil, fmt.Errorf("listing the real servers of %s: %w", k, err)
				}
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("creating IPVS service %s: %w", k, err)
		}
		have = &modelVS{kernelVS: kv, reals: realWeightsOf(fresh)}
		d.have.vs[k] = have
	case !want.sameService(have.scheduler, have.flags, have.timeout):
		if err := d.k.ipvs.updateService(kv); err != nil {
			return nil, nil, fmt.Errorf("updating IPVS service %s: %w", k, err)
		}
		have.kernelVS = kv
	}
	return have, fresh, nil
}

// addReals adds the wanted real servers that are missing and gives draining ones that are wanted again
// their weight back.
func (d *Dataplane) addReals(k vsKey, want *virtualServer, have *modelVS) []error {
	var errs []error
	draining := d.draining[k]
	for _, r := range want.reals {
		w, ok := have.reals.get(r)
		switch {
		case !ok:
			err := d.k.ipvs.createReal(k, r, 1)
			if isExist(err) {
				err = d.k.ipvs.updateReal(k, r, 1)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("adding real server %s to %s: %w", r, k, err))
				continue
			}
		case w != 1:
			// A draining real server that is wanted again is restored.
			if err := d.k.ipvs.updateReal(k, r, 1); err != nil {
				errs = append(errs, fmt.Errorf("setting the weight of real server %s of %s: %w", r, k, err))
				continue
			}
		}
		have.reals.set(r, 1)
		delete(draining, r)
	}
	return errs
}

// syncRules restores the iptables rules when they changed, or always when force is set. Forced, it also
// puts back the jumps into our chains that are missing: it reads the nat and filter tables once each and
// inserts the missing jumps in the same iptables-restore, which in TCG saves about a second per full sync
// over checking each jump with its own iptables command.
func (d *Dataplane) syncRules(ctx context.Context, node *proxy.Node, force bool) error {
	payload := renderRules(&d.cfg, &ruleInputs{nonEmpty: d.want.nonEmpty(), noNodeAccess: d.want.sortedNoNodeAccess(), node: node})
	if !force && slices.Equal(payload, d.rules) {
		return nil
	}
	write := payload
	var missing []xtables.JumpRule
	var saveErr error
	if force {
		if missing, saveErr = d.missingJumps(ctx); saveErr == nil {
			write = withJumps(payload, missing)
		}
	}
	if err := d.restore(ctx, write); err != nil {
		return err
	}
	d.rules = payload
	if saveErr != nil {
		// A table that could not be read may not have existed: now that ours are written, look again and
		// put back only the jumps.
		klog.V(2).InfoS("Reading the tables before restoring failed; checking the jumps after", "ipFamily", d.family, "err", saveErr)
		if missing, saveErr = d.missingJumps(ctx); saveErr != nil {
			d.rules = nil
			return saveErr
		}
		if len(missing) > 0 {
			return d.restore(ctx, withJumps([]byte("*nat\nCOMMIT\n*filter\nCOMMIT\n"), missing))
		}
	}
	return nil
}

// restore feeds a payload to iptables-restore, counting failures.
func (d *Dataplane) restore(ctx context.Context, payload []byte) error {
	klog.V(9).InfoS("Restoring iptables rules", "ipFamily", d.family, "payload", string(payload))
	if err := d.k.rules.restore(ctx, payload); err != nil {
		d.rules = nil
		if d.restoreFailures != nil {
			d.restoreFailures.Inc()
		}
		return fmt.Errorf("restoring the IPVS-mode iptables rules: %w", err)
	}
	return nil
}

// missingJumps reads the nat and filter tables and returns the jump rules that are not there.
func (d *Dataplane) missingJumps(ctx context.Context) ([]xtables.JumpRule, error) {
	saved := map[string]string{}
	var missing []xtables.JumpRule
	for _, j := range jumpRules {
		if _, ok := saved[j.Table]; !ok {
			s, err := d.k.rules.save(ctx, j.Table)
			if err != nil {
				return nil, fmt.Errorf("reading the %s table: %w", j.Table, err)
			}
			saved[j.Table] = s
		}
		if !hasJump(saved[j.Table], j) {
			missing = append(missing, j)
		}
	}
	return missing, nil
}
