package iptables

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// kubeletChains are what kubelet keeps in iptables (per backend, IPv4 and IPv6): its hint and canary
// chains, and KUBE-FIREWALL with the rule blocking martian packets to 127.0.0.0/8 that route_localnet
// would let in, jumped to from INPUT and OUTPUT. kube-proxy writes a duplicate of KUBE-FIREWALL and, like
// upstream, must not remove it on cleanup.
func addKubeletChains(t *testing.T, xt *harness.XTables) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(ipv6 bool, args ...string) {
		if _, err := xt.Run(ctx, ipv6, "", args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, ipv6 := range []bool{false, true} {
		for _, table := range []string{"mangle", "nat", "filter"} {
			run(ipv6, "-t", table, "-N", "KUBE-KUBELET-CANARY")
		}
		run(ipv6, "-t", "filter", "-N", "KUBE-FIREWALL")
		run(ipv6, "-t", "filter", "-I", "INPUT", "-j", "KUBE-FIREWALL")
		run(ipv6, "-t", "filter", "-I", "OUTPUT", "-j", "KUBE-FIREWALL")
	}
	run(false, "-t", "filter", "-A", "KUBE-FIREWALL", "-m", "comment", "--comment", "block incoming localnet connections",
		"-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8", "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP")
	// And a rule of the admin's own, which must survive too.
	run(false, "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
}

// othersChain reports whether a KUBE-* chain ("family/table/chain") belongs to another component.
func othersChain(c string) bool {
	_, name, _ := strings.Cut(c[strings.Index(c, "/")+1:], "/")
	return name == "KUBE-IPTABLES-HINT" || name == "KUBE-KUBELET-CANARY" ||
		(strings.HasSuffix(c, "/filter/KUBE-FIREWALL"))
}

// TestCleanup fills both backends with our rules (the daemon runs once steered to legacy, then once to
// nft), next to kubelet's chains, and checks that one `kube-proxy --cleanup` removes all of ours from both
// backends and both families, and nothing else.
func TestCleanup(t *testing.T) {
	b := newBed(t, harness.BackendLegacy, 2)
	web := b.CreateService(t, "web", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.RemoteEndpoint(2))
	b.CreateService(t, "empty", nil)
	legacy := b.xt
	nft := &harness.XTables{NS: b.Topo.Node, Backend: harness.BackendNFT, LockFile: legacy.LockFile}
	addKubeletChains(t, legacy)

	d := b.start("")
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Kubelet's chains in nft too (as if kubelet had switched backends): its canary there now wins (nft is
	// looked at first), so the next run writes the nft backend.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addKubeletChains(t, nft)
	d.Start()
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, xt := range []*harness.XTables{legacy, nft} {
		chains := xt.KubeChains(t)
		want := "IPv4/nat/" + b.svcChain("KUBE-SVC", "web", "tcp")
		if !slices.Contains(chains, want) {
			t.Fatalf("before cleanup the %s backend lacks %s: %v", xt.Backend, want, chains)
		}
	}
	if web.Spec.HealthCheckNodePort == 0 {
		t.Fatal("web has no health check node port")
	}

	bin, err := harness.DaemonBinary()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := b.Topo.Node.RunEnv(ctx, []string{legacy.Env()}, bin, "--cleanup", "--v=2")
	t.Logf("kube-proxy --cleanup (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("kube-proxy --cleanup: %v", err)
	}
	for _, xt := range []*harness.XTables{legacy, nft} {
		for _, c := range xt.KubeChains(t) {
			if !othersChain(c) {
				t.Errorf("%s backend: --cleanup left %s", xt.Backend, c)
			}
		}
		for _, ipv6 := range []bool{false, true} {
			all, err := xt.Save(ctx, ipv6, "")
			if err != nil {
				t.Fatal(err)
			}
			for table, tab := range harness.ParseSave(all) {
				for _, r := range tab.Rules {
					if strings.Contains(r, "-j KUBE-") && !strings.HasSuffix(r, "-j KUBE-FIREWALL") {
						t.Errorf("%s backend, %s (IPv6 %v): --cleanup left %s", xt.Backend, table, ipv6, r)
					}
				}
				for _, c := range []string{"KUBE-KUBELET-CANARY"} {
					if _, ok := tab.Chains[c]; !ok {
						t.Errorf("%s backend, %s (IPv6 %v): --cleanup removed kubelet's %s", xt.Backend, table, ipv6, c)
					}
				}
			}
			filter := harness.ParseSave(all)["filter"]
			for _, builtin := range []string{"INPUT", "OUTPUT"} {
				if !slices.Contains(filter.RulesOf(builtin), "-A "+builtin+" -j KUBE-FIREWALL") {
					t.Errorf("%s backend (IPv6 %v): --cleanup removed kubelet's jump from %s to KUBE-FIREWALL", xt.Backend, ipv6, builtin)
				}
			}
			if !ipv6 {
				if !slices.Contains(filter.RulesOf("INPUT"), "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT") {
					t.Errorf("%s backend: --cleanup removed the admin's own INPUT rule", xt.Backend)
				}
				if fw := filter.RulesOf("KUBE-FIREWALL"); len(fw) != 1 || !strings.Contains(fw[0], "-j DROP") {
					t.Errorf("%s backend: kubelet's KUBE-FIREWALL after --cleanup: %q, want its one DROP rule", xt.Backend, fw)
				}
			}
		}
	}
}
