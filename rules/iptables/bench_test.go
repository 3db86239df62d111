package iptables

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
)

// bigSnapshot returns n ClusterIP Services with eps endpoints each, like the kernel lab's gen-rules.py.
func bigSnapshot(n, eps int) *proxy.Snapshot {
	ports := make([]*proxy.ServicePort, 0, n)
	for i := range n {
		sp := port(fmt.Sprintf("ns/svc%d", i), "http", v1.ProtocolTCP, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80)
		for j := range eps {
			k := i*eps + j
			e := proxy.NewEndpoint(netip.AddrFrom4([4]byte{10, 244, byte(k / 250 % 256), byte(k%250 + 1)}), 8080)
			e.Ready, e.Serving = true, true
			sp.Endpoints = append(sp.Endpoints, e)
		}
		sortEndpoints(sp.Endpoints)
		ports = append(ports, sp)
	}
	return snapshot(v4, v4Node("10.0.0.1"), ports...)
}

// withChangedService returns a successor of s where one Service's last endpoint moved.
func withChangedService(s *proxy.Snapshot, i int) *proxy.Snapshot {
	old := s.Services[port(fmt.Sprintf("ns/svc%d", i), "http", v1.ProtocolTCP, "10.96.0.1", 80).Name]
	sp := *old
	sp.Endpoints = append([]proxy.Endpoint(nil), old.Endpoints...)
	last := &sp.Endpoints[len(sp.Endpoints)-1]
	*last = proxy.NewEndpoint(netip.AddrFrom4([4]byte{10, 245, 0, byte(1 + last.IP.As4()[3])}), 8080)
	last.Ready, last.Serving = true, true
	sortEndpoints(sp.Endpoints)
	return derive(s, nil, &sp)
}

var benchCfg = testConfig(v4, clusterCIDR("10.244.0.0/16"))

// BenchmarkRender renders 10,000 Services × 3 endpoints: fully with a new renderer (cold caches), fully
// with a renderer that rendered the same snapshot before, and partially after one Service changed.
func BenchmarkRender(b *testing.B) {
	snap := bigSnapshot(10000, 3)
	b.Run("full-cold", func(b *testing.B) {
		b.ReportAllocs()
		var size int
		for b.Loop() {
			res, err := NewRenderer(benchCfg).Render(snap, nil, true, nil)
			if err != nil {
				b.Fatal(err)
			}
			size = len(res.Payload)
		}
		b.ReportMetric(float64(size), "payload-bytes")
	})
	b.Run("full-warm", func(b *testing.B) {
		r := NewRenderer(benchCfg)
		if _, err := r.Render(snap, nil, true, nil); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := r.Render(snap, snap, true, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("partial-one-service", func(b *testing.B) {
		r := NewRenderer(benchCfg)
		a := snap
		c := withChangedService(snap, 4242)
		if _, err := r.Render(a, nil, true, nil); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		from, to := a, c
		for b.Loop() {
			if _, err := r.Render(to, from, false, nil); err != nil {
				b.Fatal(err)
			}
			from, to = to, from
		}
	})
}

// TestPartialRendersOnlyTheChange checks that a partial render after one Service changed declares only
// that Service's chains besides the shared ones.
func TestPartialRendersOnlyTheChange(t *testing.T) {
	a := bigSnapshot(50, 3)
	c := withChangedService(a, 7)
	r := NewRenderer(benchCfg)
	if _, err := r.Render(a, nil, true, nil); err != nil {
		t.Fatal(err)
	}
	res, err := r.Render(c, a, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Full {
		t.Error("partial render reported as full")
	}
	// KUBE-SVC + 3 KUBE-SEP written, one KUBE-SEP deleted; the shared chains did not change, so they are
	// left out.
	declared := 0
	for _, l := range splitLines(res.Payload) {
		if len(l) > 0 && l[0] == ':' {
			declared++
		}
	}
	if want := 4 + 1; declared != want {
		t.Errorf("%d chains declared, want %d:\n%s", declared, want, res.Payload)
	}
	if got := res.Deleted["nat"]; len(got) != 1 {
		t.Errorf("deleted %v, want one endpoint chain", got)
	}
	if got, want := len(res.Chains["nat"]), 4+50*4; got != want {
		t.Errorf("%d nat chains owned, want %d", got, want)
	}
	// Only the changed Service's 1 + 3 + 6 rules are written; of 50 Services, 4 shared rules, 50 + 1 in
	// KUBE-SERVICES and 10 each are owned.
	if got, want := res.Rules["nat"], 10; got != want {
		t.Errorf("nat rules written %d, want %d", got, want)
	}
	if got, want := res.RulesTotal["nat"], 4+51+50*10; got != want {
		t.Errorf("nat rules total %d, want %d", got, want)
	}
}

func splitLines(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == '\n' {
			out = append(out, string(b[start:i]))
			start = i + 1
		}
	}
	return out
}
