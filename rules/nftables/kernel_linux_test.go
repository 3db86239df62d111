package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netns"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/config"
	"kube-proxy/proxy"
	"kube-proxy/rules/internal/netnstest"
	"kube-proxy/rules/internal/tracecases"
	"kube-proxy/rules/nftables/nftrace"
)

// nsHandle opens a test namespace for the netlink writer.
func nsHandle(t *testing.T, ns *netnstest.NS) netns.NsHandle {
	t.Helper()
	h, err := netns.GetFromName(ns.Name)
	if err != nil {
		t.Fatalf("opening namespace %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func netlinkKernelIn(t *testing.T, family v1.IPFamily, ns *netnstest.NS) *netlinkKernel {
	t.Helper()
	k, err := newNetlinkKernel(familyOf(family), nsHandle(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

var (
	anonName = regexp.MustCompile(`__(set|map)[0-9]+`)
	handle   = regexp.MustCompile(`(?m)^(ip6? kube-proxy \S+) [0-9]+( [0-9]+)?$`)
)

// listings returns `nft list table` and the bytecode nft reads back (anonymous set numbers and rule
// handles removed: they are the kernel's or the writer's choice).
func listings(t *testing.T, ns *netnstest.NS, family v1.IPFamily) (string, string) {
	t.Helper()
	fam := familyOf(family).name
	text, err := ns.Exec(nil, "nft", "list", "table", fam, TableName)
	if err != nil {
		t.Fatal(err)
	}
	code, err := ns.Exec(nil, "nft", "--debug=netlink", "list", "table", fam, TableName)
	if err != nil {
		t.Fatal(err)
	}
	code = handle.ReplaceAllString(anonName.ReplaceAllString(code, "__$1N"), "$1")
	return text, sortElements(code)
}

// sortElements sorts the element lines of each set in nft's bytecode listing: a hash set lists its
// elements in an order of its own.
func sortElements(code string) string {
	lines := strings.Split(code, "\n")
	for i := 0; i < len(lines); {
		j := i
		for j < len(lines) && strings.HasPrefix(lines[j], "\telement ") {
			j++
		}
		slices.Sort(lines[i:j])
		i = j + 1
	}
	return strings.Join(lines, "\n")
}

// TestNetlinkWritesWhatNFTWrites writes the same transactions with the netlink writer and with `nft -f`
// into two namespaces and compares what nft lists, text and bytecode.
func TestNetlinkWritesWhatNFTWrites(t *testing.T) {
	for _, family := range []v1.IPFamily{v4, v6} {
		for _, tc := range []struct {
			name string
			edit func(c *Config)
		}{
			{"defaults", func(*Config) {}},
			{"localhost reject, masquerade all, bit 0", func(c *Config) { c.LocalhostReject, c.MasqueradeAll, c.MasqueradeBit = true, true, 0 }},
			{"primary NodePorts, bridge", func(c *Config) {
				c.NodePortAddresses.Primary = true
				c.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeBridgeInterface, Interface: "cbr0"}
			}},
			{"interface prefix, node CIDR /20", func(c *Config) {
				c.LocalDetector = proxy.LocalDetector{Mode: config.LocalModeInterfaceNamePrefix, Interface: "veth"}
			}},
		} {
			t.Run(string(family)+"/"+tc.name, func(t *testing.T) {
				cfg := testConfig(family, testClusterCIDR(family))
				tc.edit(&cfg)
				compareWrites(t, family, cfg, richSnapshot(family))
			})
		}
	}
}

func testClusterCIDR(family v1.IPFamily) string {
	if family == v6 {
		return "fd00:10:244::/48"
	}
	return "10.244.0.0/16"
}

// compareWrites writes the rebuild of snap with `nft -f` and with the netlink writer into two namespaces
// and compares what nft lists, text and bytecode.
func compareWrites(t *testing.T, family v1.IPFamily, cfg Config, snap *proxy.Snapshot) {
	t.Helper()
	ref, ours := netnstest.New(t), netnstest.New(t)
	d, _ := testDataplane(cfg, "10.0.0.1", "fd00::1")
	in, err := d.inputs(snap, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := planRebuild(newRenderer(cfg), snap, &in, nil, chunk{anonSets: 2, ops: 1000})
	k := netlinkKernelIn(t, family, ours)
	for i, tx := range p.txs {
		if _, err := ref.Exec([]byte(tx.String()), "nft", "-f", "-"); err != nil {
			t.Fatalf("nft -f of transaction %d: %v\n%.2000s", i, err, tx)
		}
		if err := k.Run(context.Background(), tx); err != nil {
			t.Fatalf("netlink transaction %d: %.2000v", i, err)
		}
	}
	refText, refCode := listings(t, ref, family)
	ourText, ourCode := listings(t, ours, family)
	if diff := cmp.Diff(refText, ourText); diff != "" {
		t.Errorf("nft list table (-nft -f +netlink):\n%.5000s", diff)
	}
	if diff := cmp.Diff(refCode, ourCode); diff != "" {
		t.Errorf("nft --debug=netlink list table (-nft -f +netlink):\n%.5000s", diff)
	}
	if t.Failed() {
		t.Logf("nft -f wrote:\n%.5000s", refText)
	}
}

// TestNetlinkWritesAServiceWithManyEndpoints: the numgen map of a Service with 5,000 endpoints is an
// anonymous map far larger than one netlink attribute (64 KiB) can hold; its elements go in several
// messages, and the table reads as nft -f writes it.
func TestNetlinkWritesAServiceWithManyEndpoints(t *testing.T) {
	for _, family := range []v1.IPFamily{v4, v6} {
		t.Run(string(family), func(t *testing.T) {
			var list []string
			for i := range 5000 {
				if family == v6 {
					list = append(list, fmt.Sprintf("[fd00:10:246::%x]:8080", i+1))
				} else {
					list = append(list, fmt.Sprintf("10.246.%d.%d:8080", i/250, i%250+1))
				}
			}
			cip := "10.96.0.70"
			if family == v6 {
				cip = "fd00:96::70"
			}
			snap := derive(richSnapshot(family), nil, port("ns/big", "", v1.ProtocolTCP, cip, 80, eps(list...)))
			compareWrites(t, family, testConfig(family, testClusterCIDR(family)), snap)
		})
	}
}

// TestNetlinkReadsBack checks that Read returns what the writer wrote, and nil without a table.
func TestNetlinkReadsBack(t *testing.T) {
	ns := netnstest.New(t)
	k := netlinkKernelIn(t, v4, ns)
	ks, err := k.Read(context.Background())
	if err != nil || ks != nil {
		t.Fatalf("Read of a missing table = %v, %v; want nil, nil", ks, err)
	}
	cfg := testConfig(v4, "10.244.0.0/16")
	d := newDataplane(cfg, k, nil, NewMetrics(nil, false))
	snap := richSnapshot(v4)
	apply(t, d, snap, true)
	ks, err = k.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if why := d.m.diff(ks); why != "" {
		t.Errorf("the table read back differs from what was written: %s", why)
		for ref, v := range ks.elems {
			if e := d.m.elems[ref]; e == nil || e.written != v {
				t.Logf("read %+v = %+v, wrote %+v", ref, v, e)
			}
		}
	}
	if !strings.Contains(strings.Join(keys(ks.chains), " "), "reject-chain") {
		t.Errorf("chains read back: %v", keys(ks.chains))
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestNetlinkPartialSyncs applies the partial-sync steps (and mapSteps: rules inserted ahead of old ones,
// which are deleted by handle) through the netlink writer and checks after each that the kernel's table
// reads like a fresh rebuild of the same snapshot written by `nft -f`.
func TestNetlinkPartialSyncs(t *testing.T) {
	for name, st := range map[string][]*proxy.Snapshot{"steps": steps(), "mapSteps": mapSteps()} {
		t.Run(name, func(t *testing.T) { netlinkPartialSyncs(t, st) })
	}
}

func netlinkPartialSyncs(t *testing.T, st []*proxy.Snapshot) {
	ns := netnstest.New(t)
	cfg := testConfig(v4, "10.244.0.0/16")
	d := newDataplane(cfg, netlinkKernelIn(t, v4, ns), nil, NewMetrics(nil, false))
	d.localAddrs = func() ([]netip.Addr, error) { return nil, nil } // testConfig: NodePorts on every address
	clock := time.Now()
	d.now = func() time.Time { clock = clock.Add(time.Minute); return clock }
	for i, s := range st {
		apply(t, d, s, i == 0)
		apply(t, d, s, false) // deletes the chains the step flushed
		ref := netnstest.New(t)
		in, err := d.inputs(s, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := planRebuild(newRenderer(cfg), s, &in, nil, defaultChunk)
		for _, tx := range p.txs {
			if _, err := ref.Exec([]byte(tx.String()), "nft", "-f", "-"); err != nil {
				t.Fatal(err)
			}
		}
		want, _ := listings(t, ref, v4)
		got, _ := listings(t, ns, v4)
		if diff := cmp.Diff(sortedBlocks(want), sortedBlocks(got)); diff != "" {
			t.Fatalf("step %d (-rebuild +partial):\n%s", i, diff)
		}
	}
}

// sortedBlocks returns an `nft list table` output with its top-level blocks (chains, sets, maps) sorted
// and the elements of each set sorted: the kernel lists blocks in the order they were created.
func sortedBlocks(listing string) string {
	var blocks []string
	var cur []string
	for _, l := range strings.Split(listing, "\n") {
		switch {
		case strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "\t\t") && strings.HasSuffix(l, "{"):
			cur = []string{l}
		case l == "\t}":
			cur = append(cur, l)
			blocks = append(blocks, strings.Join(cur, "\n"))
			cur = nil
		case cur != nil:
			cur = append(cur, l)
		}
	}
	slices.Sort(blocks)
	return strings.Join(blocks, "\n")
}

// TestTraceCasesKernel writes the table of truth's snapshot into a real kernel with the netlink writer and
// runs the shared cases over what `nft list table` shows: the tracer reads the kernel's state.
func TestTraceCasesKernel(t *testing.T) {
	ns := netnstest.New(t)
	d := newDataplane(caseConfig(), netlinkKernelIn(t, v4, ns), nil, NewMetrics(nil, false))
	d.localAddrs = func() ([]netip.Addr, error) { return nil, nil } // testConfig: NodePorts on every address
	apply(t, d, tracecases.Snapshot(), true)
	listing, err := ns.Exec(nil, "nft", "list", "table", "ip", TableName)
	if err != nil {
		t.Fatal(err)
	}
	ts := nftrace.New()
	if err := ts.Load(listing); err != nil {
		t.Fatalf("the tracer cannot read nft's listing: %v\n%s", err, listing)
	}
	tracecases.Run(t, tracecases.NFTables, tracer(ts))
}

// TestWatchAndCheckRepair deletes the table behind the dataplane's back (the watcher asks for a rewrite
// within seconds) and changes a base chain's priority (the periodic check finds it): both are counted
// once and repaired by the next sync.
func TestWatchAndCheckRepair(t *testing.T) {
	ns := netnstest.New(t)
	k := netlinkKernelIn(t, v4, ns)
	d := newDataplane(caseConfig(), k, nil, NewMetrics(nil, false))
	d.localAddrs = func() ([]netip.Addr, error) { return nil, nil } // testConfig: NodePorts on every address
	clock := time.Now()
	d.now = func() time.Time { clock = clock.Add(time.Minute); return clock }
	snap := tracecases.Snapshot()
	apply(t, d, snap, true)
	want, _ := listings(t, ns, v4)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resync := make(chan struct{}, 1)
	// Watch reads through its own netlink socket, in the test's namespace: run it on a thread inside ns.
	go func() {
		runtime.LockOSThread()
		h := nsHandle(t, ns)
		if err := netns.Set(h); err != nil {
			t.Error(err)
			return
		}
		d.Watch(ctx, time.Second, func(full bool) {
			if full {
				resync <- struct{}{}
			}
		})
	}()
	if _, err := ns.Exec(nil, "nft", "delete", "table", "ip", TableName); err != nil {
		t.Fatal(err)
	}
	select {
	case <-resync:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not notice the deleted table within 10 s")
	}
	apply(t, d, snap, false)
	if got, _ := listings(t, ns, v4); sortedBlocks(got) != sortedBlocks(want) {
		t.Errorf("not restored after the table was deleted:\n%s", got)
	}
	if n := testutil.ToFloat64(d.metrics.removedExternally); n != 1 {
		t.Errorf("removedExternally = %v after the deleted table, want 1", n)
	}

	if _, err := ns.Exec([]byte("delete chain ip kube-proxy nat-output\nadd chain ip kube-proxy nat-output { type nat hook output priority 50 ; }\n"), "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	apply(t, d, snap, true)
	// The rewrite inserted the Service chains' rules ahead of the old ones; the next sync deletes those.
	apply(t, d, snap, false)
	if got, _ := listings(t, ns, v4); sortedBlocks(got) != sortedBlocks(want) {
		t.Errorf("not restored after a base chain's priority changed:\n%s", got)
	}
	if n := testutil.ToFloat64(d.metrics.removedExternally); n != 2 {
		t.Errorf("removedExternally = %v after the priority change, want 2", n)
	}
}
