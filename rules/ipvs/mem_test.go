package ipvs

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"kube-proxy/proxy"
)

// BenchmarkFullResync measures what mode ipvs' writer holds and allocates at 10,000 ClusterIP Services
// × 3 endpoints on a fake kernel: the heap it retains once the first sync is over (retained-MiB), and
// what one periodic full resync with nothing changed allocates (B/op, allocs/op). The fakes' own state
// counts in retained-MiB too; compare runs of this benchmark, not its figure with the daemon's RSS.
//
//	go test -run '^$' -bench FullResync -benchmem ./rules/ipvs/
func BenchmarkFullResync(b *testing.B) {
	const n = 10000
	ports := make([]*proxy.ServicePort, n)
	for i := range ports {
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		ep := func(j int) string { return fmt.Sprintf("10.200.%d.%d:8080", i/60, (i%60)*4+1+j) }
		ports[i] = svc(fmt.Sprintf("ns/svc-%05d", i), "http", "TCP", ip, 80, eps(ep(0), ep(1), ep(2)))
	}
	snap := snapshot(v4, node("10.250.0.1"), ports...)
	k := newFakeKernel(b, "10.250.0.1")
	d := newTestDataplane(b, k, testConfig(v4), nil)
	if err := d.Apply(context.Background(), snap, true); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := d.Apply(context.Background(), snap, true); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	// What the dataplane holds: the heap with it, less the heap once it is gone (the fakes stay).
	var with, without runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&with)
	runtime.KeepAlive(d)
	d = nil
	runtime.GC()
	runtime.ReadMemStats(&without)
	b.ReportMetric(float64(with.HeapAlloc-without.HeapAlloc)/(1<<20), "retained-MiB")
	runtime.KeepAlive(snap)
	runtime.KeepAlive(k)
}
