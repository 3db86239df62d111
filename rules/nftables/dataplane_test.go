package nftables

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"kube-proxy/proxy"
	"kube-proxy/rules/conntrack"
)

// steps are successive snapshots exercising every kind of change a partial sync must get right.
func steps() []*proxy.Snapshot {
	n := node("10.0.0.1", "10.244.1.0/24")
	s0 := snapshot(v4, n,
		port("ns/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, nodePort(30080), eps("10.244.1.5:8080,local", "10.244.2.6:8080")),
		port("ns/dns", "dns", v1.ProtocolUDP, "10.96.0.53", 53, eps("10.244.2.9:53")),
		port("ns/empty", "", v1.ProtocolTCP, "10.96.0.20", 80, nodePort(30020), externalIPs("192.0.2.20")),
	)
	s1 := derive(s0, nil, // endpoints added and one service gets affinity
		port("ns/dns", "dns", v1.ProtocolUDP, "10.96.0.53", 53, eps("10.244.2.9:53", "10.244.3.9:53")),
		port("ns/sticky", "", v1.ProtocolTCP, "10.96.0.30", 80, affinity(600), eps("10.244.1.5:8080,local", "10.244.3.7:8080")),
	)
	s2 := derive(s1, nil, // the empty service gets endpoints; an LB service with source ranges and eTP Local
		port("ns/empty", "", v1.ProtocolTCP, "10.96.0.20", 80, nodePort(30020), externalIPs("192.0.2.20"), eps("10.244.2.20:80")),
		port("ns/lb", "", v1.ProtocolTCP, "10.96.0.40", 443, nodePort(30443), lbIPs("203.0.113.40"),
			sourceRanges("198.51.100.0/24", "10.0.0.0/24"), etpLocal(31443), eps("10.244.1.40:443,local", "10.244.2.40:443")),
	)
	s3 := derive(s2, []proxy.ServicePortName{spn("ns/web", "http", v1.ProtocolTCP)}, // removal, affinity timeout change
		port("ns/sticky", "", v1.ProtocolTCP, "10.96.0.30", 80, affinity(60), eps("10.244.3.7:8080")),
		port("ns/lb", "", v1.ProtocolTCP, "10.96.0.40", 443, nodePort(30443), lbIPs("203.0.113.40"),
			sourceRanges("198.51.100.0/24"), etpLocal(31443), eps("10.244.2.40:443")),
	)
	s4 := derive(s3, nil, // an internal-local service with and without local endpoints; two ports share a cluster IP
		port("ns/itp", "a", v1.ProtocolTCP, "10.96.0.50", 80, itpLocal, eps("10.244.2.50:80")),
		port("ns/itp", "b", v1.ProtocolTCP, "10.96.0.50", 81, itpLocal, eps("10.244.1.50:81,local")),
	)
	s5 := derive(s4, []proxy.ServicePortName{spn("ns/itp", "a", v1.ProtocolTCP)}, // one of them goes
		port("ns/sticky", "", v1.ProtocolTCP, "10.96.0.30", 80, eps("10.244.3.7:8080", "10.244.3.8:8080")),
	)
	s6 := derive(s5, nil) // the node moves: another IP and pod CIDR
	s6.Node = node("10.0.0.2", "10.244.7.0/24")
	s7 := derive(s6, nil) // and gets ServiceCIDRs
	s7.ServiceCIDRs = prefixes("10.96.0.0/16", "10.97.0.0/16")
	return []*proxy.Snapshot{s0, s1, s2, s3, s4, s5, s6, s7}
}

// TestPartialSyncsConverge applies the steps as partial syncs and checks, after each, that the table is
// exactly what a rebuild from scratch writes for the same snapshot.
func TestPartialSyncsConverge(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"cluster CIDR, all node addresses", testConfig(v4, "10.244.0.0/16")},
		{"node CIDR, primary NodePorts", func() Config {
			c := testConfig(v4, "")
			c.LocalDetector.Mode = "NodeCIDR"
			c.NodePortAddresses.Primary = true
			return c
		}()},
		{"masquerade all, localhost reject", func() Config {
			c := testConfig(v4, "10.244.0.0/16")
			c.MasqueradeAll, c.LocalhostReject = true, true
			return c
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, k := testDataplane(tc.cfg, "10.0.0.1", "10.0.0.2", "127.0.0.1")
			for i, s := range steps() {
				apply(t, d, s, i == 0)
				apply(t, d, s, false) // deletes the chains flushed by the step
				want := rebuilt(t, tc.cfg, s, "10.0.0.1", "10.0.0.2", "127.0.0.1")
				if diff := cmp.Diff(want, dump(k)); diff != "" {
					t.Fatalf("step %d: partial syncs differ from a rebuild (-rebuild +partial):\n%s", i, diff)
				}
			}
		})
	}
}

