package xtables

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// inNetNS runs the named test again inside a fresh network namespace (as root, with KP_E2E set) and
// reports its output; the child sees KP_IN_NETNS=1.
func inNetNS(t *testing.T, name string) {
	t.Helper()
	if os.Getenv("KP_E2E") == "" {
		t.Skip("kernel test: set KP_E2E=1 and run as root")
	}
	if os.Geteuid() != 0 {
		t.Fatal("KP_E2E is set but the test does not run as root")
	}
	ns := fmt.Sprintf("kpxt-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^"+name+"$", "-test.v")
	cmd.Env = append(os.Environ(), "KP_IN_NETNS=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("in netns: %v\n%s", err, out)
	}
}

func TestListChains(t *testing.T) {
	if os.Getenv("KP_IN_NETNS") != "1" {
		inNetNS(t, "TestListChains")
		return
	}
	ctx := context.Background()
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for _, b := range []Backend{BackendNFT, BackendLegacy} {
			r, err := NewRunner(b, family)
			if err != nil {
				t.Fatal(err)
			}
			before, err := r.ListChains(ctx, "nat")
			if err != nil {
				t.Fatalf("%s %s empty table: %v", b, family, err)
			}
			payload := "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAA - [0:0]\n:KUBE-SEP-BBBB - [0:0]\n-A KUBE-SVC-AAAA -j KUBE-SEP-BBBB\nCOMMIT\n"
			if err := r.Restore(ctx, []byte(payload)); err != nil {
				t.Fatal(err)
			}
			got, err := r.ListChains(ctx, "nat")
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"KUBE-SERVICES", "KUBE-SVC-AAAA", "KUBE-SEP-BBBB"} {
				if !slices.Contains(got, want) {
					t.Errorf("%s %s: ListChains = %v (before: %v), lacks %s", b, family, got, before, want)
				}
			}
			if filter, err := r.ListChains(ctx, "filter"); err != nil || slices.Contains(filter, "KUBE-SVC-AAAA") {
				t.Errorf("%s %s: filter chains %v %v", b, family, filter, err)
			}
		}
	}
}

// TestDetectLeavesLegacyAlone checks that picking the backend on a node whose rules are in nf_tables, with
// no hint chain, creates no legacy table: once one exists, every iptables-nft command warns that legacy
// tables are present. It also checks HasTable against the kernel's own list.
func TestDetectLeavesLegacyAlone(t *testing.T) {
	if os.Getenv("KP_IN_NETNS") != "1" {
		inNetNS(t, "TestDetectLeavesLegacyAlone")
		return
	}
	ctx := context.Background()
	nft, err := NewRunner(BackendNFT, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	if err := nft.Restore(ctx, []byte("*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		if HasTable(BackendLegacy, f, "") {
			t.Fatalf("a fresh namespace has legacy %s tables: %v", f, legacyTables(f))
		}
		if !HasTable(BackendNFT, f, "mangle") {
			t.Errorf("HasTable(nft, %s, mangle) = false, want true", f)
		}
	}
	b, why, err := Detect(ctx)
	if err != nil || b != BackendNFT {
		t.Fatalf("Detect = %s (%s), %v; want nft", b, why, err)
	}
	if got := legacyTables(v1.IPv4Protocol); len(got) != 0 {
		t.Errorf("Detect created legacy tables %v", got)
	}
	out, err := exec.Command("iptables-nft-save", "-t", "nat").CombinedOutput()
	if err != nil || strings.Contains(string(out), "Warning") {
		t.Errorf("iptables-nft-save after Detect: %v\n%s", err, out)
	}

	// A legacy table that exists is seen, and only that one.
	legacy, err := NewRunner(BackendLegacy, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	if err := legacy.Restore(ctx, []byte("*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	if !HasTable(BackendLegacy, v1.IPv4Protocol, "mangle") || HasTable(BackendLegacy, v1.IPv4Protocol, "nat") ||
		!HasTable(BackendLegacy, v1.IPv4Protocol, "") {
		t.Errorf("legacy tables %v: HasTable disagrees", legacyTables(v1.IPv4Protocol))
	}
	if b, why, err := Detect(ctx); err != nil || b != BackendLegacy {
		t.Errorf("with a legacy hint, Detect = %s (%s), %v; want legacy", b, why, err)
	}
}
