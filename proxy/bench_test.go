package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apiruntime "k8s.io/apimachinery/pkg/runtime"

	"kube-proxy/config"
)

// benchObjects returns n Services, each with one EndpointSlice of m ready endpoints (half of them on this
// node, spread over three zones).
func benchObjects(n, m int) ([]*v1.Service, []*discovery.EndpointSlice) {
	svcs := make([]*v1.Service, n)
	slices := make([]*discovery.EndpointSlice, n)
	ipAt := func(base netip.Addr, k int) string {
		b := base.As4()
		v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		v += uint32(k)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
	}
	svcBase, epBase := netip.MustParseAddr("10.96.0.0"), netip.MustParseAddr("10.128.0.0")
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("svc-%05d", i)
		svcs[i] = makeService("bench", name, ipAt(svcBase, i+1), withPort("http", tcp, 80, 0))
		eps := make([]epSpec, m)
		for k := range eps {
			eps[k] = epSpec{ip: ipAt(epBase, i*m+k), node: []string{thisNode, "node-b"}[k%2], zone: fmt.Sprintf("zone-%d", k%3)}
		}
		slices[i] = makeSlice("bench", name, name+"-abcde", ipv4, []slicePortSpec{sp("http", 8080, tcp)}, eps...)
	}
	return svcs, slices
}

// BenchmarkSnapshot measures the tracker at 10,000 Services × 10 endpoints: building the first snapshot
// from all events, and taking one endpoint change into the next snapshot (with Changes).
func BenchmarkSnapshot(b *testing.B) {
	const services, endpoints = 10000, 10
	svcs, slices := benchObjects(services, endpoints)

	b.Run(fmt.Sprintf("build/%dx%d", services, endpoints), func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tr := NewTracker(TrackerOptions{NodeName: thisNode, Families: []v1.IPFamily{v1.IPv4Protocol}})
			for i := range svcs {
				tr.OnService(nil, svcs[i])
				tr.OnEndpointSlice(nil, slices[i])
			}
			snap := tr.Snapshots().Snapshots[0]
			if len(snap.Services) != services {
				b.Fatalf("%d ports", len(snap.Services))
			}
		}
	})

	b.Run(fmt.Sprintf("one-endpoint-change/%dx%d", services, endpoints), func(b *testing.B) {
		tr := NewTracker(TrackerOptions{NodeName: thisNode, Families: []v1.IPFamily{v1.IPv4Protocol}})
		for i := range svcs {
			tr.OnService(nil, svcs[i])
			tr.OnEndpointSlice(nil, slices[i])
		}
		prev := tr.Snapshots().Snapshots[0]
		// Two versions of one slice: its first endpoint flips between ready and not ready.
		target := services / 2
		versions := [2]*discovery.EndpointSlice{slices[target], slices[target].DeepCopy()}
		versions[1].Endpoints[0].Conditions.Ready = ptr(false)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			tr.OnEndpointSlice(versions[(i+1)%2], versions[i%2])
			snap := tr.Snapshots().Snapshots[0]
			if ch := snap.Changes(prev); len(ch) != 1 {
				b.Fatalf("%d changes, want 1", len(ch))
			}
			prev = snap
		}
	})
}

type nopDataplane struct{}

func (nopDataplane) Apply(context.Context, *Snapshot, bool) error          { return nil }
func (nopDataplane) Reconfigure(*config.KubeProxyConfiguration) error      { return nil }
func (nopDataplane) Watch(context.Context, time.Duration, func(full bool)) {}
func (nopDataplane) Stop(context.Context)                                  {}

// BenchmarkProxySyncOneChange measures one sync of the Proxy (snapshot, metrics, health, no-op dataplane)
// after one endpoint change at 10,000 Services × 10 endpoints: what the loop itself adds per change.
func BenchmarkProxySyncOneChange(b *testing.B) {
	const services, endpoints = 10000, 10
	svcs, slices := benchObjects(services, endpoints)
	p := New(Options{NodeName: thisNode, Dataplanes: []FamilyDataplane{{Family: v1.IPv4Protocol, Dataplane: nopDataplane{}}},
		SyncPeriod: time.Hour, Registry: prometheus.NewRegistry()})
	for i := range svcs {
		p.Tracker().OnService(nil, svcs[i])
		p.Tracker().OnEndpointSlice(nil, slices[i])
	}
	if err := p.sync(context.Background(), true); err != nil {
		b.Fatal(err)
	}
	target := services / 2
	versions := [2]*discovery.EndpointSlice{slices[target], slices[target].DeepCopy()}
	versions[1].Endpoints[0].Conditions.Ready = ptr(false)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		p.Tracker().OnEndpointSlice(versions[(i+1)%2], versions[i%2])
		if err := p.sync(context.Background(), false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTrackerRetained measures the heap the Tracker holds at 10,000 Services × 3 endpoints once the
// first snapshot is built from objects as the watches deliver them (each decoded separately, then
// dropped): its Services, parsed slices and the snapshot (retained-MiB). The daemon keeps this for its
// whole life, in every mode.
//
//	go test -run '^$' -bench TrackerRetained ./proxy/
func BenchmarkTrackerRetained(b *testing.B) {
	const services, endpoints = 10000, 3
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tr := NewTracker(TrackerOptions{NodeName: thisNode, Families: []v1.IPFamily{v1.IPv4Protocol}})
		svcs, slices := benchObjects(services, endpoints)
		for i := range svcs {
			// As from a watch: each object decoded from protobuf on its own (its strings allocated apart).
			tr.OnService(nil, protoRoundTrip(b, svcs[i]))
			tr.OnEndpointSlice(nil, protoRoundTrip(b, slices[i]))
		}
		svcs, slices = nil, nil
		build := tr.Snapshots()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "retained-MiB")
		runtime.KeepAlive(tr)
		runtime.KeepAlive(build)
	}
}

// protoRoundTrip encodes obj as the API server sends it (protobuf) and decodes it again.
func protoRoundTrip[T apiruntime.Object](b *testing.B, obj T) T {
	info, _ := apiruntime.SerializerInfoForMediaType(apiCodecs.SupportedMediaTypes(), apiruntime.ContentTypeProtobuf)
	gvks, _, err := apiScheme.ObjectKinds(obj)
	if err != nil {
		b.Fatal(err)
	}
	data, err := apiruntime.Encode(apiCodecs.EncoderForVersion(info.Serializer, gvks[0].GroupVersion()), obj)
	if err != nil {
		b.Fatal(err)
	}
	out, _, err := info.Serializer.Decode(data, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	return out.(T)
}
