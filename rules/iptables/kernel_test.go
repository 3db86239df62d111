package iptables

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"kube-proxy/proxy"
	"kube-proxy/rules/internal/netnstest"
	"kube-proxy/rules/iptables/iptrace"
)

// seed000Lines are the lines the issue requires `iptables-save -t nat` to print for seed 000.
var seed000Lines = []string{
	`-A KUBE-SEP-HHZALBXPKUQGKXIS -p tcp -m comment --comment "default/clusterip-service" -m tcp -j DNAT --to-destination 192.168.11.73:80`,
	`-A KUBE-SEP-KTW4ECSLTAZBS6DP -p tcp -m comment --comment "default/clusterip-service" -m tcp -j DNAT --to-destination 192.168.221.10:80`,
	`-A KUBE-SEP-ZLBN6JBW2CKLO4TA -p tcp -m comment --comment "default/clusterip-service" -m tcp -j DNAT --to-destination 192.168.11.74:80`,
	`-A KUBE-SERVICES -d 10.100.100.100/32 -p tcp -m comment --comment "default/clusterip-service cluster IP" -m tcp --dport 80 -j KUBE-SVC-KUSV3H3OUX7H3MDQ`,
	`-A KUBE-SVC-KUSV3H3OUX7H3MDQ -m comment --comment "default/clusterip-service -> 192.168.11.73:80" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-HHZALBXPKUQGKXIS`,
	`-A KUBE-SVC-KUSV3H3OUX7H3MDQ -m comment --comment "default/clusterip-service -> 192.168.11.74:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-ZLBN6JBW2CKLO4TA`,
	`-A KUBE-SVC-KUSV3H3OUX7H3MDQ -m comment --comment "default/clusterip-service -> 192.168.221.10:80" -j KUBE-SEP-KTW4ECSLTAZBS6DP`,
}

func checkSeed000(t *testing.T, saved string) {
	t.Helper()
	lines := strings.Split(saved, "\n")
	for _, want := range seed000Lines {
		found := false
		for _, l := range lines {
			if l == want {
				found = true
			}
		}
		if !found {
			t.Errorf("iptables-save -t nat lacks\n%s\nit printed:\n%s", want, saved)
		}
	}
}

// TestSeed000Fake checks the seed 000 lines against the tracer's iptables-save emulation; it runs
// everywhere. TestSeed000Kernel checks them against the real thing.
func TestSeed000Fake(t *testing.T) {
	res, err := NewRenderer(testConfig(v4, proxy.LocalDetector{})).Render(seed000(), nil, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := iptrace.New(false)
	if err := ts.Restore(res.Payload, iptrace.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatal(err)
	}
	checkSeed000(t, ts.Save("nat"))
}

// TestSeed000Kernel loads seed 000's payload into a real kernel in a fresh network namespace with
// iptables-nft-restore and iptables-legacy-restore and checks the seven lines of `iptables-save -t nat`.
func TestSeed000Kernel(t *testing.T) {
	for _, backend := range netnstest.Backends {
		t.Run(backend, func(t *testing.T) {
			ns := netnstest.New(t)
			netnstest.Check(t, backend, false)
			res, err := NewRenderer(testConfig(v4, proxy.LocalDetector{})).Render(seed000(), nil, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := ns.Restore(backend, false, res.Payload, "--noflush"); err != nil {
				t.Fatal(err)
			}
			saved, err := ns.Save(backend, false, "nat")
			if err != nil {
				t.Fatal(err)
			}
			checkSeed000(t, saved)
		})
	}
}

// TestGoldenKernel applies every golden case's payloads, step by step, and the jump rules to a real kernel
// with both backends, and compares iptables-save with the tracer's emulation of the same restores: the
// payloads load, and the fake kernel the tracer and the writer's tests use behaves like the real one.
func TestGoldenKernel(t *testing.T) {
	for _, backend := range netnstest.Backends {
		for _, gc := range goldenCases() {
			t.Run(backend+"/"+gc.name, func(t *testing.T) {
				ns := netnstest.New(t)
				ipv6 := gc.cfg.Family == v6
				netnstest.Check(t, backend, ipv6)
				results, payloads := renderCase(t, gc)
				fake := iptrace.New(ipv6)
				apply := func(p []byte) {
					t.Helper()
					if err := ns.Restore(backend, ipv6, p, "--noflush"); err != nil {
						t.Fatal(err)
					}
					if err := fake.Restore(p, iptrace.RestoreOptions{NoFlush: true}); err != nil {
						t.Fatal(err)
					}
				}
				apply(payloads[0])
				apply(jumpPayload(gc.cfg, results[0].Chains))
				for _, p := range payloads[1:] {
					apply(p)
				}
				for _, table := range []string{"filter", "nat"} {
					real, err := ns.Save(backend, ipv6, table)
					if err != nil {
						t.Fatal(err)
					}
					if diff := cmp.Diff(real, fake.Save(table)); diff != "" {
						t.Errorf("table %s (-kernel +iptrace):\n%s", table, diff)
					}
				}
			})
		}
	}
}
