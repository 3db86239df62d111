package nftables

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

// baseConfig is the daemon configuration every test starts from: mode nftables, pods in PodCIDR (so
// traffic from outside it is masqueraded). nodePortAddresses is left unset: in mode nftables it defaults to
// the node's primary address, for us and for upstream.
const baseConfig = "mode: nftables\nclusterCIDR: " + harness.PodCIDR + "\n"

// syncConfig is the nftables section of most tests: partial syncs at once, a full one every 30 s.
const syncConfig = "nftables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n"

// The pod and Service ports of the bed (harness.WebPorts), short.
const (
	podTCP = harness.PodTCPPort
	podUDP = harness.PodUDPPort
	svcTCP = harness.ServiceTCPPort
	svcUDP = harness.ServiceUDPPort
)

// staleDelay is a little more than the delay after which a proxy deletes the chains it flushed (a
// second, for upstream and ours), at its next sync.
const staleDelay = 1200 * time.Millisecond

// families are the nftables families of the kube-proxy table, one per IP family.
var families = []string{"ip", "ip6"}

// bed is one test's world (harness.Bed) and the daemon it runs.
type bed struct {
	*harness.Bed
	t *testing.T
	d *harness.Daemon
}

func newBed(t *testing.T, pods int) *bed {
	t.Helper()
	return newBedWith(t, harness.BedOptions{Pods: pods})
}

// newBedWith is newBed with options; it fills in the namespace prefix and the nft command.
func newBedWith(t *testing.T, opts harness.BedOptions) *bed {
	t.Helper()
	opts.Prefix, opts.Tools = "nft", append(opts.Tools, "nft")
	return &bed{t: t, Bed: harness.NewBed(t, opts)}
}

// start starts our daemon in the node namespace with baseConfig plus extra (syncConfig when empty) and
// waits for READY=1: its first sync is done.
func (b *bed) start(extra string) *harness.Daemon {
	b.t.Helper()
	return b.startWith(harness.DaemonOptions{Config: baseConfig + orSync(extra)})
}

// startWith starts our daemon with opts, filling in the node name and kubeconfig.
func (b *bed) startWith(opts harness.DaemonOptions) *harness.Daemon {
	b.t.Helper()
	opts.NodeName, opts.Kubeconfig = b.Node, b.Kubeconfig
	started := time.Now()
	b.d = harness.StartDaemon(b.t, b.Cluster, b.Topo.Node, opts)
	if !opts.NoWaitReady {
		b.t.Logf("kube-proxy ready %v after start", time.Since(started).Round(time.Millisecond))
	}
	return b.d
}

func orSync(extra string) string {
	if extra == "" {
		return syncConfig
	}
	return extra
}

func ptr[T any](v T) *T { return &v }

// hashed is upstream's naming of per-Service chains and sets in mode nftables, written here independently
// of the daemon's code: the first 8 characters of base32(sha256(name)), a dash, and name.
func hashed(name string) string {
	sum := sha256.Sum256([]byte(name))
	return base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + name
}

// svcChain returns a Service port's chain with prefix "service-", "local-", "external-" or "firewall-":
// prefix + hashed("namespace/name/protocol/port"). The bed's port names are their protocols.
func (b *bed) svcChain(prefix, svc, port string) string {
	return prefix + hashed(b.NS+"/"+svc+"/"+port+"/"+port)
}

// endpointChain returns the chain ("endpoint-") or affinity set ("affinity-") of pod i behind a Service
// port: prefix + hashed("namespace/name/protocol/port__ip/targetPort").
func (b *bed) endpointChain(prefix, svc, port string, pod int) string {
	target := podTCP
	if port == "udp" {
		target = podUDP
	}
	return prefix + hashed(b.NS+"/"+svc+"/"+port+"/"+port+"__"+harness.PodIP(pod)+"/"+strconv.Itoa(target))
}

// table returns the node's kube-proxy table of family ("ip" or "ip6"), nil when there is none.
func (b *bed) table(t testing.TB, family string) *harness.NFTTable {
	t.Helper()
	return nftTable(t, b.Topo.Node, family)
}

func nftTable(t testing.TB, ns *harness.NetNS, family string) *harness.NFTTable {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tab, out, err := ns.NFTListTable(ctx, family, "kube-proxy")
	if err != nil {
		t.Fatalf("nft list table %s kube-proxy: %v\n%s", family, err, out)
	}
	return tab
}

