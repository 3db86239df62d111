package main

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"

	"kube-proxy/e2e/harness"
)

// dialect is what differs between the proxy modes in a daemon run: what the monitor waits for, how the
// end state is checked, and which data-plane targets there are.
type dialect interface {
	// cold is the cold start's predicate: every one of svcs is in the kernel with all its endpoints.
	cold(svcs []*service) func(View) bool
	// programmed counts the Services of svcs in the kernel with all their endpoints (for a capped cold
	// start).
	programmed(v View, svcs []*service) int
	// restored is the predicate of the changed Services back at their original endpoints.
	restored(svcs []*service) func(View) bool
	// landed is a change's predicate: s's rules now reach ips (endpoint ep was added or removed).
	landed(s *service, ips []string, ep string, added bool) func(View) bool
	// reload re-reads the rules of svcs from the kernel into the monitor's model (iptables: of one
	// Service its chain, of several the whole nat table).
	reload(mon *Monitor, svcs ...*service) error
	// verify checks the kernel's rules after the cold sync, untimed, saving them into dir (config mode),
	// and returns what it read and the length of the Services' dispatch (iptables: KUBE-SERVICES).
	verify(ns *harness.NetNS, dir, mode string, svcs []*service) (saved string, dispatch int, err error)
	// targets returns the data-plane targets, in order, with the nat rules each walks (nil: not counted).
	targets(ns *harness.NetNS, svcs []*service) ([]dpTarget, map[string]int, error)
	// bareInLoop reports whether the data plane also connects through a node with no rules, in the same
	// rounds as the targets (so that the host's load weighs on that floor as on them).
	bareInLoop() bool
}

// dpTarget is one data-plane target: its name, address, the chain whose cost is counted, and the
// client namespace connecting (set by dataPlane).
type dpTarget struct {
	name  string
	addr  netip.AddrPort
	chain string
	from  *harness.NetNS
}

func dialectOf(proxy string) dialect {
	if proxy == proxyNFTables {
		return nftDialect{}
	}
	return iptDialect{}
}

// iptDialect is mode iptables: KUBE-SVC chains jumping to KUBE-SEP chains, reached from KUBE-SERVICES.
type iptDialect struct{}

func (iptDialect) cold(svcs []*service) func(View) bool {
	chains := make([]string, len(svcs))
	for i, s := range svcs {
		chains[i] = s.Chain
	}
	return func(v View) bool {
		for i, c := range chains {
			if v.SEPs(c) != len(svcs[i].Endpoints) {
				return false
			}
		}
		return v.Reaches("PREROUTING", chains)
	}
}

func (iptDialect) programmed(v View, svcs []*service) int {
	n := 0
	for _, s := range svcs {
		if v.SEPs(s.Chain) == len(s.Endpoints) {
			n++
		}
	}
	return n
}

func (d iptDialect) restored(svcs []*service) func(View) bool {
	return func(v View) bool { return d.programmed(v, svcs) == len(svcs) }
}

func (iptDialect) landed(s *service, _ []string, ep string, added bool) func(View) bool {
	sep := sepChain(benchNS, s.Name, portName, ep)
	return func(v View) bool { return v.Jumps(s.Chain, sep) == added }
}

func (iptDialect) reload(mon *Monitor, svcs ...*service) error {
	if len(svcs) == 1 {
		return mon.Reload(svcs[0].Chain)
	}
	return mon.Reload("")
}

func (iptDialect) verify(ns *harness.NetNS, dir, mode string, svcs []*service) (string, int, error) {
	chains := make([]string, len(svcs))
	for i, s := range svcs {
		chains[i] = s.Chain
	}
	saved, costs, err := checkRules(ns, dir, mode, chains, svcs)
	if err != nil {
		return "", 0, err
	}
	return saved, costs["#KUBE-SERVICES"], nil
}

func (iptDialect) targets(ns *harness.NetNS, svcs []*service) ([]dpTarget, map[string]int, error) {
	costs, err := natCosts(ns)
	if err != nil {
		return nil, nil, err
	}
	first, last := svcs[0], svcs[len(svcs)-1]
	deepest := first
	for _, s := range svcs {
		if costs[s.Chain] >= costs[deepest.Chain] {
			deepest = s
		}
	}
	return []dpTarget{
		{name: dpFirst, addr: svcAddr(first), chain: first.Chain},
		{name: dpLast, addr: svcAddr(last), chain: last.Chain},
		{name: dpDeepest, addr: svcAddr(deepest), chain: deepest.Chain},
		{name: dpPod, addr: podAddr(), chain: "#KUBE-SERVICES"},
	}, costs, nil
}

