//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"sort"
	"time"

	ipvslib "github.com/cloudflare/ipvs"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"kube-proxy/config"
	"kube-proxy/e2e/ipvsvm"
	"kube-proxy/proxy"
	"kube-proxy/rules/ipvs"
)

// bench measures syncs of n cluster-IP Services with 3 real servers each: the first full sync into an
// empty kernel, a full resync without changes, a partial sync changing one Service's endpoints, a partial
// sync adding one Service, and the cleanup.
func bench(n int) error {
	// The dataplane's V(2) sync line says how long each step took.
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", "2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := ipvs.Cleanup(ctx); err != nil {
		return err
	}
	kp := config.Default()
	kp.Mode = config.ModeIPVS
	kp.ClusterCIDR = ipvsvm.ClusterCIDR
	dp, err := newDataplane(ctx, kp, v1.IPv4Protocol)
	if err != nil {
		return err
	}
	node := proxy.Node{Name: ipvsvm.NodeName, Known: true, IPs: []netip.Addr{netip.MustParseAddr(ipvsvm.NodeIP)}}
	svcs := map[proxy.ServicePortName]*proxy.ServicePort{}
	ip := func(i int) string { return fmt.Sprintf("10.100.%d.%d", i/256, i%256) }
	for i := 0; i < n; i++ {
		sp := mk(&node, port{name: fmt.Sprintf("bench/svc-%05d", i), clusterIP: ip(i), port: 80, eps: podEPs(80, 1, 2, 3)})
		svcs[sp.Name] = sp
	}
	var gen uint64
	snapshot := func() *proxy.Snapshot {
		gen++
		s := &proxy.Snapshot{Family: v1.IPv4Protocol, Generation: gen, Node: node, Services: map[proxy.ServicePortName]*proxy.ServicePort{}}
		for k, v := range svcs {
			s.Services[k] = v
		}
		return s
	}
	timed := func(name string, full bool, detail string) (time.Duration, error) {
		s := snapshot()
		start := time.Now()
		err := dp.Apply(ctx, s, full)
		d := time.Since(start)
		if err != nil {
			return d, fmt.Errorf("%s: %w", name, err)
		}
		if name != "" {
			report("BENCH", name, fmt.Sprintf("%.3f", d.Seconds()), detail)
		}
		return d, nil
	}
	reals := fmt.Sprintf("services=%d reals=%d", n, 3*n)
	if _, err := timed("full-initial", true, reals); err != nil {
		return err
	}
	c, err := ipvsLister()
	if err != nil {
		return err
	}
	if got := c(); got != n {
		return fmt.Errorf("%d virtual servers in the kernel after the first sync, want %d", got, n)
	}
	if _, err := timed("full-resync", true, reals+" (no change)"); err != nil {
		return err
	}
	var partial []time.Duration
	for i := 0; i < 7; i++ {
		sp := mk(&node, port{name: "bench/svc-00000", clusterIP: ip(0), port: 80, eps: podEPs(80, 1+i%3, 1+(i+1)%3)})
		svcs[sp.Name] = sp
		d, err := timed("", false, "")
		if err != nil {
			return err
		}
		partial = append(partial, d)
	}
	sort.Slice(partial, func(i, j int) bool { return partial[i] < partial[j] })
	report("BENCH", "partial-one-service", fmt.Sprintf("%.3f", partial[len(partial)/2].Seconds()),
		fmt.Sprintf("median of %d, min %.3f max %.3f, endpoints of 1 of %d Services changed", len(partial),
			partial[0].Seconds(), partial[len(partial)-1].Seconds(), n))
	sp := mk(&node, port{name: "bench/added", clusterIP: "10.101.0.1", port: 80, eps: podEPs(80, 1, 2, 3)})
	svcs[sp.Name] = sp
	if _, err := timed("partial-add-service", false, fmt.Sprintf("1 Service added to %d", n)); err != nil {
		return err
	}
	h, err := hit("client", "tcp", addr(ip(n-1), 80), 3, dialTimeout)
	if err != nil {
		return err
	}
	if err := expect("the last Service", h, map[string]int{"pod1": 1, "pod2": 1, "pod3": 1}); err != nil {
		return err
	}
	cancel()
	start := time.Now()
	if err := ipvs.Cleanup(context.Background()); err != nil {
		return err
	}
	report("BENCH", "cleanup", fmt.Sprintf("%.3f", time.Since(start).Seconds()), reals)
	report("CASE", "bench", "PASS", reals)
	return nil
}

// ipvsLister returns a function counting the kernel's virtual servers.
func ipvsLister() (func() int, error) {
	c, err := ipvslib.New()
	if err != nil {
		return nil, err
	}
	return func() int {
		l, _ := c.Services()
		return len(l)
	}, nil
}
