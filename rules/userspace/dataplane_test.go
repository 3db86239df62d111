package userspace

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	pt "kube-proxy/proxy/proxytest"
	"kube-proxy/rules/engine"
	"kube-proxy/rules/iptables/iptrace"
)

// fakeKernel is iptables as iptrace.Tables simulates it: it keeps what the payloads write and refuses
// what the kernel refuses.
type fakeKernel struct {
	ts     *iptrace.Tables
	writes int
}

func (k *fakeKernel) Restore(_ context.Context, payload []byte) error {
	k.writes++
	return k.ts.Restore(payload, iptrace.RestoreOptions{NoFlush: true})
}

func (k *fakeKernel) EnsureChain(table, chain string) error {
	for _, c := range k.ts.Chains(table) {
		if c == chain {
			return nil
		}
	}
	_, err := k.ts.Run("-t", table, "-N", chain)
	return err
}

func (k *fakeKernel) EnsureRule(prepend bool, table, chain string, rule ...string) (bool, error) {
	args := []string{"-t", table, "-A", chain}
	if prepend {
		args = []string{"-t", table, "-I", chain, "1"}
	}
	_, err := k.ts.Run(append(args, rule...)...)
	return err == nil, err
}

// server answers each connection with its name.
func server(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, name)
			c.Close()
		}
	}()
	return ln.Addr().String()
}

func nameAt(t *testing.T, port uint16) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port).String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(line)
}

// TestEndpointChangeWritesNoRules: an endpoint change reaches the engine without an iptables write (the
// capture rules do not name endpoints); a new Service, a Service losing its last endpoint, and a full
// sync write.
func TestEndpointChangeWritesNoRules(t *testing.T) {
	a, b := server(t, "a"), server(t, "b")
	k := &fakeKernel{ts: iptrace.New(false)}
	e := engine.New(v1.IPv4Protocol, netip.MustParseAddr("127.0.0.1"), engine.Options{}, engine.NewMetrics(prometheus.NewRegistry()))
	defer e.Close()
	d := NewDataplane(testConfig(t, nil), k, e, nil)
	node := pt.Node("10.0.0.1")
	web := func(ep string) *proxy.ServicePort {
		return pt.Port("ns/web", "", v1.ProtocolTCP, "10.96.0.10", 80, pt.Endpoints(ep))
	}
	apply := func(full bool, ports ...*proxy.ServicePort) {
		t.Helper()
		if err := d.Apply(context.Background(), pt.Snapshot(v1.IPv4Protocol, node, ports...), full); err != nil {
			t.Fatal(err)
		}
	}
	key := engine.Key{Name: "ns/web", Protocol: v1.ProtocolTCP, Policy: PolicyCluster}

	apply(true, web(a))
	if k.writes != 1 || nameAt(t, e.Port(key)) != "a" {
		t.Fatalf("first sync: %d writes, want 1", k.writes)
	}
	apply(false, web(b))
	if k.writes != 1 {
		t.Errorf("an endpoint change wrote the rules (%d writes)", k.writes)
	}
	if got := nameAt(t, e.Port(key)); got != "b" {
		t.Errorf("after the endpoint change the listener reaches %q, want b", got)
	}
	apply(false, web(b), pt.Port("ns/other", "", v1.ProtocolTCP, "10.96.0.11", 80, pt.Endpoints(a)))
	if k.writes != 2 {
		t.Errorf("a new Service: %d writes, want 2", k.writes)
	}
	apply(false, pt.Port("ns/web", "", v1.ProtocolTCP, "10.96.0.10", 80), pt.Port("ns/other", "", v1.ProtocolTCP, "10.96.0.11", 80, pt.Endpoints(a)))
	if k.writes != 3 || e.Port(key) != 0 {
		t.Errorf("a Service without endpoints: %d writes (want 3), its listener on port %d (want closed)", k.writes, e.Port(key))
	}
	if !strings.Contains(strings.Join(k.ts.Chains("filter"), " "), ChainFilter) {
		t.Error("no filter chain")
	}
	apply(true, pt.Port("ns/web", "", v1.ProtocolTCP, "10.96.0.10", 80), pt.Port("ns/other", "", v1.ProtocolTCP, "10.96.0.11", 80, pt.Endpoints(a)))
	if k.writes != 4 {
		t.Errorf("a full sync: %d writes, want 4", k.writes)
	}
}
