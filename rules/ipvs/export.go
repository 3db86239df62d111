package ipvs

import (
	"net/netip"
	"slices"

	"kube-proxy/proxy"
)

// Desired is what mode ipvs writes for a snapshot into an empty node: for `kube-proxy diff`, which
// compares it with the kernel. It is rendered by the renderers the dataplane uses.
type Desired struct {
	// Rules is the iptables-restore payload of the nat and filter tables (our chains); Jumps the payload
	// (for --noflush) of the jumps into them from the built-in chains.
	Rules, Jumps []byte
	// Sets are the ipsets, by name, with their type and members (as `ipset save` writes them), sorted.
	Sets []DesiredSet
	// VirtualServers are the IPVS virtual servers with their real servers, sorted by address, port and
	// protocol.
	VirtualServers []DesiredVirtualServer
	// Binds are the addresses on kube-ipvs0, sorted.
	Binds []netip.Addr
}

// DesiredSet is one ipset.
type DesiredSet struct {
	Name, Type string
	Members    []string
}

// DesiredVirtualServer is one virtual server: Key is "tcp/10.96.0.10:80" (ipvsadm's -t/-u/--sctp-service
// and address), Timeout the persistence in seconds (0: none).
type DesiredVirtualServer struct {
	Key       string
	Scheduler string
	Timeout   uint32
	// Flags are the scheduler flags (IP_VS_SVC_F_SCHED*), persistence excepted.
	Flags uint32
	// Reals are "ip:port" of the real servers, each of weight 1.
	Reals []string
}

// RenderDesired renders snap as the dataplane of cfg would for a node whose addresses (of every interface
// but kube-ipvs0) are addrs. It touches no kernel.
func RenderDesired(cfg Config, snap *proxy.Snapshot, addrs []netip.Addr) *Desired {
	en := newEnv(&cfg, &snap.Node, addrs)
	want := renderAll(&cfg, &en, snap)
	out := &Desired{
		Rules: renderRules(&cfg, &ruleInputs{nonEmpty: want.nonEmpty(), noNodeAccess: want.sortedNoNodeAccess(), node: &snap.Node}),
		Jumps: withJumps([]byte("*nat\nCOMMIT\n*filter\nCOMMIT\n"), jumpRules),
	}
	for id := setID(0); id < numSets; id++ {
		s := DesiredSet{Name: setName(id, cfg.Family), Type: setDefs[id].typ}
		for e := range want.sets[id] {
			s.Members = append(s.Members, e.String())
		}
		slices.Sort(s.Members)
		out.Sets = append(out.Sets, s)
	}
	keys := make([]vsKey, 0, len(want.claims))
	for k := range want.claims {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, vsKey.compare)
	for _, k := range keys {
		vs := want.vs(k)
		if vs == nil {
			continue
		}
		dv := DesiredVirtualServer{Key: k.String(), Scheduler: vs.scheduler, Flags: vs.flags &^ flagPersistent}
		if vs.flags&flagPersistent != 0 {
			dv.Timeout = vs.timeout
		}
		for _, r := range vs.reals {
			dv.Reals = append(dv.Reals, r.String())
		}
		out.VirtualServers = append(out.VirtualServers, dv)
	}
	for a := range want.binds {
		out.Binds = append(out.Binds, a)
	}
	slices.SortFunc(out.Binds, netip.Addr.Compare)
	return out
}
