package iptables

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/internal/metricstest"
	"kube-proxy/rules/internal/netnstest"
	"kube-proxy/rules/iptables/iptrace"
	"kube-proxy/rules/nfacct"
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
			ns := kernelNS(t, backend, false, nil)
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

// kernelNS returns a fresh namespace for a kernel test of backend (skipping the test unless KP_E2E is
// set) holding upstream's nfacct counters, created as the Dataplane creates them; fake, when not nil, is
// told that they exist.
func kernelNS(t testing.TB, backend string, ipv6 bool, fake *iptrace.Tables) *netnstest.NS {
	t.Helper()
	ns := netnstest.New(t)
	netnstest.Check(t, backend, ipv6)
	acct, err := nfacct.New(int(ns.File(t).Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer acct.Close()
	names := []string{CounterInvalidDropped, CounterLocalhostNodePorts}
	for _, c := range names {
		if err := acct.Ensure(c); err != nil {
			t.Fatal(err)
		}
	}
	if fake != nil {
		fake.SetCounters(names...)
	}
	return ns
}

// TestGoldenKernel applies every golden case's payloads, step by step, and the jump rules to a real kernel
// with both backends, and compares iptables-save with the tracer's emulation of the same restores: the
// payloads load, and the fake kernel the tracer and the writer's tests use behaves like the real one.
func TestGoldenKernel(t *testing.T) {
	for _, backend := range netnstest.Backends {
		for _, gc := range goldenCases() {
			t.Run(backend+"/"+gc.name, func(t *testing.T) {
				ipv6 := gc.cfg.Family == v6
				fake := iptrace.New(ipv6)
				ns := kernelNS(t, backend, ipv6, fake)
				results, payloads := renderCase(t, gc)
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

// TestLocalhostNodePortCountedKernel writes a NodePort's rules with localhost NodePorts on into a fresh
// namespace whose nfacct counters exist, connects to 127.0.0.1:<nodePort> inside it, and reads
// kubeproxy_iptables_localhost_nodeports_accepted_packets_total from the metrics: one packet per
// connection (the nat table sees a connection's first packet only), the endpoint answering each time.
func TestLocalhostNodePortCountedKernel(t *testing.T) {
	for _, backend := range netnstest.Backends {
		t.Run(backend, func(t *testing.T) {
			ns := kernelNS(t, backend, false, nil)
			for _, cmd := range [][]string{
				{"ip", "link", "set", "lo", "up"},
				{"ip", "addr", "add", "10.244.1.5/32", "dev", "lo"}, // the endpoint, local to the namespace
				{"sh", "-c", "echo 1 >/proc/sys/net/ipv4/conf/all/route_localnet"},
			} {
				if _, err := ns.Exec(nil, cmd[0], cmd[1:]...); err != nil {
					t.Fatal(err)
				}
			}
			cfg := with(testConfig(v4, clusterCIDR("10.244.0.0/16")), func(c *Config) { c.LocalhostNodePorts = true })
			snap := snapshot(v4, v4Node("10.0.0.1"),
				port("default/np", "http", v1.ProtocolTCP, "10.96.0.20", 80, nodePort(30080), eps("10.244.1.5:8080")))
			res, err := NewRenderer(cfg).Render(snap, nil, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range [][]byte{slices.Clone(res.Payload), jumpPayload(cfg, res.Chains)} {
				if err := ns.Restore(backend, false, p, "--noflush"); err != nil {
					t.Fatal(err)
				}
			}

			acct, err := nfacct.New(int(ns.File(t).Fd()))
			if err != nil {
				t.Fatal(err)
			}
			defer acct.Close()
			reg := prometheus.NewPedanticRegistry()
			NewMetrics(reg, acct)
			const conns = 3
			err = ns.Do(func() error {
				l, err := net.Listen("tcp", "10.244.1.5:8080")
				if err != nil {
					return err
				}
				defer l.Close()
				go func() {
					for {
						c, err := l.Accept()
						if err != nil {
							return
						}
						c.Write([]byte("hi"))
						c.Close()
					}
				}()
				for i := range conns {
					c, err := net.DialTimeout("tcp", "127.0.0.1:30080", 2*time.Second)
					if err != nil {
						return fmt.Errorf("connection %d to 127.0.0.1:30080: %w", i, err)
					}
					b, err := io.ReadAll(c)
					c.Close()
					if err != nil || string(b) != "hi" {
						return fmt.Errorf("connection %d read %q, %v; want the endpoint's greeting", i, b, err)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			got := metricstest.Values(t, reg, "kubeproxy_iptables_")
			want := map[string]float64{
				"kubeproxy_iptables_localhost_nodeports_accepted_packets_total": conns,
				"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":     0,
			}
			for name, v := range want {
				if g, ok := got[name]; !ok || g != v {
					t.Errorf("%s = %v (exported %v), want %v", name, g, ok, v)
				}
			}
		})
	}
}
