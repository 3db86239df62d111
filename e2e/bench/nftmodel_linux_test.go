package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"kube-proxy/e2e/harness"
)

// synthNFTServices returns n Services with m endpoints each and a transaction creating a table ip
// kube-proxy for them in upstream's shapes: each Service's chain with its DNAT rule, and the
// service-ips map sending its cluster IP there.
func synthNFTServices(n, m int) ([]*service, string) {
	var b strings.Builder
	fmt.Fprintf(&b, "add table ip %s\n", nftTable)
	fmt.Fprintf(&b, "add map ip %s %s { type ipv4_addr . inet_proto . inet_service : verdict ; }\n", nftTable, nftServiceIPs)
	fmt.Fprintf(&b, "add chain ip %s services\n", nftTable)
	fmt.Fprintf(&b, "add rule ip %s services ip daddr . meta l4proto . th dport vmap @%s\n", nftTable, nftServiceIPs)
	var svcs []*service
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("svc-%05d", i)
		s := &service{Name: name, ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), NFTChain: nftServiceChain(benchNS, name, portName)}
		for j := 0; j < m; j++ {
			s.Endpoints = append(s.Endpoints, hostPort(origEndpoint(i*m+j), podPort))
		}
		slices.Sort(s.Endpoints)
		svcs = append(svcs, s)
		b.WriteString(nftChangeText(s.NFTChain, s.Endpoints))
		fmt.Fprintf(&b, "add element ip %s %s { %s . tcp . %d : goto %s }\n", nftTable, nftServiceIPs, s.ClusterIP, svcPort, s.NFTChain)
	}
	return svcs, b.String()
}

// reachesAll returns a predicate: every Service's cluster IP reaches exactly its endpoints.
func reachesAll(svcs []*service) func(View) bool {
	return func(v View) bool {
		for _, s := range svcs {
			if !slices.Equal(v.NFTReaches(netip.MustParseAddr(s.ClusterIP), svcPort), s.Endpoints) {
				return false
			}
		}
		return true
	}
}

// TestNFTMonitor checks the observer's model of table ip kube-proxy against a real nft: a table built in
// one transaction, then one Service's chain rewritten as upstream rewrites it (its anonymous map
// replaced: the kernel may give the new one the old one's name), to several endpoints and to one; the
// service-ips map added again; a re-read from the kernel and `nft list` agree. KP_BENCH_MONITOR_N sets the number of Services (default 200).
func TestNFTMonitor(t *testing.T) {
	harness.Require(t, "nft")
	n := 200
	if s := os.Getenv("KP_BENCH_MONITOR_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	ns := harness.NetNSForTest(t, "bench-nftmon")
	mon, err := NewMonitor(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	svcs, text := synthNFTServices(n, 3)
	if _, err := nftRun(ns, text, nil, time.Microsecond); !errors.Is(err, errNotInTime) {
		t.Fatalf("nft -f given a microsecond: %v, want errNotInTime", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all := mon.Watch(reachesAll(svcs))
	res, err := nftRun(ns, text, mon, 0)
	if err != nil {
		t.Fatal(err)
	}
	g, err := mon.WaitFor(ctx, all)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nft -f of %d Services: exited after %v, committed after %v; gen %+v, overflows %d", n, res.Wall, res.Commit, g, mon.Lost())
	if g.Proc != "nft" || g.Rules != n+1 || g.Elems != n+3*n {
		t.Errorf("table transaction %+v: want nft adding %d rules and %d elements", g, n+1, 4*n)
	}

	s := svcs[0]
	for _, eps := range [][]string{
		append(slices.Clone(s.Endpoints), hostPort(extraEndpoint(0), podPort)),
		{hostPort(extraEndpoint(1), podPort)},
		s.Endpoints,
	} {
		slices.Sort(eps)
		landed := mon.Watch(func(v View) bool {
			return slices.Equal(v.NFTReaches(netip.MustParseAddr(s.ClusterIP), svcPort), eps)
		})
		if _, err := nftRun(ns, nftChangeText(s.NFTChain, eps), mon, 0); err != nil {
			t.Fatal(err)
		}
		g, err := mon.WaitFor(ctx, landed)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d endpoints: gen %+v", len(eps), g)
	}
	// Upstream's full syncs add the map again: the kernel announces it, with its elements kept.
	readd := fmt.Sprintf("add map ip %s %s { type ipv4_addr . inet_proto . inet_service : verdict ; }\n", nftTable, nftServiceIPs)
	if _, err := nftRun(ns, readd, mon, 0); err != nil {
		t.Fatal(err)
	}
	if !mon.Check(reachesAll(svcs)) {
		t.Errorf("the model lost Services on the way")
	}

	// A re-read from the kernel, of one chain and of everything, agrees with the notifications.
	for _, chains := range [][]string{{s.NFTChain}, nil} {
		if err := mon.ReloadNFT(chains...); err != nil {
			t.Fatal(err)
		}
		if !mon.Check(reachesAll(svcs)) {
			t.Errorf("after re-reading %v the model does not show every Service", chains)
		}
	}
	if got := mon.Check(func(v View) bool { return v.NFTServiceIPs() == n }); !got {
		t.Errorf("service-ips does not hold %d elements", n)
	}
	listing, err := nftList(ns)
	if err != nil {
		t.Fatal(err)
	}
	l, err := parseNFTListing(listing)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.check(svcs); err != nil {
		t.Error(err)
	}
}