// tables returns the node namespace's nftables tables ("family name").
func (b *bed) tables(t testing.TB) []string {
	t.Helper()
	ctx, cancel := b.Ctx()
	defer cancel()
	tabs, err := b.Topo.Node.NFTTables(ctx)
	if err != nil {
		t.Fatalf("nft list tables: %v", err)
	}
	return tabs
}

// nft runs nft in the node namespace, failing t on error.
func (b *bed) nft(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := b.Ctx()
	defer cancel()
	out, err := b.Topo.Node.NFT(ctx, args...)
	if err != nil {
		t.Fatalf("nft %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// waitChains waits until every chain in present exists in table ip kube-proxy and none in absent does.
func (b *bed) waitChains(t testing.TB, present, absent []string) {
	t.Helper()
	harness.Eventually(t, "chains of table ip kube-proxy", 30*time.Second, func() (bool, string) {
		return chainsAre(b.table(t, "ip"), present, absent)
	})
}

// chainsAre reports whether tab has every chain in present and none in absent, and if not, which one.
func chainsAre(tab *harness.NFTTable, present, absent []string) (bool, string) {
	if tab == nil {
		return false, "no table"
	}
	for _, c := range present {
		if tab.Block("chain", c) == nil {
			return false, c + " missing"
		}
	}
	for _, c := range absent {
		if tab.Block("chain", c) != nil {
			return false, c + " still there"
		}
	}
	return true, ""
}

// chainHas reports whether a chain of table ip kube-proxy exists and a rule of it contains s.
func (b *bed) chainHas(t testing.TB, chain, s string) bool {
	t.Helper()
	tab := b.table(t, "ip")
	if tab == nil || tab.Block("chain", chain) == nil {
		return false
	}
	return slices.ContainsFunc(tab.Block("chain", chain).Rules(), func(r string) bool { return strings.Contains(r, s) })
}

// isElementOf reports whether a set or map element is keyed by addr: the address alone, or first in a
// concatenation ("10.96.0.10 . tcp . 80 : goto ...").
func isElementOf(elem, addr string) bool { return elem == addr || strings.HasPrefix(elem, addr+" ") }

// isServiceObject reports whether a chain or set is a per-Service one: only those have a "/" in their names.
func isServiceObject(name string) bool { return strings.Contains(name, "/") }

// expectConverged checks both families' tables after a sync: present, no chain holding the same rule twice,
// no per-Service chain that nothing refers to (a stale one), and no per-Service set nothing refers to.
func expectConverged(t testing.TB, label string, tabs map[string]*harness.NFTTable) {
	t.Helper()
	for _, fam := range families {
		tab := tabs[fam]
		if tab == nil {
			t.Errorf("%s: no table %s kube-proxy", label, fam)
			continue
		}
		refs := map[string]bool{}
		for _, blk := range tab.Blocks {
			for _, l := range slices.Concat(blk.Lines, blk.Elements) {
				for _, f := range strings.FieldsFunc(l, func(r rune) bool { return r == ' ' || r == ',' || r == '{' || r == '}' }) {
					refs[strings.TrimPrefix(f, "@")] = true
				}
			}
		}
		for _, blk := range tab.Blocks {
			if blk.Kind == "chain" {
				seen := map[string]int{}
				for _, r := range blk.Rules() {
					seen[r]++
				}
				for r, n := range seen {
					if n > 1 {
						t.Errorf("%s: %s chain %s holds %d copies of %s", label, fam, blk.Name, n, r)
					}
				}
			}
			if isServiceObject(blk.Name) && !refs[blk.Name] {
				t.Errorf("%s: %s %s %s is stale: nothing refers to it", label, fam, blk.Kind, blk.Name)
			}
		}
	}
}

// listings returns both families' kube-proxy tables, parsed (a missing one is nil).
func (b *bed) listings(t testing.TB) map[string]*harness.NFTTable {
	t.Helper()
	out := map[string]*harness.NFTTable{}
	for _, fam := range families {
		out[fam] = b.table(t, fam)
	}
	return out
}

// normalized renders both families' tables with harness.NFTTable.Normalized, "" for a missing one.
func normalized(tabs map[string]*harness.NFTTable) map[string]string {
	out := map[string]string{}
	for fam, tab := range tabs {
		if tab != nil {
			out[fam] = tab.Normalized()
		}
	}
	return out
}

// waitSettled waits until both families' tables exist, hold every chain in want (table ip; in a
// dual-stack bed table ip6 too), and read the same (normalised) twice in a row more than staleDelay apart,
// and returns the last reading. It is how a test knows that a proxy has written everything, including
// upstream's, which reports healthy before it syncs and syncs each family on its own, and that ours has
// deleted what its rewrite left for a second later (the old rules behind the ones it inserted into the
// Service chains that were there).
func (b *bed) waitSettled(t testing.TB, want []string) map[string]*harness.NFTTable {
	t.Helper()
	withChains := []string{"ip"}
	if b.DualStack {
		withChains = families
	}
	var last map[string]string
	var tabs map[string]*harness.NFTTable
	harness.Eventually(t, "both tables to settle", 60*time.Second, func() (bool, string) {
		time.Sleep(staleDelay)
		tabs = b.listings(t)
		for _, fam := range families {
			if tabs[fam] == nil {
				last = nil
				return false, "no table " + fam
			}
		}
		for _, fam := range withChains {
			if ok, why := chainsAre(tabs[fam], want, nil); !ok {
				last = nil
				return false, fam + ": " + why
			}
		}
		cur := normalized(tabs)
		same := last != nil && cur["ip"] == last["ip"] && cur["ip6"] == last["ip6"]
		last = cur
		return same, "still changing"
	})
	return tabs
}

// lineDiff renders the difference between two texts line by line (a longest common subsequence), with
// "-" for lines only in a and "+" for lines only in b, and two lines of context.
func lineDiff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	n, m := len(x), len(y)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type line struct {
		op   byte
		text string
	}
	var all []line
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && x[i] == y[j]:
			all = append(all, line{' ', x[i]})
			i++
			j++
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			all = append(all, line{'-', x[i]})
			i++
		default:
			all = append(all, line{'+', y[j]})
			j++
		}
	}
	var sb strings.Builder
	lastOut := -1
	for k, l := range all {
		near := false
		for d := -2; d <= 2; d++ {
			if k+d >= 0 && k+d < len(all) && all[k+d].op != ' ' {
				near = true
			}
		}
		if !near {
			continue
		}
		if lastOut >= 0 && k > lastOut+1 {
			sb.WriteString("  ...\n")
		}
		fmt.Fprintf(&sb, "%c %s\n", l.op, l.text)
		lastOut = k
	}
	return sb.String()
}