func (iptDialect) bareInLoop() bool { return false }

// nftDialect is mode nftables: the service-ips verdict map sending each cluster IP to its Service's
// chain, whose DNAT rule reaches the endpoints.
type nftDialect struct{}

// nftReaches reports whether s's cluster IP reaches exactly eps (sorted "ip:port").
func nftReaches(v View, s *service, eps []string) bool {
	return slices.Equal(v.NFTReaches(netip.MustParseAddr(s.ClusterIP), svcPort), eps)
}

func (nftDialect) cold(svcs []*service) func(View) bool {
	return func(v View) bool {
		if v.NFTServiceIPs() < len(svcs) { // cheap, and false until the last chunk of a cold sync
			return false
		}
		for _, s := range svcs {
			if !nftReaches(v, s, s.Endpoints) {
				return false
			}
		}
		return true
	}
}

func (nftDialect) programmed(v View, svcs []*service) int {
	n := 0
	for _, s := range svcs {
		if nftReaches(v, s, s.Endpoints) {
			n++
		}
	}
	return n
}

func (d nftDialect) restored(svcs []*service) func(View) bool { return d.cold(svcs) }

func (nftDialect) landed(s *service, ips []string, _ string, _ bool) func(View) bool {
	eps := make([]string, len(ips))
	for i, ip := range ips {
		eps[i] = hostPort(ip, podPort)
	}
	slices.Sort(eps)
	return func(v View) bool { return nftReaches(v, s, eps) }
}

func (nftDialect) reload(mon *Monitor, svcs ...*service) error {
	chains := make([]string, len(svcs))
	for i, s := range svcs {
		chains[i] = s.NFTChain
	}
	return mon.ReloadNFT(chains...)
}

func (nftDialect) verify(ns *harness.NetNS, dir, mode string, svcs []*service) (string, int, error) {
	listing, err := nftList(ns)
	if err != nil {
		return "", 0, err
	}
	if mode == modeConfig {
		if err := writeGzip(filepath.Join(dir, "nft-list.txt.gz"), listing); err != nil {
			return "", 0, err
		}
	}
	l, err := parseNFTListing(listing)
	if err != nil {
		return "", 0, err
	}
	if err := l.check(svcs); err != nil {
		return "", 0, fmt.Errorf("after the cold sync: %w", err)
	}
	return listing, len(l.Dispatch), nil
}

func (nftDialect) targets(_ *harness.NetNS, svcs []*service) ([]dpTarget, map[string]int, error) {
	if len(svcs) == 0 {
		return nil, nil, errors.New("no Services")
	}
	return []dpTarget{
		{name: dpFirst, addr: svcAddr(svcs[0])},
		{name: dpLast, addr: svcAddr(svcs[len(svcs)-1])},
		{name: dpPod, addr: podAddr()},
	}, nil, nil
}

func (nftDialect) bareInLoop() bool { return true }

// svcAddr is a Service's cluster IP and port.
func svcAddr(s *service) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(s.ClusterIP), svcPort)
}

// podAddr is the first endpoint's pod IP and port, which no Service has as its address.
func podAddr() netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(origEndpoint(0)), podPort)
}

// check returns an error naming the first of svcs whose cluster IP the listing does not send to its
// chain, or whose chain does not reach exactly its endpoints.
func (l *nftListing) check(svcs []*service) error {
	for _, s := range svcs {
		key := s.ClusterIP + ":" + fmt.Sprint(svcPort)
		if c := l.Dispatch[key]; c != s.NFTChain {
			return fmt.Errorf("service-ips sends %s (Service %s) to %q, want %s", key, s.Name, c, s.NFTChain)
		}
		if got := l.Endpoints[s.NFTChain]; !slices.Equal(got, s.Endpoints) {
			return fmt.Errorf("%s of Service %s DNATs to %v, want %v", s.NFTChain, s.Name, got, s.Endpoints)
		}
	}
	return nil
}
