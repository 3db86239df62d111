package nftables

import (
	"context"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kube-proxy/e2e/harness"
)

// othersTables are tables of other components in the node namespace: `--cleanup` must leave them as they
// are, including one named kube-proxy in a family that is not ours.
const othersTables = `table inet other {
	set blocked {
		type ipv4_addr
		elements = { 192.0.2.1, 192.0.2.2 }
	}

	chain input {
		type filter hook input priority filter + 10; policy accept;
		ip saddr @blocked drop
		tcp dport 22 accept
	}
}
table inet kube-proxy {
	chain forward {
		type filter hook forward priority filter + 10; policy accept;
		ct state invalid drop
	}
}
`

// TestCleanup runs our daemon in mode nftables next to tables of other components, then `kube-proxy
// --cleanup`: no kube-proxy table is left in family ip or ip6, the other tables read as before, and no
// table was added. Then the same over upstream kube-proxy's tables.
func TestCleanup(t *testing.T) {
	b := newBed(t, 2)
	web := b.CreateService(t, "web", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})
	b.SetEndpoints(t, "web", harness.ReadyEndpoint(1), harness.RemoteEndpoint(2))
	b.CreateService(t, "empty", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	others := writeTables(t, b, othersTables)
	before := b.tables(t)
	bin, err := harness.DaemonBinary()
	if err != nil {
		t.Fatal(err)
	}
	cleanup := func(t *testing.T, label string) {
		t.Helper()
		start := time.Now()
		out, err := b.Topo.Node.Run(ctx, bin, "--cleanup", "--v=2")
		t.Logf("%s: kube-proxy --cleanup (%v):\n%s", label, time.Since(start).Round(time.Millisecond), out)
		if err != nil {
			t.Fatalf("kube-proxy --cleanup: %v", err)
		}
		if after := b.tables(t); !slices.Equal(after, before) {
			t.Errorf("%s: tables after --cleanup %q, want %q (the others' tables only)", label, after, before)
		}
		if now := normalizedTables(t, b, "inet other", "inet kube-proxy"); now != others {
			t.Errorf("%s: --cleanup changed the other tables (- before, + after):\n%s", label, lineDiff(others, now))
		}
	}

	d := b.start("")
	b.waitChains(t, []string{b.svcChain("service-", "web", "tcp"), b.endpointChain("endpoint-", "web", "tcp", 1)}, nil)
	if web.Spec.HealthCheckNodePort == 0 {
		t.Fatal("web has no health check node port")
	}
	if err := d.Proc.Stop(syscall.SIGTERM, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		if b.table(t, fam) == nil {
			t.Fatalf("before the cleanup there is no table %s kube-proxy", fam)
		}
	}
	cleanup(t, "ours")

	up := harness.StartUpstream(t, b.Cluster, b.Topo.Node, harness.UpstreamOptions{NodeName: b.Node, Config: baseConfig + syncConfig, Kubeconfig: b.Kubeconfig})
	b.waitSettled(t, []string{b.svcChain("service-", "web", "tcp")})
	if err := up.Proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	cleanup(t, "upstream's")
}

// writeTables loads an nft ruleset into the node namespace and returns it as listed, normalised.
func writeTables(t *testing.T, b *bed, ruleset string) string {
	t.Helper()
	path := t.TempDir() + "/tables.nft"
	if err := os.WriteFile(path, []byte(ruleset), 0o644); err != nil {
		t.Fatal(err)
	}
	b.nft(t, "-f", path)
	return normalizedTables(t, b, "inet other", "inet kube-proxy")
}

// normalizedTables lists tables ("family name") of the node namespace, normalised, one after the other.
func normalizedTables(t *testing.T, b *bed, tables ...string) string {
	t.Helper()
	var out string
	for _, tab := range tables {
		listing := b.nft(t, append([]string{"list", "table"}, strings.Fields(tab)...)...)
		n, err := harness.NormalizeNFT(listing)
		if err != nil {
			t.Fatal(err)
		}
		out += n
	}
	return out
}