// TestPartialSyncWritesOnlyChanges checks that a change to one Service writes only its own objects.
func TestPartialSyncWritesOnlyChanges(t *testing.T) {
	st := steps()
	d, k := testDataplane(testConfig(v4, "10.244.0.0/16"))
	apply(t, d, st[0], true)
	var got []string
	k.fail = func(t *tx) error {
		for _, l := range strings.Split(strings.TrimSpace(t.String()), "\n") {
			got = append(got, l)
		}
		return nil
	}
	next := derive(st[0], nil, port("ns/dns", "dns", v1.ProtocolUDP, "10.96.0.53", 53, eps("10.244.2.9:53", "10.244.3.9:53")))
	apply(t, d, next, false)
	for _, l := range got {
		if !strings.Contains(l, "ns/dns") {
			t.Errorf("a change to ns/dns wrote %q", l)
		}
	}
	if len(got) == 0 {
		t.Fatal("nothing written")
	}
}

// TestFailedSyncRebuilds makes a partial sync fail and checks that the table is untouched by it and that
// the next sync rebuilds it right.
func TestFailedSyncRebuilds(t *testing.T) {
	st := steps()
	cfg := testConfig(v4, "10.244.0.0/16")
	d, k := testDataplane(cfg)
	apply(t, d, st[0], true)
	before := dump(k)
	k.fail = func(*tx) error { return errors.New("injected") }
	if err := d.Apply(context.Background(), st[1], false); err == nil {
		t.Fatal("Apply succeeded with a failing kernel")
	}
	if diff := cmp.Diff(before, dump(k)); diff != "" {
		t.Errorf("a failed sync changed the table:\n%s", diff)
	}
	k.fail = nil
	apply(t, d, st[2], false)
	apply(t, d, st[2], false)
	if diff := cmp.Diff(rebuilt(t, cfg, st[2]), dump(k)); diff != "" {
		t.Errorf("after the failure (-rebuild +got):\n%s", diff)
	}
}