// changedExternally returns kubeproxy_nftables_changed_externally_total of a family ("IPv4", "IPv6").
func changedExternally(t testing.TB, d *harness.Daemon, family string) float64 {
	t.Helper()
	v, found := d.Metric(t, "kubeproxy_nftables_changed_externally_total", `ip_family="`+family+`"`)
	if !found {
		t.Fatalf("no %s kubeproxy_nftables_changed_externally_total in /metrics", family)
	}
	return v
}

// syncFailures sums kubeproxy_sync_proxy_rules_nftables_sync_failures_total over the families.
func syncFailures(t testing.TB, d *harness.Daemon) float64 {
	t.Helper()
	return d.MetricOverFamilies(t, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total")
}

// upstreamSettled starts upstream kube-proxy with opts and waits until its tables hold the chains want
// and settle. Upstream v1.37 can miss the Node's zone label for good: its NodeTopologyConfig adds its
// informer handler before it registers the proxier, and the Node's add event can arrive in between;
// later events carry the same label and are ignored. It then logs "node is missing label" on every sync
// and ignores zone hints, which is a race of upstream's, not a difference of rule shapes. Such a run is
// stopped and upstream started again (up to three times), so that the tables compared are both the
// intended ones.
func (b *bed) upstreamSettled(t testing.TB, opts harness.UpstreamOptions, want []string) (*harness.Upstream, map[string]*harness.NFTTable) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		up := harness.StartUpstream(t, b.Cluster, b.Topo.Node, opts)
		tabs := b.waitSettled(t, want)
		if !strings.Contains(up.Proc.Log(), "node is missing label") || attempt == 3 {
			return up, tabs
		}
		t.Logf("upstream kube-proxy missed the Node's zone label (its own start-up race); starting it again")
		if err := up.Proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}
