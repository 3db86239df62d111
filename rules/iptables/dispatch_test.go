package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
	"kube-proxy/rules/internal/netnstest"
	"kube-proxy/rules/iptables/iptrace"
)

// svcName is the ServicePortName of bigSnapshot's Service i.
func svcName(i int) proxy.ServicePortName {
	return port(fmt.Sprintf("ns/svc%d", i), "http", v1.ProtocolTCP, "10.96.0.1", 80).Name
}

// natLines returns the nat table lines of a payload.
func natLines(payload []byte) []string {
	s := string(payload)
	i := strings.Index(s, "*nat\n")
	if i < 0 {
		return nil
	}
	return strings.Split(strings.TrimSpace(s[i:]), "\n")
}

func applyFake(t *testing.T, ts *iptrace.Tables, payload []byte) {
	t.Helper()
	if err := ts.Restore(payload, iptrace.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatalf("restore: %v\n%.2000s", err, payload)
	}
}

// traceClusterIP follows a new TCP connection from outside to a cluster IP and returns the endpoints it can
// reach.
func traceClusterIP(t *testing.T, ts *iptrace.Tables, ip string) []string {
	t.Helper()
	res, err := ts.Trace(iptrace.Packet{Src: netip.MustParseAddr("10.250.0.2"), Dst: netip.MustParseAddr(ip),
		Protocol: "tcp", DPort: 80, InIface: "eth0", LocalAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Endpoints()
}

func TestDispatchShape(t *testing.T) {
	snap := bigSnapshot(1200, 2)
	res, err := NewRenderer(benchCfg).Render(snap, nil, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	var jumps, clusterIPRules, last int
	for i, l := range natLines(res.Payload) {
		switch {
		case strings.HasPrefix(l, "-A KUBE-SERVICES -d 0.0.0.") && strings.Contains(l, "-j "+bucketPrefix):
			jumps++
		case strings.HasPrefix(l, "-A KUBE-SERVICES") && strings.Contains(l, "cluster IP"):
			t.Errorf("cluster IP rule left in KUBE-SERVICES while dispatching: %s", l)
		case strings.HasPrefix(l, "-A "+bucketPrefix) && strings.Contains(l, "cluster IP"):
			clusterIPRules++
		}
		if strings.HasPrefix(l, "-A KUBE-SERVICES") {
			last = i
		}
	}
	// bigSnapshot's cluster IPs end in 1..250.
	if jumps != 250 || clusterIPRules != 1200 {
		t.Errorf("%d bucket jumps and %d cluster IP rules in buckets, want 250 and 1200", jumps, clusterIPRules)
	}
	if l := natLines(res.Payload)[last]; !strings.Contains(l, "KUBE-NODEPORTS") {
		t.Errorf("last KUBE-SERVICES rule is not the NodePorts jump: %s", l)
	}
	ts := iptrace.New(false)
	applyFake(t, ts, res.Payload)
	applyFake(t, ts, jumpPayload(benchCfg, res.Chains))
	for _, i := range []int{0, 1, 249, 250, 777, 1199} {
		sp := snap.Services[svcName(i)]
		var want []string
		for _, e := range sp.Endpoints {
			want = append(want, e.Addr)
		}
		if got := traceClusterIP(t, ts, sp.ClusterIP.String()); !slices.Equal(got, want) {
			t.Errorf("service %d (%s) reaches %v, want %v", i, sp.ClusterIP, got, want)
		}
	}
	if got := traceClusterIP(t, ts, "10.96.200.200"); len(got) != 0 {
		t.Errorf("an unused cluster IP reaches %v", got)
	}
}

func TestDispatchPartialWritesOneBucket(t *testing.T) {
	snap := bigSnapshot(1200, 2)
	r := NewRenderer(benchCfg)
	if _, err := r.Render(snap, nil, true, nil); err != nil {
		t.Fatal(err)
	}
	declaredChains := func(payload []byte) []string {
		var out []string
		for _, l := range natLines(payload) {
			if strings.HasPrefix(l, ":") {
				out = append(out, strings.Fields(l[1:])[0])
			}
		}
		return out
	}

	// An endpoint change leaves the cluster IP rule, hence every bucket and KUBE-SERVICES, alone.
	next := withChangedService(snap, 600)
	res, err := r.Render(next, snap, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range declaredChains(res.Payload) {
		if c == chainServices || isBucketChain(c) {
			t.Errorf("endpoint change declared %s", c)
		}
	}
	if strings.Contains(string(res.Payload), "*filter") {
		t.Errorf("endpoint change rewrote the filter table:\n%s", res.Payload)
	}

	// A new Service rewrites only its bucket (its cluster IP ends in .17, a bucket that exists).
	added := port("ns/new", "http", v1.ProtocolTCP, "10.96.77.17", 80, eps("10.244.99.1:8080"))
	third := derive(next, nil, added)
	res, err = r.Render(third, next, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var buckets []string
	for _, c := range declaredChains(res.Payload) {
		if c == chainServices {
			t.Errorf("a Service in an existing bucket rewrote KUBE-SERVICES")
		}
		if isBucketChain(c) {
			buckets = append(buckets, c)
		}
	}
	if want := []string{bucketChains[17]}; !slices.Equal(buckets, want) {
		t.Errorf("buckets written %v, want %v", buckets, want)
	}
	if n := res.Rules["nat"]; n > 20 {
		t.Errorf("%d nat rules written for one new Service", n)
	}
}

// TestDispatchConverges applies a series of partial renders that cross the dispatch threshold both ways and
// checks, after each, that the tables equal a fresh full render of the same snapshot.
func TestDispatchConverges(t *testing.T) {
	cfg := benchCfg
	base := bigSnapshot(1100, 2) // more than 1000 endpoints throughout: no comment flips
	steps := []*proxy.Snapshot{base}
	names := func(from, to int) []proxy.ServicePortName {
		var out []proxy.ServicePortName
		for i := from; i < to; i++ {
			out = append(out, svcName(i))
		}
		return out
	}
	cur := base
	add := func(ports ...*proxy.ServicePort) { cur = derive(cur, nil, ports...); steps = append(steps, cur) }
	remove := func(n []proxy.ServicePortName) { cur = derive(cur, n); steps = append(steps, cur) }
	add(port("ns/extra", "http", v1.ProtocolTCP, "10.96.50.251", 80, eps("10.244.1.1:80")))              // a new bucket
	remove([]proxy.ServicePortName{svcName(0), svcName(250), svcName(500), svcName(750), svcName(1000)}) // bucket 1 loses members
	remove(names(1, 250))                                                                                // down to ~850: dispatch turns off
	add(port("ns/extra2", "http", v1.ProtocolTCP, "10.96.50.252", 80, eps("10.244.1.2:80")))
	more := bigSnapshot(1400, 2) // back above the threshold
	var ports []*proxy.ServicePort
	for i := 1100; i < 1400; i++ {
		ports = append(ports, more.Services[svcName(i)])
	}
	add(ports...)
	cur = withChangedService(cur, 1300)
	steps = append(steps, cur)

	r := NewRenderer(cfg)
	ts := iptrace.New(false)
	var prev *proxy.Snapshot
	for i, s := range steps {
		res, err := r.Render(s, prev, prev == nil, nil)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		applyFake(t, ts, res.Payload)
		prev = s

		ref := iptrace.New(false)
		full, err := NewRenderer(cfg).Render(s, nil, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		applyFake(t, ref, full.Payload)
		for _, table := range []string{"nat", "filter"} {
			if got, want := ts.Save(table), ref.Save(table); got != want {
				t.Fatalf("step %d (%d Services, dispatch %v): table %s differs from a full render (-full +partials):\n%.3000s",
					i, len(s.Services), r.dispatch, table, diffLines(want, got))
			}
		}
	}
}

// TestDispatchKernel loads a dispatching ruleset and a partial update into a real kernel with both backends
// and compares iptables-save with the tracer's emulation.
func TestDispatchKernel(t *testing.T) {
	for _, backend := range netnstest.Backends {
		t.Run(backend, func(t *testing.T) {
			ns := kernelNS(t, backend, false, nil)
			snap := bigSnapshot(1100, 2)
			r := NewRenderer(benchCfg)
			fake := iptrace.New(false)
			apply := func(p []byte) {
				t.Helper()
				if err := ns.Restore(backend, false, p, "--noflush"); err != nil {
					t.Fatal(err)
				}
				applyFake(t, fake, p)
			}
			res, err := r.Render(snap, nil, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			apply(slices.Clone(res.Payload))
			next := derive(snap, []proxy.ServicePortName{svcName(3)},
				port("ns/new", "http", v1.ProtocolTCP, "10.96.77.4", 80, eps("10.244.99.1:8080")))
			res, err = r.Render(next, snap, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			apply(res.Payload)
			saved, err := ns.Save(backend, false, "nat")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(saved, fake.Save("nat")); diff != "" {
				t.Errorf("nat (-kernel +iptrace):\n%.3000s", diff)
			}
		})
	}
}

// TestChunkedConverges renders with small chunks, applies each chunk as its own restore, and checks the
// result against an unchunked full render, for full renders, large partial ones (many Services changing at
// once) and small ones; each chunk must load on its own (the fake refuses jumps to missing chains).
func TestChunkedConverges(t *testing.T) {
	cfg := benchCfg
	cfg.ChunkLines = 50
	base := bigSnapshot(300, 2)
	var changed []*proxy.ServicePort
	for i := 0; i < 120; i++ {
		changed = append(changed, port(fmt.Sprintf("ns/added%d", i), "http", v1.ProtocolTCP,
			fmt.Sprintf("10.97.%d.%d", i/200, i%200+1), 80, eps(fmt.Sprintf("10.250.%d.%d:80", i/200, i%200+1))))
	}
	var removed []proxy.ServicePortName
	for i := 0; i < 100; i++ {
		removed = append(removed, svcName(i))
	}
	steps := []*proxy.Snapshot{base, derive(base, removed, changed...)}
	steps = append(steps, withChangedService(steps[1], 250))

	r := NewRenderer(cfg)
	ts := iptrace.New(false)
	var prev *proxy.Snapshot
	for i, s := range steps {
		res, err := r.Render(s, prev, prev == nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if i < 2 && len(res.Chunks) < 3 {
			t.Errorf("step %d: %d chunks, want several", i, len(res.Chunks))
		}
		if i == 2 && len(res.Chunks) != 0 {
			t.Errorf("a one-Service change was chunked")
		}
		if len(res.Chunks) == 0 {
			applyFake(t, ts, res.Payload)
		}
		for _, c := range res.Chunks {
			applyFake(t, ts, c)
		}
		prev = s
		ref := iptrace.New(false)
		full, err := NewRenderer(benchCfg).Render(s, nil, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		applyFake(t, ref, full.Payload)
		for _, table := range []string{"nat", "filter"} {
			if got, want := ts.Save(table), ref.Save(table); got != want {
				t.Fatalf("step %d: table %s differs from an unchunked full render:\n%.3000s", i, table, diffLines(want, got))
			}
		}
	}
}
