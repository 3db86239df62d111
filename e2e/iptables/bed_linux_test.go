package iptables

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

// baseConfig is the daemon configuration every test starts from: pods are in PodCIDR (so traffic from
// outside it is masqueraded), and syncs are not delayed.
const baseConfig = "mode: iptables\nclusterCIDR: " + harness.PodCIDR + "\n"

// syncConfig is the iptables section of most tests: partial syncs at once, a full one every 30 s.
const syncConfig = "iptables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n"

// The pod and Service ports of the bed (harness.WebPorts), short.
const (
	podTCP = harness.PodTCPPort
	podUDP = harness.PodUDPPort
	svcTCP = harness.ServiceTCPPort
	svcUDP = harness.ServiceUDPPort
)

// bed is one test's world (harness.Bed) and the iptables backend the daemon is steered to.
type bed struct {
	*harness.Bed
	t  *testing.T
	xt *harness.XTables
	d  *harness.Daemon
}

// newBed builds a bed with pods pod namespaces and a KUBE-IPTABLES-HINT chain in the mangle table of
// backend so that the daemon picks that backend.
func newBed(t *testing.T, backend string, pods int) *bed {
	t.Helper()
	b := &bed{t: t, Bed: harness.NewBed(t, harness.BedOptions{Pods: pods, Prefix: "ipt",
		Tools: []string{"iptables-nft", "iptables-legacy", "iptables-nft-save", "iptables-legacy-save"}})}
	ctx, cancel := b.Ctx()
	defer cancel()
	xt, err := harness.NewXTables(b.Topo.Node, backend, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b.xt = xt
	if err := xt.SetHint(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// start starts our daemon in the node namespace with baseConfig plus extra, and waits for READY=1 (its
// first sync done). Every daemon gets the test's private xtables lock file.
func (b *bed) start(extra string) *harness.Daemon {
	b.t.Helper()
	if extra == "" {
		extra = syncConfig
	}
	started := time.Now()
	b.d = harness.StartDaemon(b.t, b.Cluster, b.Topo.Node, harness.DaemonOptions{
		NodeName:   b.Node,
		Config:     baseConfig + extra,
		Env:        []string{b.xt.Env()},
		Kubeconfig: b.Kubeconfig,
	})
	b.t.Logf("kube-proxy (%s) ready %v after start", b.xt.Backend, time.Since(started).Round(time.Millisecond))
	return b.d
}

func ptr[T any](v T) *T { return &v }

// save returns iptables-save of one table (IPv4) in the bed's backend, parsed.
func (b *bed) save(t testing.TB, table string) *harness.SavedTable {
	t.Helper()
	return saveTable(t, b.xt, false, table)
}

func saveTable(t testing.TB, xt *harness.XTables, ipv6 bool, table string) *harness.SavedTable {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := xt.Save(ctx, ipv6, table)
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	tab := harness.ParseSave(out)[table]
	if tab == nil {
		return &harness.SavedTable{Chains: map[string]string{}}
	}
	return tab
}

// hashName is upstream's chain naming, written here independently of the daemon's code:
// prefix-<first 16 characters of base32(sha256(parts))>.
func hashName(prefix string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "")))
	return prefix + "-" + base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// svcChain returns the KUBE-SVC/SVL/EXT/FW chain of a Service port ("tcp" or "udp"; the protocol is the
// port's name).
func (b *bed) svcChain(prefix, svc, port string) string {
	return hashName(prefix, b.PortName(svc, port), port)
}

// sepChain returns the KUBE-SEP chain of pod i behind a Service port.
func (b *bed) sepChain(svc, port string, pod int) string {
	target := podTCP
	if port == "udp" {
		target = podUDP
	}
	return hashName("KUBE-SEP", b.PortName(svc, port), port, net.JoinHostPort(harness.PodIP(pod), strconv.Itoa(target)))
}

// waitChains waits until every chain in present exists and none in absent does, in the nat table.
func (b *bed) waitChains(t testing.TB, present, absent []string) {
	t.Helper()
	harness.Eventually(t, "nat chains", 30*time.Second, func() (bool, string) {
		nat := b.save(t, "nat")
		for _, c := range present {
			if _, ok := nat.Chains[c]; !ok {
				return false, c + " missing"
			}
		}
		for _, c := range absent {
			if _, ok := nat.Chains[c]; ok {
				return false, c + " still there"
			}
		}
		return true, ""
	})
}
