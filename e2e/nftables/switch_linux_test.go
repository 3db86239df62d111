package nftables

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// iptablesConfig runs our daemon in mode iptables.
const iptablesConfig = "mode: iptables\nclusterCIDR: " + harness.PodCIDR + "\niptables:\n  syncPeriod: 30s\n  minSyncPeriod: 0s\n"

// TestModeSwitch restarts our daemon on one node from mode iptables to mode nftables and back, with
// traffic flowing throughout: no connection may fail, and once the new mode's first sync is done, nothing
// of the other mode is left (no KUBE-* chain of ours in either iptables backend or family; no kube-proxy
// table in nftables). Kubelet's hint chain, which steers mode iptables to the nft backend, stays, and so
// does filter KUBE-FIREWALL: kubelet owns it, mode iptables writes a copy of it, and neither upstream nor
// ours removes it.
func TestModeSwitch(t *testing.T) {
	b := newBed(t, 3)
	harness.RequireCluster(t, "iptables-nft", "iptables-legacy", "iptables-nft-save", "iptables-legacy-save")
	web := b.CreateService(t, "web", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.ReadyEndpoint(2), harness.ReadyEndpoint(3))
	empty := b.CreateService(t, "empty", nil)
	xt, err := harness.NewXTables(b.Topo.Node, harness.BackendNFT, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := xt.SetHint(ctx); err != nil {
		t.Fatal(err)
	}
	legacy := &harness.XTables{NS: b.Topo.Node, Backend: harness.BackendLegacy, LockFile: xt.LockFile}
	ourChains := func() []string {
		var out []string
		for _, x := range []*harness.XTables{xt, legacy} {
			for _, c := range x.KubeChains(t) {
				if !strings.HasSuffix(c, "/mangle/KUBE-IPTABLES-HINT") && !strings.HasSuffix(c, "/filter/KUBE-FIREWALL") {
					out = append(out, x.Backend+" "+c)
				}
			}
		}
		return out
	}
	ourTables := func() []string {
		var out []string
		for _, tab := range b.tables(t) {
			if tab == "ip kube-proxy" || tab == "ip6 kube-proxy" {
				out = append(out, tab)
			}
		}
		return out
	}
	svcChain := "IPv4/nat/" + iptablesChain("KUBE-SVC", b.PortName("web", "tcp"), "tcp")
	targets := []harness.Target{
		{Network: "tcp", Addr: harness.HostPort(web.Spec.ClusterIP, svcTCP)},
		{Network: "udp", Addr: harness.HostPort(web.Spec.ClusterIP, svcUDP)},
		{Network: "tcp", Addr: harness.HostPort(harness.NodeIP, harness.NodePortOf(t, web, "tcp"))},
	}
	rejects := func(t *testing.T, label string) {
		t.Helper()
		harness.ExpectAllFail(t, label+": client -> empty", harness.HitForTest(t, b.Topo.Client, "tcp",
			harness.HostPort(empty.Spec.ClusterIP, svcTCP), 3, harness.HitOptions{}), "refused")
	}

	d := b.startWith(harness.DaemonOptions{Config: iptablesConfig, Env: []string{xt.Env()}})
	if chains := ourChains(); !slices.Contains(chains, "nft "+svcChain) {
		t.Fatalf("mode iptables wrote no %s: %v", svcChain, chains)
	}
	tr := harness.StartTraffic(b.Topo.Client, targets)
	tr.WaitFor(t, 100)

	for _, step := range []struct {
		mode, config string
		// left lists what of the other mode is still there.
		left func() []string
	}{
		{"nftables", baseConfig + syncConfig, ourChains},
		{"iptables", iptablesConfig, ourTables},
	} {
		if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		tr.WaitMore(t, 60)
		d.WriteConfig(step.config)
		stopped := time.Now()
		d.Start()
		ready := time.Now()
		harness.Eventually(t, "the other mode's rules to go after mode "+step.mode+"'s first sync", 10*time.Second, func() (bool, string) {
			left := step.left()
			return len(left) == 0, fmt.Sprint(left)
		})
		t.Logf("mode %s: ready %v after the stop; the other mode's rules gone %v after READY=1", step.mode,
			ready.Sub(stopped).Round(time.Millisecond), time.Since(ready).Round(time.Millisecond))
		switch step.mode {
		case "nftables":
			if ok, why := chainsAre(b.table(t, "ip"), []string{b.svcChain("service-", "web", "tcp")}, nil); !ok {
				t.Errorf("mode nftables: %s", why)
			}
		case "iptables":
			if !slices.Contains(ourChains(), "nft "+svcChain) {
				t.Errorf("mode iptables: no %s", svcChain)
			}
		}
		tr.WaitMore(t, 100)
		rejects(t, "mode "+step.mode)
	}
	harness.ExpectNoFailures(t, "iptables -> nftables -> iptables", tr.Stop())
	if chains := xt.KubeChains(t); !slices.Contains(chains, "IPv4/mangle/KUBE-IPTABLES-HINT") {
		t.Errorf("kubelet's hint chain went: %v", chains)
	}
}

// iptablesChain is upstream's naming of mode iptables' chains, written here independently of the
// daemon's code: prefix-<first 16 characters of base32(sha256(portName + protocol))>.
func iptablesChain(prefix, portName, protocol string) string {
	sum := sha256.Sum256([]byte(portName + protocol))
	return prefix + "-" + base32.StdEncoding.EncodeToString(sum[:])[:16]
}
