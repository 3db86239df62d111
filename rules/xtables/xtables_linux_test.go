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