// TestUnreadableAddressesKeepTheTable: with nodePortAddresses "primary", a sync that cannot read the
// node's addresses fails before it writes, so the nodeport-ips set keeps the address it had (an empty one
// would stop every NodePort); the next sync that can read them goes on.
func TestUnreadableAddressesKeepTheTable(t *testing.T) {
	cfg := testConfig(v4, "10.244.0.0/16")
	cfg.NodePortAddresses = proxy.ParseNodePortAddresses([]string{"primary"}, v4)
	snap := snapshot(v4, node("10.0.0.1"), port("ns/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, nodePort(30080), eps("10.244.1.2:8080")))
	d, k := testDataplane(cfg, "10.0.0.1", "192.168.0.1")
	apply(t, d, snap, true)
	before := dump(k)
	if !strings.Contains(before, "nodeport-ips { 10.0.0.1 }") {
		t.Fatalf("the nodeport-ips set lacks the node's address:\n%s", before)
	}
	read := d.localAddrs
	d.localAddrs = func() ([]netip.Addr, error) { return nil, errors.New("too many open files") }
	if err := d.Apply(context.Background(), snap, true); err == nil || !strings.Contains(err.Error(), "too many open files") {
		t.Fatalf("Apply with unreadable addresses: %v, want its error", err)
	}
	if diff := cmp.Diff(before, dump(k)); diff != "" {
		t.Errorf("the failed sync changed the table:\n%s", diff)
	}
	d.localAddrs = read
	apply(t, d, snap, true)
	apply(t, d, snap, false) // deletes what the rebuild after the failure superseded
	if diff := cmp.Diff(rebuilt(t, cfg, snap, "10.0.0.1", "192.168.0.1"), dump(k)); diff != "" {
		t.Errorf("after the addresses came back (-rebuild +got):\n%s", diff)
	}
}

// TestPeriodicSyncRepairs changes the table behind the dataplane's back and checks that a periodic sync
// notices, counts it and restores the table, and that an intact table is left alone.
func TestPeriodicSyncRepairs(t *testing.T) {
	st := steps()
	cfg := testConfig(v4, "10.244.0.0/16")
	dnsChain := prefixService + serviceBase(spn("ns/dns", "dns", v1.ProtocolUDP))
	for _, tc := range []struct {
		name   string
		damage func(tx *knftables.Transaction)
	}{
		{"table deleted", func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) }},
		{"chain deleted", func(tx *knftables.Transaction) {
			tx.Delete(&knftables.Element{Map: mapServiceIPs, Key: []string{"10.96.0.53", "udp", "53"}})
			tx.Delete(&knftables.Chain{Name: dnsChain})
		}},
		{"element deleted", func(tx *knftables.Transaction) {
			tx.Delete(&knftables.Element{Set: setClusterIPs, Key: []string{"10.96.0.10"}})
		}},
		{"element added", func(tx *knftables.Transaction) {
			tx.Add(&knftables.Element{Map: mapNoEndpointServices, Key: []string{"10.96.9.9", "tcp", "80"}, Value: []string{"drop"}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, k := testDataplane(cfg)
			apply(t, d, st[1], true)
			apply(t, d, st[1], true)
			if n := testutil.ToFloat64(d.metrics.removedExternally); n != 0 {
				t.Fatalf("an intact table counted as changed %v times", n)
			}
			good := dump(k)
			tx := k.fake.NewTransaction()
			tc.damage(tx)
			if err := k.fake.Run(context.Background(), tx); err != nil {
				t.Fatal(err)
			}
			apply(t, d, st[1], true)
			if n := testutil.ToFloat64(d.metrics.removedExternally); n != 1 {
				t.Errorf("removedExternally = %v, want 1", n)
			}
			apply(t, d, st[1], false)
			if diff := cmp.Diff(good, dump(k)); diff != "" {
				t.Errorf("not repaired (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStaleChainsAskForASync checks that once a sync flushed the chains of a removed Service, the watcher
// asks for another sync after the delay, which deletes them even when nothing else changes.
func TestStaleChainsAskForASync(t *testing.T) {
	st := steps()
	d, k := testDataplane(testConfig(v4, "10.244.0.0/16"))
	apply(t, d, st[0], true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	syncs := make(chan bool, 4)
	go d.Watch(ctx, time.Minute, func(full bool) { syncs <- full })
	gone := derive(st[0], []proxy.ServicePortName{spn("ns/web", "http", v1.ProtocolTCP)})
	apply(t, d, gone, false)
	chain := prefixService + serviceBase(spn("ns/web", "http", v1.ProtocolTCP))
	if !strings.Contains(dump(k), chain) {
		t.Fatalf("the flushed chain %s is already gone", chain)
	}
	start := time.Now()
	select {
	case full := <-syncs:
		if full {
			t.Fatal("asked for a full sync")
		}
		if waited := time.Since(start); waited < staleAfter {
			t.Errorf("asked after %v, before the chains are due (%v)", waited, staleAfter)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no sync asked for within 5 s")
	}
	apply(t, d, gone, false)
	if strings.Contains(dump(k), chain) {
		t.Errorf("the stale chain %s is still there", chain)
	}
}

// mapSteps are successive snapshots changing the endpoints of Services whose chains pick an endpoint
// through an anonymous map: a DNAT map, and a numgen verdict map with session affinity. The first is the
// starting point.
func mapSteps() []*proxy.Snapshot {
	n := node("10.0.0.1", "10.244.1.0/24")
	web := func(endpoints string) *proxy.ServicePort {
		return port("ns/web", "http", v1.ProtocolTCP, "10.96.0.10", 80, nodePort(30080), eps(strings.Split(endpoints, " ")...))
	}
	sticky := func(endpoints string) *proxy.ServicePort {
		return port("ns/sticky", "", v1.ProtocolTCP, "10.96.0.30", 80, affinity(600), eps(strings.Split(endpoints, " ")...))
	}
	s := snapshot(v4, n, web("10.244.1.5:8080,local 10.244.2.6:8080 10.244.3.6:8080"), sticky("10.244.1.5:8080,local 10.244.3.7:8080"))
	out := []*proxy.Snapshot{s}
	for _, change := range []*proxy.ServicePort{
		web("10.244.1.5:8080,local 10.244.3.6:8080"), // 3 -> 2 endpoints
		web("10.244.1.5:8080,local"),                 // 2 -> 1: a plain DNAT replaces the map
		web("10.244.1.5:8080,local 10.244.2.6:8080"), // 1 -> 2
		sticky("10.244.3.7:8080"),                    // an endpoint and its affinity set go
		sticky("10.244.3.7:8080 10.244.3.8:8080"),
		port("ns/sticky", "", v1.ProtocolTCP, "10.96.0.30", 80, eps("10.244.3.8:8080")), // affinity off
	} {
		s = derive(s, nil, change)
		out = append(out, s)
	}
	return out
}

// TestMapRulesOutliveTheirLastUse applies mapSteps and checks each transaction: it must not delete a rule
// with an anonymous map that packets can still reach before it, i.e. one that is not behind a rule that
// ends every packet's way through the chain. The kernel marks such a map's elements inactive as the
// transaction commits, while packets already in the chain still run the old rule: their lookup misses and
// they leave without DNAT (plan.supersede). After each step the leftovers are deleted by the next sync,
// and the table is what a rebuild writes.
func TestMapRulesOutliveTheirLastUse(t *testing.T) {
	cfg := testConfig(v4, "10.244.0.0/16")
	st := mapSteps()
	d, k := testDataplane(cfg)
	apply(t, d, st[0], true)
	var bad []string
	k.fail = func(tx *tx) error {
		// The rules packets can reach in each chain before the transaction, by handle.
		reachable := map[string]map[int]string{}
		for name, c := range k.fake.Table.Chains {
			reachable[name] = map[int]string{}
			for _, r := range c.Rules {
				reachable[name][*r.Handle] = r.Rule
				if strings.Contains(r.Rule, "dnat ") || strings.HasPrefix(r.Rule, "numgen random") {
					break // every packet ends here
				}
			}
		}
		hasMap := func(rule string) bool { return strings.Contains(rule, " map {") || strings.Contains(rule, " vmap {") }
		for _, o := range tx.ops {
			switch {
			case o.kind == opFlush && o.chain != nil:
				for _, r := range reachable[o.chain.name] {
					if hasMap(r) {
						bad = append(bad, "flush chain "+o.chain.name+" deletes the reachable "+r)
					}
				}
			case o.kind == opDelete && o.handle != 0:
				if r, ok := reachable[o.target][int(o.handle)]; ok && hasMap(r) {
					bad = append(bad, "a rule deletion deletes the reachable "+r)
				}
			}
		}
		return nil
	}
	for i, s := range st[1:] {
		apply(t, d, s, false)
		apply(t, d, s, false) // deletes what the step left behind
		for _, b := range bad {
			t.Errorf("step %d: %s", i+1, b)
		}
		bad = nil
		if diff := cmp.Diff(rebuilt(t, cfg, s), dump(k)); diff != "" {
			t.Fatalf("step %d: the table differs from a rebuild (-rebuild +partial):\n%s", i+1, diff)
		}
	}
}

// TestOldRulesGoUnderSteadyChurn rewrites a Service's map rule every 100 ms (less than staleAfter) and
// checks that the old rules left behind still get deleted: a chain rewritten again and again must not grow.
func TestOldRulesGoUnderSteadyChurn(t *testing.T) {
	st := mapSteps()
	d, k := testDataplane(testConfig(v4, "10.244.0.0/16"))
	clock := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	d.now = func() time.Time { clock = clock.Add(100 * time.Millisecond); return clock }
	apply(t, d, st[0], true)
	chain := prefixService + serviceBase(spn("ns/web", "http", v1.ProtocolTCP))
	most := 0
	for i := range 50 {
		apply(t, d, st[i%2], false)
		most = max(most, len(k.fake.Table.Chains[chain].Rules))
	}
	// Deleted a second after the oldest: at most one rule per sync of that second stays behind.
	if limit := int(staleAfter/(100*time.Millisecond)) + 2; most > limit {
		t.Errorf("%s held up to %d rules, want at most %d", chain, most, limit)
	}
}

// conntrackTable simulates the node's conntrack table for the dataplane: Clean deletes the flows that are
// stale for the snapshot, as conntrack.Cleaner deletes them from the kernel's.
type conntrackTable struct{ flows []conntrack.Flow }

func (c *conntrackTable) Clean(snap *proxy.Snapshot) error {
	c.flows = slices.DeleteFunc(c.flows, conntrack.NewStale(snap).IsStale)
	return nil
}

// TestFullSyncReconcilesConntrack: a UDP flow still steered to an endpoint the Service no longer has (one
// that slipped past an earlier cleanup) is deleted by the next full sync, as in modes iptables and ipvs,
// even when nothing changed; a partial sync without UDP changes leaves the table alone.
func TestFullSyncReconcilesConntrack(t *testing.T) {
	d, _ := testDataplane(testConfig(v4, "10.244.0.0/16"))
	table := &conntrackTable{}
	d.cleaner = table
	snap := snapshot(v4, node("10.0.0.1"), port("ns/dns", "dns", v1.ProtocolUDP, "10.96.0.53", 53, eps("10.244.1.2:5353")))
	apply(t, d, snap, true)
	live := conntrack.Flow{Protocol: 17, OrigDst: netip.MustParseAddrPort("10.96.0.53:53"), ReplySrc: netip.MustParseAddrPort("10.244.1.2:5353")}
	stale := conntrack.Flow{Protocol: 17, OrigDst: netip.MustParseAddrPort("10.96.0.53:53"), ReplySrc: netip.MustParseAddrPort("10.244.9.9:5353")}
	table.flows = []conntrack.Flow{live, stale}
	apply(t, d, snap, false)
	if len(table.flows) != 2 {
		t.Errorf("a partial sync without UDP changes cleaned conntrack: %v", table.flows)
	}
	apply(t, d, snap, true)
	if !slices.Equal(table.flows, []conntrack.Flow{live}) {
		t.Errorf("after a full sync the table holds %v, want only %v", table.flows, live)
	}
}
